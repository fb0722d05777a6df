"""The session's reader: frames come out whole and in order however the link splits the stream."""

from __future__ import annotations

import queue
import threading

from hypothesis import given, settings
from hypothesis import strategies as st

from dtrain.agents.session import AgentEvent, AgentSession, LinkClosed
from dtrain.plan.hosts import Host
from dtrain.remote import proto


class ChoppedLink:
    """A link whose reads return the agent's stream in the pieces given (then end of stream),
    as a pipe or an ssh channel may: a frame split anywhere, several frames in one read."""

    def __init__(self, stream: bytes, cuts: list[int]) -> None:
        self.flowing = threading.Event()  # set once the test has installed its handler
        self.pieces: queue.SimpleQueue[bytes] = queue.SimpleQueue()
        start = 0
        for cut in sorted(set(cuts)):
            if 0 < cut < len(stream):
                self.pieces.put(stream[start:cut])
                start = cut
        self.pieces.put(stream[start:])
        self.pieces.put(b"")

    def send(self, data: bytes) -> None:
        pass

    def recv(self, size: int) -> bytes:
        assert self.flowing.wait(10)
        return self.pieces.get(timeout=10)

    def stderr_text(self) -> str:
        return ""

    def close_input(self) -> None:
        pass

    def close(self) -> None:
        pass


FRAME = st.one_of(
    st.tuples(st.just(proto.STDOUT), st.integers(0, 3), st.binary(max_size=300)),
    st.tuples(st.just(proto.STDERR), st.integers(0, 3), st.binary(max_size=300)),
    st.tuples(st.just(proto.REPLY), st.just(0), st.just(b'{"ok":true}')),
    st.tuples(st.just(proto.EXITED), st.integers(0, 3), st.just(b'{"code":0}')),
    st.tuples(st.just(proto.PING), st.just(0), st.just(b"")),
)


@settings(max_examples=200, deadline=None)
@given(frames=st.lists(FRAME, max_size=30), cuts=st.lists(st.integers(0, 10_000), max_size=40))
def test_every_frame_arrives_whole_and_in_order_however_the_stream_is_cut(
    frames: list[tuple[int, int, bytes]], cuts: list[int]
) -> None:
    stream = b"".join(proto.encode(kind, payload, task) for kind, task, payload in frames)
    events: queue.SimpleQueue[object] = queue.SimpleQueue()
    written: list[tuple[int, int, bytes]] = []
    link = ChoppedLink(stream, cuts)
    session = AgentSession(Host(name="h1"), link, events)
    session.output = lambda task, kind, payload: written.append((kind, task, payload))
    link.flowing.set()
    assert session.wait_closed(10)
    seen = []
    while not isinstance(item := events.get(timeout=10), LinkClosed):
        assert isinstance(item, AgentEvent)
        seen.append((item.kind, item.task, item.payload))
    replies = []
    while (reply := session.replies.get(timeout=10)) is not None:
        replies.append(reply[0])
    output = [f for f in frames if f[0] in (proto.STDOUT, proto.STDERR)]
    assert written == output
    assert seen == [f for f in frames if f[0] == proto.EXITED]
    assert replies == [{"ok": True}] * sum(f[0] == proto.REPLY for f in frames)
