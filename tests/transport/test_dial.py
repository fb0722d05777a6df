"""Connections dialled while paramiko loads (`dtrain.transport.dial`): on loopback only."""

from __future__ import annotations

import select
import socket
import threading
import time
from collections.abc import Iterator, Sequence
from concurrent.futures import Future

import pytest

from dtrain.transport.dial import Answer, Dialling, addresses_ahead
from dtrain.transport.options import DEFAULT_CONNECT_TIMEOUT_S

Settings = dict[str, tuple[str, ...]]
N1 = ("n1", None, None)


def answered(settings: Settings) -> Answer:
    answer: Answer = Future()
    answer.set_result(settings)
    return answer


def loopback(port: int, **more: str) -> Settings:
    found = {"hostname": "127.0.0.1", "port": str(port), "user": "bob", **more}
    return {k: (v,) for k, v in found.items()}


@pytest.fixture
def server() -> Iterator[socket.socket]:
    """A listening socket on loopback that accepts nothing by itself."""
    with socket.create_server(("127.0.0.1", 0), backlog=16) as sock:
        yield sock


def port_of(sock: socket.socket) -> int:
    port: int = sock.getsockname()[1]
    return port


def pending(server: socket.socket) -> bool:
    """Whether a connection waits to be accepted (without waiting for one)."""
    return bool(select.select([server], [], [], 0)[0])


def dials_ended() -> None:
    for thread in threading.enumerate():
        if thread.name == "dtrain-dial":
            thread.join(timeout=10)


def dialling(answers: Sequence[Answer], timeout_s: float | None = None) -> Dialling:
    """Dialling every one of hosts n1, n2... with these answers."""
    keys = [(f"n{i}", None, None) for i in range(1, len(answers) + 1)]
    return Dialling(list(zip(keys, answers, strict=True)), keys, timeout_s)


def to(hostname: str, port: int | str = 22, user: str = "bob", **more: str) -> Settings:
    found = {"hostname": hostname, "port": str(port), "user": user, **more}
    return {k: (v,) for k, v in found.items()}


@pytest.mark.parametrize(
    ("answers", "expected"),
    [
        ([to("198.18.0.11", 2222)], [("198.18.0.11", 2222)]),
        ([{}], [("n1", 22)]),  # no HostName, no Port: the name itself, port 22
        ([to("a", proxycommand="none", proxyjump="none")], [("a", 22)]),  # OpenSSH's "off"
        ([to("a"), to("b")], [("a", 22), ("b", 22)]),
        ([to("a"), to("a", user="carol")], [("a", 22), ("a", 22)]),  # two logins: two hosts
        # anything the transport stops at before connecting: nobody is dialled
        ([to("a"), None], []),  # `ssh -G` failed for n2
        ([to("a"), to("b", proxycommand="nc %h %p")], []),  # its chain is checked first
        ([to("a"), to("b", proxyjump="gate")], []),
        ([to("a"), to("b", pubkeyauthentication="no")], []),  # refused
        ([to("a"), to("b", port="ssh")], []),  # not a number
        ([to("a"), to("A")], []),  # one host listed twice (names are case-blind)
    ],
)
def test_hosts_are_dialled_ahead_only_when_nothing_can_stop_the_transport_first(
    answers: list[Settings | None], expected: list[tuple[str, int]]
) -> None:
    named = [(f"n{i}", settings) for i, settings in enumerate(answers, 1)]
    assert addresses_ahead(named) == expected


def test_the_transport_takes_the_connection_dialled_to_its_address_once(
    server: socket.socket,
) -> None:
    dials = dialling([answered(loopback(port_of(server)))])
    try:
        dialled = dials.take("127.0.0.1", port_of(server))
        assert dialled is not None
        sock = dialled.result(timeout=10)
        assert sock is not None
        with sock:
            accepted, peer = server.accept()
            with accepted:
                assert peer == sock.getsockname()  # the connection the server sees
                assert sock.getsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY)
                assert sock.gettimeout() == DEFAULT_CONNECT_TIMEOUT_S
        assert dials.take("127.0.0.1", port_of(server)) is None  # taken once
        assert dials.take("127.0.0.2", port_of(server)) is None  # nothing dialled there
        assert dials.taken == 1
    finally:
        dials.close()


def test_only_the_hosts_to_connect_are_dialled_once_every_answer_is_in(
    server: socket.socket,
) -> None:
    later: Answer = Future()
    ahead = answered(loopback(port_of(server)))
    dials = Dialling([(N1, ahead), (("n2", None, None), later)], [N1], 3.0)
    try:
        time.sleep(0.2)  # n1 is not dialled while n2's answer could still stop the launch
        assert not pending(server)
        later.set_result(loopback(port_of(server) + 1))  # n2: elsewhere, and not to be dialled
        dialled = dials.take("127.0.0.1", port_of(server))
        assert dialled is not None
        sock = dialled.result(timeout=10)
        assert sock is not None
        with sock:
            assert sock.gettimeout() == 3.0  # --connect-timeout wins
            assert pending(server)
        assert dials.take("127.0.0.1", port_of(server) + 1) is None
    finally:
        dials.close()


def test_a_refused_dial_is_the_error_the_transport_raises() -> None:
    with socket.socket() as closed:
        closed.bind(("127.0.0.1", 0))  # bound, not listening: a connection is refused
        dials = dialling([answered(loopback(port_of(closed)))])
        dialled = dials.take("127.0.0.1", port_of(closed))
        assert dialled is not None
        with pytest.raises(ConnectionRefusedError):
            dialled.result(timeout=10)
    dials.close()


def test_a_host_listed_twice_is_never_dialled(server: socket.socket) -> None:
    same = loopback(port_of(server))
    dials = dialling([answered(same), answered(same)])
    dials_ended()
    assert not pending(server)
    assert dials.take("127.0.0.1", port_of(server)) is None
    dials.close()


def test_connections_nobody_took_are_closed(server: socket.socket) -> None:
    dials = dialling([answered(loopback(port_of(server)))])
    dials_ended()
    accepted, _ = server.accept()
    with accepted:
        accepted.settimeout(10)
        dials.close()
        assert accepted.recv(1) == b""  # the dialled side closed it


def test_after_close_a_late_answer_dials_nothing(server: socket.socket) -> None:
    answer: Answer = Future()
    dials = dialling([answer])
    dials.close()
    answer.set_result(loopback(port_of(server)))
    dials_ended()
    assert not pending(server)
    assert dials.take("127.0.0.1", port_of(server)) is None
