"""paramiko as dtrain uses it: without `invoke` until a `Match exec` needs it, without
`importlib.metadata`; a cheaper buffer.

paramiko.config imports `invoke` (when installed) only to run `Match exec` commands; that import
is ~45 ms of every launch's critical path before the first connection. Here paramiko is imported
with `invoke` held back, and paramiko.config is given a stand-in that imports the real `invoke`
the first time a `Match exec` line is evaluated. paramiko's `__init__` also imports
`importlib.metadata` (~15-40 ms: the email package comes with it) only to read its own version;
while it imports, a stand-in answers that from the name of paramiko's `.dist-info` directory.
Import paramiko from here.
"""

from __future__ import annotations

import importlib
import os
import sys
import threading
import time
import types
from typing import Any


class LazyInvoke:
    """Stands for the `invoke` module in paramiko.config; imports it on first use."""

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module("invoke"), name)


def distribution_version(name: str) -> str:
    """A distribution's version from its `NAME-VERSION.dist-info` (or `.egg-info`) directory on
    sys.path, as importlib.metadata.version would find it; else from importlib.metadata itself."""
    prefix = name.lower().replace("-", "_") + "-"
    for entry in sys.path:
        try:
            names = os.listdir(entry or ".")
        except OSError:
            continue
        for found in names:
            stem, dot, kind = found.rpartition(".")
            if dot and kind in ("dist-info", "egg-info") and stem.lower().startswith(prefix):
                return stem[len(prefix) :].split("-")[0]
    version: str = real_metadata("version")(name)
    return version


def real_metadata(attribute: str) -> Any:
    """An attribute of the real importlib.metadata, imported now if it has to be: what the
    stand-in gives for anything but version() (a paramiko that asks for more still works)."""
    if sys.modules.get("importlib.metadata") is METADATA_STAND_IN:
        del sys.modules["importlib.metadata"]
    return getattr(importlib.import_module("importlib.metadata"), attribute)


METADATA_STAND_IN = types.ModuleType(
    "importlib.metadata", "answers version() while paramiko imports"
)
setattr(METADATA_STAND_IN, "version", distribution_version)  # noqa: B010 - a module's function
setattr(METADATA_STAND_IN, "__getattr__", real_metadata)  # noqa: B010 - PEP 562, as above
_HELD_BACK = "invoke" not in sys.modules
_METADATA_HELD_BACK = "importlib.metadata" not in sys.modules
if _HELD_BACK:
    sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` -> ImportError
if _METADATA_HELD_BACK:
    sys.modules["importlib.metadata"] = METADATA_STAND_IN
try:
    import paramiko as paramiko  # after holding back invoke and importlib.metadata
    import paramiko.buffered_pipe
    import paramiko.config
finally:
    if _HELD_BACK and "invoke" in sys.modules and sys.modules["invoke"] is None:
        del sys.modules["invoke"]
    if sys.modules.get("importlib.metadata") is METADATA_STAND_IN:
        del sys.modules["importlib.metadata"]
if getattr(paramiko.config, "invoke", 0) is None:
    setattr(paramiko.config, "invoke", LazyInvoke())  # noqa: B010 - not in paramiko's stubs


class ByteQueue(paramiko.buffered_pipe.BufferedPipe):  # type: ignore[type-arg]
    """paramiko's channel buffer, for the agent's stream: fewer copies, fewer wake-ups.

    Every byte of task output passes through it. paramiko's own buffer is an array('B') that
    copies data in, copies a slice out and again into bytes, moves the rest to the front, and
    wakes the reader for every 32 KB packet, so a 256 KB frame was read in pieces and joined.
    Here a bytearray takes data in with one copy and hands it out with one, and a read waits
    until it can return all it asked for (the reader asks for exactly one frame header or
    payload), up to FULL_READ_LIMIT, far inside the channel's window so the sender can always
    fill it; at end of stream or timeout it returns what there is.
    """

    FULL_READ_LIMIT = 256 << 10
    _lock: threading.Lock  # paramiko's, set by BufferedPipe.__init__
    _cv: threading.Condition
    _event: threading.Event | None
    _closed: bool

    def __init__(self) -> None:
        super().__init__()
        self._buffer = bytearray()
        self._want = 0

    def feed(self, data: bytes) -> None:
        with self._lock:
            if self._event is not None:
                self._event.set()
            self._buffer += data
            if len(self._buffer) >= self._want:
                self._cv.notify_all()

    def read(self, nbytes: int, timeout: float | None = None) -> bytes:
        want = max(1, min(nbytes, self.FULL_READ_LIMIT))
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while len(self._buffer) < want and not self._closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    if self._buffer:
                        break
                    raise paramiko.buffered_pipe.PipeTimeout()
                self._want = want
                self._cv.wait(left)
            self._want = 0
            with memoryview(self._buffer) as view, view[:nbytes] as part:
                out = bytes(part)
            del self._buffer[:nbytes]
            if not self._buffer and self._event is not None and not self._closed:
                self._event.clear()
            return out

    def _buffer_frombytes(self, data: bytes) -> None:
        self._buffer += data

    def _buffer_tobytes(self, limit: int | None = None) -> bytes:
        with memoryview(self._buffer) as view, view[:limit] as part:
            return bytes(part)
