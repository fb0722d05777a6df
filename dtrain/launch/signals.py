"""The launcher's own signals (SIGINT, SIGTERM, SIGHUP) as events on a queue, while a job runs
or waits to restart: a stop on purpose, handled where the job is, never an exception."""

from __future__ import annotations

import contextlib
import queue
import signal
from collections.abc import Iterator

from dtrain.agents.session import Event, Interrupt


@contextlib.contextmanager
def forward_signals(events: queue.SimpleQueue[Event | Interrupt]) -> Iterator[None]:
    """SIGINT/SIGTERM/SIGHUP become events the supervisor handles (stop everything)."""

    def handler(signum: int, frame: object) -> None:
        events.put(Interrupt(signum))  # SimpleQueue.put is safe in a signal handler

    previous = {}
    for signum in (signal.SIGINT, signal.SIGTERM, signal.SIGHUP):
        previous[signum] = signal.signal(signum, handler)
    try:
        yield
    finally:
        for signum, old in previous.items():
            signal.signal(signum, old)
