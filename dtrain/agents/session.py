"""Talking to agents: requests and replies, heartbeats, and the stream of task events.

One `AgentSession` per host wraps a `Link` (a pipe to a local agent, or an ssh channel) and
turns its frames into replies and `AgentEvent`s on a shared queue the supervisor reads. Task
output, once a supervisor takes it (`AgentSession.output`), is handed over on the session's
own reader thread instead: hundreds of MB/s must not cross a second thread.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import threading
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import Any, Protocol, TypeVar

from dtrain.errors import RemoteError
from dtrain.plan.hosts import Host
from dtrain.remote import proto
from dtrain.transport.link import Link

logger = logging.getLogger(__name__)

READ_CHUNK = 1 << 20
OUTPUT_KINDS = (proto.STDOUT, proto.STDERR)

OutputHandler = Callable[[int, int, bytes], None]
"""(task id, STDOUT or STDERR, bytes): called on the session's reader thread."""


@dataclass(frozen=True)
class AgentEvent:
    """A frame from an agent about one task (started, output, exited, notice)."""

    session: AgentSession
    kind: int
    task: int
    payload: bytes

    def json(self) -> dict[str, Any]:
        result: dict[str, Any] = proto.decode_json(self.payload)
        return result


@dataclass(frozen=True)
class LinkClosed:
    """The agent's stream ended: it exited, crashed, or the connection dropped."""

    session: AgentSession


Event = AgentEvent | LinkClosed


class EventSink(Protocol):
    def put(self, item: Event, /) -> None: ...


class OutputBudget:
    """Bounds the task output read from agents but not yet written out, across all hosts.

    When the console or disk is slower than the tasks, readers stop reading, ssh flow control
    stops the agents, and the tasks block on their pipes: memory stays flat instead of
    buffering the whole flood.
    """

    def __init__(self, limit_bytes: int = 32 << 20) -> None:
        self.limit_bytes = limit_bytes
        self.pending = 0
        self._cond = threading.Condition()

    def take(self, size: int, still_alive: Callable[[], None]) -> None:
        with self._cond:
            self.pending += size
            while self.pending > self.limit_bytes:
                self._cond.wait(0.5)
                still_alive()  # we stopped reading; the host did not stop talking

    def give_back(self, size: int) -> None:
        with self._cond:
            self.pending -= size
            if self.pending <= self.limit_bytes:
                self._cond.notify_all()


