"""paramiko as dtrain uses it: without `invoke` until a `Match exec` needs it, without
`importlib.metadata`; a cheaper buffer; its transport tuned (cipher, reads, ACKs).

paramiko.config imports `invoke` (when installed) only to run `Match exec` commands; that import
is ~45 ms of every launch's critical path before the first connection. Here paramiko is imported
with `invoke` held back, and paramiko.config is given a stand-in that imports the real `invoke`
the first time a `Match exec` line is evaluated. paramiko's `__init__` also imports
`importlib.metadata` (~15-40 ms: the email package comes with it) only to read its own version;
while it imports, a stand-in answers that from the name of paramiko's `.dist-info` directory.
Import paramiko from here.
"""

from __future__ import annotations

import collections
import contextlib
import importlib
import os
import socket
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
    wakes the reader for every 32 KB packet. Here each packet's bytes are queued as they are
    (paramiko's transport thread, which feeds them, copies nothing) and a read joins exactly
    what it asked for, one copy, or hands a packet over whole. A read waits until it can
    return all it asked for (the reader asks for exactly one frame header or payload), up to
    FULL_READ_LIMIT, far inside the channel's window so the sender can always fill it; at end
    of stream or timeout it returns what there is.
    """

    FULL_READ_LIMIT = 256 << 10
    _lock: threading.Lock  # paramiko's, set by BufferedPipe.__init__
    _cv: threading.Condition
    _event: threading.Event | None
    _closed: bool

    def __init__(self) -> None:
        super().__init__()
        self._chunks: collections.deque[bytes] = collections.deque()
        self._head = 0  # bytes of _chunks[0] already read
        self._size = 0  # bytes queued and not read
        self._want = 0

    def feed(self, data: bytes) -> None:
        with self._lock:
            if self._event is not None:
                self._event.set()
            if data:
                self._chunks.append(bytes(data))  # paramiko passes bytes: no copy
                self._size += len(data)
                if self._size >= self._want:
                    self._cv.notify_all()

    def read(self, nbytes: int, timeout: float | None = None) -> bytes:
        want = max(1, min(nbytes, self.FULL_READ_LIMIT))
        deadline = None if timeout is None else time.monotonic() + timeout
        with self._lock:
            while self._size < want and not self._closed:
                left = None if deadline is None else deadline - time.monotonic()
                if left is not None and left <= 0:
                    if self._size:
                        break
                    raise paramiko.buffered_pipe.PipeTimeout()
                self._want = want
                self._cv.wait(left)
            self._want = 0
            out = self._take(min(nbytes, self._size))
            if not self._size and self._event is not None and not self._closed:
                self._event.clear()
            return out

    def _take(self, size: int) -> bytes:
        """The next `size` bytes (queued, with the lock held)."""
        self._size -= size
        parts: list[bytes | memoryview] = []
        while size:
            chunk = self._chunks[0]
            end = min(len(chunk), self._head + size)
            if self._head == 0 and end == len(chunk):
                parts.append(chunk)
            else:
                parts.append(memoryview(chunk)[self._head : end])
            size -= end - self._head
            if end == len(chunk):
                self._chunks.popleft()
                self._head = 0
            else:
                self._head = end
        if len(parts) == 1 and isinstance(parts[0], bytes):
            return parts[0]
        return b"".join(parts)

    def read_ready(self) -> bool:
        with self._lock:
            return self._size > 0

    def empty(self) -> bytes:
        with self._lock:
            out = self._take(self._size)
            if self._event is not None and not self._closed:
                self._event.clear()
            return out

    def set_event(self, event: threading.Event) -> None:
        with self._lock:
            self._event = event
            if self._closed or self._size:
                event.set()
            else:
                event.clear()

    def __len__(self) -> int:
        with self._lock:
            return self._size


class ReadAhead:
    """The ssh socket as paramiko's packetizer reads it: one `recv` of up to 256 KB serves
    many of its reads. The packetizer asks for each packet twice (its first block, then the
    rest) and the socket's timeout makes every `recv` a poll and a read: 4 system calls,
    each a trip through the GIL, per 32 KB packet of task output, for every host."""

    SIZE = 256 << 10

    def __init__(self, sock: socket.socket) -> None:
        self.sock = sock
        self.buffer = b""
        self.offset = 0

    def recv(self, size: int) -> bytes:
        if self.offset >= len(self.buffer):
            data = self.sock.recv(max(size, self.SIZE))  # a timeout or error: as paramiko expects
            if len(data) <= size:
                return data
            self.buffer, self.offset = data, 0
        end = self.offset + size
        out = self.buffer[self.offset : end]
        self.offset = end
        return out

    def send(self, data: bytes) -> int:
        return self.sock.send(data)

    def close(self) -> None:
        self.sock.close()


class TunedTransport(paramiko.Transport):
    """paramiko's transport with AES-GCM preferred: one AEAD pass instead of AES-CTR plus a
    separate HMAC; measured here at 440 MB/s against 265 MB/s on one connection. Every other
    cipher stays available for servers without GCM (OpenSSH < 6.2)."""

    _preferred_ciphers = (
        "aes128-gcm@openssh.com",
        "aes256-gcm@openssh.com",
        *(
            c
            for c in paramiko.Transport._preferred_ciphers  # type: ignore[attr-defined]
            if "-gcm@" not in c
        ),
    )

    def __init__(self, sock: socket.socket, *args: Any, **kwargs: Any) -> None:
        super().__init__(sock, *args, **kwargs)
        if isinstance(self.sock, socket.socket):  # the packetizer reads through ReadAhead
            self.packetizer._Packetizer__socket = ReadAhead(self.sock)  # type: ignore[attr-defined]

    def _parse_global_request(self, m: paramiko.Message) -> None:
        """ACK the server's global requests at once (OpenSSH sends `hostkeys-00` right after
        auth, then holds its next reply, by Nagle, until that is ACKed: with Linux's delayed
        ACK the first channel took 43 ms instead of 2)."""
        super()._parse_global_request(m)  # type: ignore[misc]
        if isinstance(self.sock, socket.socket) and hasattr(socket, "TCP_QUICKACK"):
            with contextlib.suppress(OSError):
                self.sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_QUICKACK, 1)
