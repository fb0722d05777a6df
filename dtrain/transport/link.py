"""The byte stream to one agent, whatever carries it (a pipe, an ssh channel)."""

from __future__ import annotations

from typing import Protocol


class Link(Protocol):
    """A byte stream to one agent, whatever carries it."""

    def send(self, data: bytes) -> None: ...

    def recv(self, size: int) -> bytes:
        """Blocking read; b"" at end of stream."""
        ...

    def stderr_text(self) -> str:
        """What the agent (or the shell that started it) printed to stderr so far."""
        ...

    def close_input(self) -> None:
        """End of stream towards the agent: it stops every task and exits."""
        ...

    def close(self) -> None: ...
