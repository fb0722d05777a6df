"""The `dtrain` program as on a machine that is not Linux: `off_linux.py [--platform NAME] ARGS`.

In this process only (its children, the local agent among them, are left as they are): no
`os.sched_getaffinity`, no `select.epoll` nor its `EPOLL*` constants, and /proc unreadable to
everything but psutil (which reads each system its own way: sysctl on macOS). Each /proc access
that is refused is also said on stderr as `off-linux: refused CALL PATH`, so a caller that
shrugs the error off is still seen. `--platform NAME` also sets `sys.platform` once what reads it
at import (psutil, the process and file modules) is loaded.
"""

import builtins
import errno
import io
import os
import select
import sys
from collections.abc import Callable
from typing import Any

for name in ("sched_getaffinity", "sched_setaffinity"):
    if hasattr(os, name):
        delattr(os, name)
for name in [n for n in dir(select) if n.startswith(("epoll", "EPOLL"))]:
    delattr(select, name)

import runpy  # noqa: E402 - after epoll is gone: selectors picks its default at import
import shutil  # noqa: E402, F401 - reads sys.platform at import
import subprocess  # noqa: E402, F401 - likewise

import psutil  # noqa: E402

PSUTIL = os.path.dirname(psutil.__file__) + os.sep


def under_proc(path: Any) -> bool:
    if isinstance(path, int):
        return False
    name = os.path.abspath(os.fsdecode(path))
    return name == "/proc" or name.startswith("/proc/")


def refusing(real: Callable[..., Any], call: str) -> Callable[..., Any]:
    def guarded(*args: Any, **kwargs: Any) -> Any:
        path = args[0] if args else kwargs.get("file", kwargs.get("path", "."))
        if under_proc(path) and not sys._getframe(1).f_code.co_filename.startswith(PSUTIL):
            os.write(2, f"off-linux: refused {call} {os.fsdecode(path)}\n".encode())
            raise FileNotFoundError(errno.ENOENT, os.strerror(errno.ENOENT), os.fsdecode(path))
        return real(*args, **kwargs)

    return guarded


builtins.open = io.open = refusing(io.open, "open")
for call in ("open", "listdir", "scandir", "readlink", "stat", "lstat"):
    setattr(os, call, refusing(getattr(os, call), f"os.{call}"))

args = sys.argv[1:]
if args[:1] == ["--platform"]:
    sys.platform, args = args[1], args[2:]
sys.argv = ["dtrain", *args]
runpy.run_module("dtrain", run_name="__main__", alter_sys=True)
