"""The receiving end of `--sync-dst-dir`: compare a manifest with the host's copy, write files.

Files are compared by size and modification time (rsync's quick check), written to a
temporary name and renamed into place, so a task never sees half a file. Several hosts often
share the destination (an NFS home): every file and symlink is made under a name no other
host's agent can pick and renamed into place, which is atomic, so their copies never collide.
Standard library only, Python >= 3.6.
"""

import errno
import os
import stat


def _target(dst, rel):
    path = os.path.normpath(os.path.join(dst, rel))
    if path != dst and not path.startswith(dst.rstrip("/") + "/"):
        raise ValueError("%s leaves the destination directory" % rel)
    return path


def _private_name(path):
    """A sibling of `path` for this agent alone: the pid is not enough where hosts share the
    directory (each host's pids are its own)."""
    return "%s.dtrain-%d-%s.tmp" % (path, os.getpid(), os.urandom(4).hex())


def check_destination(dst):
    """Raise the OSError making `dst` would meet, creating nothing: the nearest part of it
    that exists must be a directory this user may write in. `dtrain doctor` asks the same."""
    path = os.path.abspath(dst)
    while True:
        try:
            found = os.stat(path)
            break
        except (FileNotFoundError, NotADirectoryError):
            if os.path.islink(path):
                raise FileExistsError(errno.EEXIST, os.strerror(errno.EEXIST), path) from None
            path = os.path.dirname(path)
    if not stat.S_ISDIR(found.st_mode):
        raise NotADirectoryError(errno.ENOTDIR, os.strerror(errno.ENOTDIR), path)
    if not os.access(path, os.W_OK | os.X_OK):
        code = errno.EROFS if _read_only(path) else errno.EACCES
        raise PermissionError(code, os.strerror(code), path)


def _read_only(path):
    try:
        return bool(os.statvfs(path).f_flag & os.ST_RDONLY)
    except OSError:
        return False


def describe(exc):
    """An OSError as `strerror: path` (the path that failed may be a parent of the one asked)."""
    what = getattr(exc, "strerror", None) or str(exc)
    where = getattr(exc, "filename", None)
    return "%s: %s" % (what, where) if where else what


def destination_problem(dst):
    """check_destination's verdict as one line, or None when the copy can go there."""
    try:
        check_destination(dst)
    except OSError as exc:
        return describe(exc)
    return None


def _place_symlink(target, path):
    if os.path.islink(path) and os.readlink(path) == target:
        return
    tmp = _private_name(path)
    os.symlink(target, tmp)
    try:
        os.replace(tmp, path)
    except OSError:
        os.unlink(tmp)
        raise


def plan(request):
    """Create directories and symlinks; return the indices of files that must be sent."""
    dst = os.path.abspath(request["dst"])
    check_destination(dst)
    os.makedirs(dst, exist_ok=True)
    for rel in request.get("dirs", []):
        os.makedirs(_target(dst, rel), exist_ok=True)
    for rel, target in request.get("links", []):
        _place_symlink(target, _target(dst, rel))
    need = []
    for index, (rel, size, mtime_ns, _mode) in enumerate(request.get("files", [])):
        try:
            st = os.lstat(_target(dst, rel))
        except FileNotFoundError:
            need.append(index)
            continue
        if st.st_size != size or st.st_mtime_ns != mtime_ns:
            need.append(index)
    return need


class Receiver:
    """Writes a stream of concatenated file contents into place, file by file."""

    def __init__(self, dst, files):
        self.dst = os.path.abspath(dst)
        self.files = list(files)
        self.index = 0
        self.remaining = 0  # the current file's unwritten bytes: set by _open_next
        self.handle = None
        self.tmp = None
        self.error = None
        self.written = 0
        self._open_next()

    @property
    def done(self):
        return self.index >= len(self.files)

    def _open_next(self):
        while not self.done:
            rel, size, _mtime, _mode = self.files[self.index]
            self.remaining = size
            if self.error is None:
                try:
                    path = _target(self.dst, rel)
                    self.tmp = _private_name(path)
                    self.handle = open(self.tmp, "wb")  # noqa: SIM115 - closed per file
                except (OSError, ValueError) as exc:
                    self._fail(rel, exc)
            if size > 0:
                return
            self._close_current()

    def _fail(self, rel, exc):
        if self.error is None:
            self.error = "cannot write %s: %s" % (
                os.path.join(self.dst, rel),
                getattr(exc, "strerror", None) or exc,
            )
        self.abort()

    def abort(self):
        """The stream will not be finished (the launcher went away, or stopped sending):
        remove the half-written file, so no temporary file stays behind."""
        if self.handle is not None:
            self.handle.close()
            self.handle = None
        if self.tmp is not None and os.path.exists(self.tmp):
            os.unlink(self.tmp)
        self.tmp = None

    def _close_current(self):
        rel, _size, mtime_ns, mode = self.files[self.index]
        tmp = self.tmp
        if self.handle is not None and tmp is not None:
            try:
                self.handle.close()
                self.handle = None
                path = _target(self.dst, rel)
                os.chmod(tmp, mode & 0o7777)
                os.utime(tmp, ns=(mtime_ns, mtime_ns))
                os.replace(tmp, path)
                self.written += 1
            except OSError as exc:
                self._fail(rel, exc)
        self.tmp = None
        self.index += 1

    def feed(self, data):
        view = memoryview(data)
        while view and not self.done:
            take = min(len(view), self.remaining)
            if self.handle is not None:
                try:
                    self.handle.write(view[:take])
                except OSError as exc:
                    self._fail(self.files[self.index][0], exc)
            view = view[take:]
            self.remaining -= take
            if self.remaining == 0:
                self._close_current()
                self._open_next()
