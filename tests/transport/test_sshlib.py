"""The two ways dtrain runs paramiko's transport differently, and the paramiko they rest on.

The ACK hook overrides a private paramiko method: if paramiko renames it, changes its shape,
or stops dispatching global requests through it, these tests fail (and the transport falls
back to paramiko's own handling, which works, only slower). Loopback only.
"""

from __future__ import annotations

import inspect
import socket
import threading
import time
from collections.abc import Iterator

import paramiko
import pytest
from paramiko.common import AUTH_SUCCESSFUL, MSG_GLOBAL_REQUEST

from dtrain.transport import sshlib
from dtrain.transport.sshlib import GCM_FIRST, TunedTransport, preferred_ciphers


def test_paramiko_still_has_the_global_request_handler_the_ack_overrides() -> None:
    hook = getattr(paramiko.Transport, sshlib.ACK_HOOK, None)
    assert callable(hook), f"paramiko.Transport.{sshlib.ACK_HOOK} is gone: see sshlib.py"
    assert list(inspect.signature(hook).parameters) == ["self", "m"]
    assert sshlib.ACK_HOOK in vars(TunedTransport), "the ACK hook was not installed"


@pytest.fixture
def pair() -> Iterator[tuple[socket.socket, socket.socket]]:
    ours, theirs = socket.socketpair()
    yield ours, theirs
    ours.close()
    theirs.close()


def test_paramiko_dispatches_global_requests_to_the_tuned_handler(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    transport = TunedTransport(pair[0])
    try:
        handler = getattr(transport, "_handler_table")[MSG_GLOBAL_REQUEST]  # noqa: B009
        assert getattr(handler, "__func__", None) is vars(TunedTransport)[sshlib.ACK_HOOK]
    finally:
        transport.close()


def test_gcm_comes_first_and_every_cipher_paramiko_offers_stays(
    pair: tuple[socket.socket, socket.socket],
) -> None:
    offered = tuple(paramiko.Transport(pair[1]).get_security_options().ciphers)
    assert set(GCM_FIRST) <= set(offered), "this paramiko offers no AES-GCM: see sshlib.py"
    transport = TunedTransport(pair[0])
    try:
        ciphers = tuple(transport.get_security_options().ciphers)
    finally:
        transport.close()
    assert ciphers[:2] == GCM_FIRST
    assert sorted(ciphers) == sorted(offered)


def test_without_gcm_the_order_is_paramikos() -> None:
    assert preferred_ciphers(("aes128-ctr", "aes256-ctr")) == ("aes128-ctr", "aes256-ctr")
    assert preferred_ciphers(("aes128-ctr", "aes256-gcm@openssh.com")) == (
        "aes256-gcm@openssh.com",
        "aes128-ctr",
    )


class _Server(paramiko.ServerInterface):
    def check_auth_none(self, username: str) -> int:
        return AUTH_SUCCESSFUL

    def get_allowed_auths(self, username: str) -> str:
        return "none"


def test_a_global_request_after_auth_is_answered_through_the_hook(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """A real handshake on loopback; the server sends a global request after auth, as
    OpenSSH's `hostkeys-00`: the tuned handler sees it and paramiko still answers it."""
    seen: list[str] = []
    original = vars(TunedTransport)[sshlib.ACK_HOOK]

    def spy(self: TunedTransport, m: paramiko.Message) -> None:
        seen.append(m.get_string().decode())
        m.rewind()
        original(self, m)

    monkeypatch.setattr(TunedTransport, sshlib.ACK_HOOK, spy)
    ours, theirs = socket.socketpair()
    server = paramiko.Transport(theirs)
    server.add_server_key(paramiko.RSAKey.generate(1024))
    server.start_server(event=threading.Event(), server=_Server())
    client = TunedTransport(ours)
    try:
        client.start_client(timeout=30)
        client.auth_none("me")
        server.global_request("keepalive@openssh.com", wait=False)
        deadline = time.monotonic() + 30
        while not seen and time.monotonic() < deadline:
            time.sleep(0.01)
        assert seen == ["keepalive@openssh.com"]
    finally:
        client.close()
        server.close()
