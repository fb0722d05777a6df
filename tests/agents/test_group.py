"""One request to every host: sent to all before any reply is awaited, each host bounded."""

from __future__ import annotations

import os
import queue
import threading
import time

from dtrain.agents.group import request_each
from dtrain.agents.session import AgentSession
from dtrain.errors import RemoteError
from dtrain.plan.hosts import Host, local_host
from dtrain.remote import proto
from dtrain.transport.local import LocalLink


class ScriptedLink:
    """An agent's link that answers each request after `delay_s` (None: never), or fails
    every send: the orderings a round must survive, which real agents on one machine do not
    give on demand."""

    def __init__(self, delay_s: float | None, fails: bool = False) -> None:
        self.delay_s = delay_s
        self.fails = fails
        self.sent_at: list[float] = []
        self._frames: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        self._pending = b""

    def send(self, data: bytes) -> None:
        if self.fails:
            raise OSError("broken pipe")
        self.sent_at.append(time.time())
        kind, _, _ = proto.HEADER.unpack(data[: proto.HEADER.size])
        if kind == proto.REQUEST and self.delay_s is not None:
            op = proto.decode_json(data[proto.HEADER.size :])[proto.OP]
            reply = proto.encode_json(proto.REPLY, {"ok": True, "answered": op})
            timer = threading.Timer(self.delay_s, self._frames.put, (reply,))
            timer.daemon = True
            timer.start()

    def recv(self, size: int) -> bytes:
        if not self._pending:
            self._pending = self._frames.get()
        out, self._pending = self._pending[:size], self._pending[size:]
        return out

    def stderr_text(self) -> str:
        return ""

    def close_input(self) -> None:
        pass

    def close(self) -> None:
        self._frames.put(b"")


def scripted(name: str, link: ScriptedLink) -> AgentSession:
    return AgentSession(Host(name=name), link, queue.SimpleQueue())


def test_every_host_is_asked_before_any_reply_is_awaited_and_the_wait_is_shared() -> None:
    """A slow host does not hold the others' requests back, and two silent hosts cost one
    timeout, not two; each reply keeps the time it arrived, not the time it was read."""
    links = {
        "slow": ScriptedLink(0.3),
        "silent1": ScriptedLink(None),
        "fast": ScriptedLink(0.0),
        "silent2": ScriptedLink(None),
        "broken": ScriptedLink(0.0, fails=True),
    }
    sessions = {name: scripted(name, link) for name, link in links.items()}
    try:
        started = time.monotonic()
        replies = request_each(sessions, "probe", 1.0)
        took = time.monotonic() - started
    finally:
        for session in sessions.values():
            session.close()
    assert list(replies) == list(sessions)  # in the sessions' order, whoever answered first
    assert replies["slow"] == {"ok": True, "answered": "probe"}
    assert replies["fast"] == {"ok": True, "answered": "probe"}
    for name in ("silent1", "silent2"):
        error = replies[name]
        assert isinstance(error, RemoteError) and "no answer to probe within 1s" in error.what
    broken = replies["broken"]
    assert isinstance(broken, RemoteError) and "could not send the probe request" in broken.what
    assert took < 1.8  # one shared second, where a wait per host would take two
    last_send = max(at for link in links.values() for at in link.sent_at)
    assert last_send < replies.times["slow"][1]  # every request out before the slow reply came
    assert replies.times["fast"][1] < replies.times["slow"][1]  # as they arrived


def test_real_agents_answer_a_round_each_with_its_own_reply() -> None:
    """Three agents on this machine, asked at once: each reply is its own (its pid), sent
    and answered times in order."""
    sessions = {
        f"here{k}": AgentSession(local_host(f"here{k}"), LocalLink(None), queue.SimpleQueue())
        for k in range(3)
    }
    try:
        round_ = request_each(sessions, proto.OP_HELLO, 30.0)
    finally:
        for session in sessions.values():
            session.close()
    replies = round_.raise_if_failed("hello")
    pids = {reply["pid"] for reply in replies.values()}
    assert len(pids) == 3 and os.getpid() not in pids
    assert all(sent <= answered for sent, answered in round_.times.values())
