"""The user's cache folder for what dtrain keeps between runs on this machine (`ssh -G` answers,
compiled record methods): ~/.cache/dtrain, or under $XDG_CACHE_HOME. os-level only: the
program's start reads it before anything else is imported."""

from __future__ import annotations

import contextlib
import os
import threading


def folder(*parts: str) -> str | None:
    """~/.cache/dtrain[/parts], made private to this user; None when it cannot be, or belongs to
    someone else, or others may write it (what is read from it is trusted as this user's own)."""
    root = os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"), ".cache")
    path = os.path.join(root, "dtrain", *parts)
    try:
        os.makedirs(path, mode=0o700, exist_ok=True)
        info = os.lstat(path)
    except OSError:
        return None
    if os.path.islink(path) or info.st_uid != os.getuid() or info.st_mode & 0o022:
        return None
    return path


def read(path: str, max_bytes: int) -> bytes | None:
    """A file of this user's that nobody else may write (not through a symlink), whole; None
    when there is none or it is not such a file."""
    try:
        fd = os.open(path, os.O_RDONLY | os.O_NOFOLLOW)
    except OSError:
        return None
    try:
        info = os.fstat(fd)
        if info.st_uid != os.getuid() or info.st_mode & 0o022 or info.st_size > max_bytes:
            return None
        data = b""
        while len(data) <= max_bytes and (chunk := os.read(fd, max_bytes + 1 - len(data))):
            data += chunk
    except OSError:
        return None
    finally:
        os.close(fd)
    return data if len(data) <= max_bytes else None


def write(path: str, data: bytes) -> None:
    """Replace `path` with `data` at once (written aside, then renamed): a reader sees the old
    file or the new one, never a part; OSError if it cannot be written."""
    temporary = f"{path}.{os.getpid()}-{threading.get_ident()}.tmp"
    fd = os.open(temporary, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
    try:
        try:
            view = memoryview(data)
            while view:
                view = view[os.write(fd, view) :]
        finally:
            os.close(fd)
        os.replace(temporary, path)
    except OSError:
        with contextlib.suppress(OSError):
            os.unlink(temporary)
        raise
