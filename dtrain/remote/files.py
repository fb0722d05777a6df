"""The receiving end of `--sync-dst-dir`: compare a manifest with the host's copy, write files.

Files are compared by size and modification time (rsync's quick check), written to a
temporary name and renamed into place, so a task never sees half a file. Standard library
only, Python >= 3.6.
"""

import os


def _target(dst, rel):
    path = os.path.normpath(os.path.join(dst, rel))
    if path != dst and not path.startswith(dst.rstrip("/") + "/"):
        raise ValueError("%s leaves the destination directory" % rel)
    return path


def plan(request):
    """Create directories and symlinks; return the indices of files that must be sent."""
    dst = os.path.abspath(request["dst"])
    os.makedirs(dst, exist_ok=True)
    for rel in request.get("dirs", []):
        os.makedirs(_target(dst, rel), exist_ok=True)
    for rel, target in request.get("links", []):
        path = _target(dst, rel)
        if os.path.islink(path) and os.readlink(path) == target:
            continue
        if os.path.lexists(path):
            os.unlink(path)
        os.symlink(target, path)
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
                    self.tmp = "%s.dtrain-%d.tmp" % (path, os.getpid())
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