class AgentSession:
    """The launcher's side of one agent."""

    def __init__(
        self,
        host: Host,
        link: Link,
        events: EventSink,
        budget: OutputBudget | None = None,
    ) -> None:
        self.host = host
        self.link = link
        self.events = events
        self.budget = budget
        # each reply with when it arrived (wall clock); None once the stream has ended
        self.replies: queue.Queue[tuple[dict[str, Any], float] | None] = queue.Queue()
        self.last_heard = time.monotonic()
        self.output: OutputHandler | None = None
        self.output_since: float | None = None  # when the handler running now was called
        self.is_closed = False
        self._send_lock = threading.Lock()
        self._reader = threading.Thread(
            target=self._read_loop, name=f"dtrain-agent-{host.name}", daemon=True
        )
        self._reader.start()

    def _read_loop(self) -> None:
        reader = proto.FrameReader()
        try:
            # One read takes whatever the link holds (many frames when output is backed up), so
            # the cost per read is shared by every frame in it.
            while chunk := self.link.recv(READ_CHUNK):
                self.last_heard = time.monotonic()
                for kind, task, payload in reader.feed(chunk):
                    self._on_frame(kind, task, payload)
        except (OSError, EOFError, proto.FrameError) as exc:
            logger.debug("stream from %s ended: %s", self.host.name, exc)
        finally:
            self.is_closed = True
            self.replies.put(None)
            self.events.put(LinkClosed(self))

    def _on_frame(self, kind: int, task: int, payload: bytes) -> None:
        if kind == proto.REPLY:
            self.replies.put((proto.decode_json(payload), time.time()))
        elif kind in OUTPUT_KINDS and (handler := self.output) is not None:
            # written out here: a slow console or disk holds this reader (and, through
            # ssh flow control, the agent and its tasks) back, not the supervisor
            self.output_since = time.monotonic()
            try:
                handler(task, kind, payload)
            finally:
                self.last_heard = time.monotonic()
                self.output_since = None
        elif kind != proto.PING:
            self.events.put(AgentEvent(self, kind, task, payload))
            if self.budget is not None and kind in OUTPUT_KINDS:
                self.budget.take(len(payload), self._mark_heard)

    def _mark_heard(self) -> None:
        self.last_heard = time.monotonic()

    def silent_for(self, now: float) -> float:
        """Seconds since the agent was last heard; 0 while its output is being written out
        (the launcher is the one not reading then, not the host that is not talking)."""
        return 0.0 if self.output_since is not None else now - self.last_heard

    def send(self, frame: bytes) -> bool:
        """Send a frame; False if the stream is already broken."""
        with self._send_lock:
            try:
                self.link.send(frame)
                return True
            except (OSError, EOFError) as exc:
                logger.debug("send to %s failed: %s", self.host.name, exc)
                return False

    def request(
        self, op: str, timeout_s: float, data: Iterable[bytes] = (), **fields: Any
    ) -> dict[str, Any]:
        """Send a request (and its bulk `data`, then an end mark) and wait for the reply.

        Errors become `RemoteError` naming the host.
        """
        self.send_request(op, data, **fields)
        return self.reply_to(op, timeout_s)[0]

    def send_request(self, op: str, data: Iterable[bytes] = (), **fields: Any) -> None:
        """Send a request (and its bulk `data`, then an end mark); `reply_to` waits for its
        reply. The agent answers requests in the order they came."""
        body = dict(fields, **{proto.OP: op})
        if not self.send(proto.encode_json(proto.REQUEST, body)):
            raise self.broken(f"could not send the {op} request")
        if data != ():
            for chunk in data:
                if not self.send(proto.encode(proto.DATA, chunk)):
                    raise self.broken(f"could not send the data of {op}")
            self.send(proto.encode(proto.DATA, b""))

    def reply_to(
        self, op: str, timeout_s: float, wait_s: float | None = None
    ) -> tuple[dict[str, Any], float]:
        """The reply to the oldest request not yet answered and when it arrived (wall clock),
        waiting up to `wait_s` (default `timeout_s`); `op` and `timeout_s` name that request in
        the error when none comes. Errors become `RemoteError` naming the host."""
        try:
            answer = self.replies.get(timeout=timeout_s if wait_s is None else wait_s)
        except queue.Empty:
            raise RemoteError(
                f"no answer to {op} within {timeout_s:.0f}s",
                host=self.host.display,
                hint=f"check the load and network of {self.host.display}; "
                f"`dtrain doctor` checks every host",
            ) from None
        if answer is None:
            raise self.broken(f"dtrain's agent exited during {op}")
        reply, arrived = answer
        if proto.ERROR in reply:
            raise RemoteError(
                reply[proto.ERROR], hint=reply.get(proto.HINT), host=self.host.display
            )
        return reply, arrived

    def broken(self, what: str) -> RemoteError:
        stderr = self.link.stderr_text().strip()
        detail = f": {stderr.splitlines()[-1]}" if stderr else ""
        hint = None
        if "no python3" in stderr or "not found" in stderr or "No such file" in stderr:
            hint = (
                f"dtrain's agent needs a python3 (>= 3.6, standard library only) on "
                f"{self.host.display}: install one, or name it with --remote-python PATH"
            )
        return RemoteError(f"{what}{detail}", hint=hint, host=self.host.display)

    def ping(self) -> None:
        self.send(proto.encode(proto.PING))

    def stop(self, grace_s: float) -> None:
        self.send(proto.encode_json(proto.STOP, {proto.STOP_GRACE_S: grace_s}))

    def kill(self) -> None:
        self.send(proto.encode(proto.KILL))

    def close(self) -> None:
        """Tell the agent we are done (it stops whatever still runs) and drop the link."""
        with contextlib.suppress(OSError):
            self.link.close_input()
        self.link.close()

    def wait_closed(self, timeout_s: float) -> bool:
        self._reader.join(timeout_s)
        return not self._reader.is_alive()


class Heartbeat:
    """One thread that pings every session, so agents know the launcher is alive."""

    def __init__(self, sessions: Iterable[AgentSession], interval_s: float) -> None:
        self.sessions = list(sessions)
        self.interval_s = interval_s
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, name="dtrain-heartbeat", daemon=True)

    def __enter__(self) -> Heartbeat:
        self._thread.start()
        return self

    def __exit__(self, *exc: object) -> None:
        self._stop.set()
        self._thread.join(2.0)

    def _run(self) -> None:
        while not self._stop.wait(self.interval_s):
            for session in self.sessions:
                if not session.is_closed:
                    session.ping()


T = TypeVar("T")


def in_parallel(
    items: Iterable[T], work: Callable[[T], None], timeout_s: float | None = None
) -> None:
    """work(item) for every item at once, one thread each; returns when all are done, or at
    the timeout (a host that hangs cannot hold dtrain up; its thread dies with the process)."""
    threads = [threading.Thread(target=work, args=(item,), daemon=True) for item in items]
    for thread in threads:
        thread.start()
    deadline = None if timeout_s is None else time.monotonic() + timeout_s
    for thread in threads:
        thread.join(None if deadline is None else max(0.0, deadline - time.monotonic()))


@dataclass(frozen=True)
class Interrupt:
    """A signal to dtrain itself, delivered through the event queue."""

    signum: int
