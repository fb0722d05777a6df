"""Frames exchanged between the launcher and an agent over one byte stream (a pipe or ssh channel).

A frame is `kind (1 byte) | task (2 bytes) | length (4 bytes) | payload`. Control frames carry
JSON; output frames carry a task's raw bytes. Standard library only, Python >= 3.6: this module
is sent to remote hosts with the agent.
"""

import json
import struct
from typing import Any, List, Tuple

HEADER = struct.Struct("!BHI")
MAX_PAYLOAD = 1 << 24

# launcher -> agent
REQUEST = 1  # JSON {"op": ...}
PING = 2  # heartbeat (both directions)
STOP = 3  # JSON {"grace_s": float}: TERM every task, KILL after the grace
KILL = 4  # KILL every task now
DATA = 5  # bulk bytes for the current request (e.g. a sync archive); empty payload ends it

# agent -> launcher
REPLY = 10  # JSON answer to a REQUEST: {"ok": true, ...} or {"error": "...", "hint": "..."}
STARTED = 11  # JSON {"pid", "pgid", "time"} for the task in the header
STDOUT = 12  # task output bytes
STDERR = 13
EXITED = 14  # JSON {"code", "signal", "stopped_by_agent", "reason", "time"}
NOTICE = 15  # JSON {"message"}: something the person at the launcher should know


def encode(kind: int, payload: bytes = b"", task: int = 0) -> bytes:
    return HEADER.pack(kind, task, len(payload)) + payload


def encode_json(kind: int, obj: Any, task: int = 0) -> bytes:
    return encode(kind, json.dumps(obj, separators=(",", ":")).encode("utf-8"), task)


def decode_json(payload: bytes) -> Any:
    return json.loads(payload.decode("utf-8"))


class FrameError(Exception):
    pass


class FrameReader:
    """Reassembles frames from arbitrarily split reads."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> "List[Tuple[int, int, bytes]]":
        """Add bytes; return the complete frames as (kind, task, payload) tuples."""
        self._buffer += data
        frames = []  # type: List[Tuple[int, int, bytes]]
        offset = 0
        size = len(self._buffer)
        while size - offset >= HEADER.size:
            kind, task, length = HEADER.unpack_from(self._buffer, offset)
            if length > MAX_PAYLOAD:
                raise FrameError("frame of %d bytes is larger than the limit" % length)
            end = offset + HEADER.size + length
            if end > size:
                break
            frames.append((kind, task, bytes(self._buffer[offset + HEADER.size : end])))
            offset = end
        if offset:
            del self._buffer[:offset]
        return frames
