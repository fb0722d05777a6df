"""Which connect failures dtrain tries again: only what another try can change.

No network: each case is the exception a connection would raise, handed to `is_transient`.
"""

from __future__ import annotations

import errno
import socket

import paramiko
import pytest

from dtrain.plan.hosts import Host
from dtrain.transport.ssherrors import (
    CHANNEL_TIMEOUT,
    CHANNEL_UNEXPLAINED,
    HandshakeFailed,
    HopFailed,
    IncompatiblePeer,
    NoKeys,
    UnknownHostKey,
    is_transient,
)
from dtrain.transport.sshtarget import SshTarget


def refused() -> OSError:
    return ConnectionRefusedError(errno.ECONNREFUSED, "Connection refused")


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (refused(), False),
        (TimeoutError("timed out"), False),
        (socket.gaierror(-2, "Name or service not known"), False),
        (OSError(errno.EHOSTUNREACH, "No route to host"), False),
        (OSError(errno.ENETUNREACH, "Network is unreachable"), False),
        (paramiko.AuthenticationException("no"), False),
        (paramiko.BadAuthenticationType("no", ["password"]), False),
        (paramiko.PasswordRequiredException("passphrase"), False),
        (IncompatiblePeer("Incompatible version (1.5 instead of 2.0)"), False),
        (HandshakeFailed("no SSH banner within 10 s", is_ssh=False), False),
        (HandshakeFailed("closed", is_ssh=True, is_transient=True), True),
        (ConnectionResetError(errno.ECONNRESET, "reset"), True),
        (EOFError(), True),
        (paramiko.SSHException("Error reading SSH protocol banner"), True),
        (paramiko.ChannelException(2, "Connect failed"), True),
    ],
)
def test_only_what_can_change_is_tried_again(exc: BaseException, transient: bool) -> None:
    assert is_transient(exc) is transient


def hop_failed(cause: BaseException, *, is_forwarding: bool = False) -> HopFailed:
    target = SshTarget(hostname="198.18.0.11", port=22, user="root")
    return HopFailed(Host(name="h1"), target, cause, is_forwarding=is_forwarding)


@pytest.mark.parametrize(
    ("exc", "transient"),
    [
        (NoKeys(), False),
        (hop_failed(refused()), False),  # as the hop's own failure would be
        (hop_failed(EOFError()), True),
        (hop_failed(paramiko.ChannelException(2, "Connect failed"), is_forwarding=True), False),
        (hop_failed(paramiko.SSHException(CHANNEL_TIMEOUT), is_forwarding=True), False),
        # a refusal whose reason paramiko gave to another channel opened at once: asked again
        (hop_failed(paramiko.SSHException(CHANNEL_UNEXPLAINED), is_forwarding=True), True),
    ],
)
def test_a_failed_hop_is_tried_again_only_where_that_can_help(
    exc: BaseException, transient: bool
) -> None:
    assert is_transient(exc) is transient


def test_an_unknown_host_key_is_definite() -> None:
    key = paramiko.RSAKey.generate(1024)
    assert is_transient(UnknownHostKey("h", key)) is False
