"""paramiko as dtrain uses it: without `invoke` until a `Match exec` needs it; a cheaper buffer.

paramiko.config imports `invoke` (when installed) only to run `Match exec` commands; that import
is ~45 ms of every launch's critical path before the first connection. Here paramiko is imported
with `invoke` held back, and paramiko.config is given a stand-in that imports the real `invoke`
the first time a `Match exec` line is evaluated. Import paramiko from here.
"""

from __future__ import annotations

import importlib
import sys
from typing import Any


class LazyInvoke:
    """Stands for the `invoke` module in paramiko.config; imports it on first use."""

    def __getattr__(self, name: str) -> Any:
        return getattr(importlib.import_module("invoke"), name)


_HELD_BACK = "invoke" not in sys.modules
if _HELD_BACK:
    sys.modules["invoke"] = None  # type: ignore[assignment]  # `import invoke` -> ImportError
try:
    import paramiko as paramiko  # after holding back invoke
    import paramiko.buffered_pipe
    import paramiko.config
finally:
    if _HELD_BACK and "invoke" in sys.modules and sys.modules["invoke"] is None:
        del sys.modules["invoke"]
if getattr(paramiko.config, "invoke", 0) is None:
    setattr(paramiko.config, "invoke", LazyInvoke())  # noqa: B010 - not in paramiko's stubs


class ByteQueue(paramiko.buffered_pipe.BufferedPipe):  # type: ignore[type-arg]
    """paramiko's channel buffer over a bytearray instead of an array('B').

    Every byte of task output passes through it: array('B') copies it in, copies a slice out
    and copies it again into bytes, then moves what is left to the front; a bytearray takes it
    in with one copy, hands it out with one, and drops a prefix without moving the rest.
    """

    def __init__(self) -> None:
        super().__init__()
        self._buffer = bytearray()

    def _buffer_frombytes(self, data: bytes) -> None:
        self._buffer += data

    def _buffer_tobytes(self, limit: int | None = None) -> bytes:
        with memoryview(self._buffer) as view, view[:limit] as part:
            return bytes(part)
