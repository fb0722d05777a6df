"""Why an ssh connection failed, as exceptions, and what each means for the user.

The connect failures dtrain raises itself (an unknown host key, a handshake that came to
nothing, no key to offer, a failed ProxyJump hop); what a failed paramiko handshake or
ProxyCommand means; whether another try can help; and each failure as a `Problem` that says
what failed, where and what to do.
"""

from __future__ import annotations

import base64
import errno
import functools
import hashlib
import socket

import paramiko

from dtrain.errors import Problem
from dtrain.plan.hosts import Host
from dtrain.transport.options import SshOptions
from dtrain.transport.proxy import ProxySocket
from dtrain.transport.sshtarget import SshTarget

# a server that offers no protocol version or algorithm we share; the stubs lag paramiko
IncompatiblePeer: type[paramiko.SSHException] = paramiko.IncompatiblePeer  # type: ignore[attr-defined]
DEFINITE_ERRNOS = (errno.EHOSTUNREACH, errno.ENETUNREACH)
CHANNEL_TIMEOUT = "Timeout opening channel."  # paramiko's words for a forwarding that hangs
CHANNEL_UNEXPLAINED = "Unable to open channel."  # ... and for one refused, reason taken


def fingerprint(key: paramiko.PKey) -> str:
    """OpenSSH's SHA256 fingerprint, so users can compare it with `ssh-keygen -lf`."""
    digest = hashlib.sha256(key.asbytes()).digest()
    return "SHA256:" + base64.b64encode(digest).decode().rstrip("=")


def known_hosts_entry(hostname: str, port: int) -> str:
    return hostname if port == 22 else f"[{hostname}]:{port}"


class UnknownHostKey(Exception):
    def __init__(self, hostname: str, key: paramiko.PKey) -> None:
        super().__init__(hostname)
        self.hostname = hostname
        self.key = key


class HandshakeFailed(Exception):
    """The port answered, but no ssh session came of it; `is_transient` says whether another
    try can help (sshd drops connections beyond MaxStartups before its banner); `hint`, what
    to do when it is not the usual (an overloaded or refusing sshd)."""

    def __init__(
        self, reason: str, *, is_ssh: bool, is_transient: bool = False, hint: str | None = None
    ) -> None:
        super().__init__(reason)
        self.reason = reason
        self.is_ssh = is_ssh
        self.is_transient = is_transient
        self.hint = hint


class NoKeys(Exception):
    """Nothing to offer the server: no key file found and no agent to ask (paramiko's "No
    authentication methods available"); another try finds no more."""


class HopFailed(Exception):
    """A ProxyJump hop failed: connecting to `hop` itself (`cause` is that error), or, with
    `is_forwarding`, the hop's forwarding to the host behind it. The host behind the hop is
    not to blame, and the message names the hop."""

    def __init__(
        self, hop: Host, target: SshTarget, cause: BaseException, *, is_forwarding: bool = False
    ) -> None:
        super().__init__(str(cause))
        self.hop = hop
        self.target = target
        self.cause = cause
        self.is_forwarding = is_forwarding


def _quoted_first_line(first: bytes) -> str:
    line = first.split(b"\n", 1)[0].rstrip(b"\r")[:80]
    return '"' + line.decode("ascii", "backslashreplace").encode("unicode_escape").decode() + '"'


def handshake_failure(
    exc: Exception, first: bytes | None, timeout_s: float, banner: str, alive: bool
) -> HandshakeFailed | None:
    """What a failed paramiko handshake means, when it is about the banner, the protocol or
    the key exchange; `banner`: the server's SSH banner, when it sent one; `alive`: whether
    the connection was still up (paramiko says "No existing session" either way)."""
    text = str(exc)
    if isinstance(exc, IncompatiblePeer):
        return HandshakeFailed(f"incompatible ssh server: {text}", is_ssh=True)
    sent = None if first is None or first.startswith(b"SSH-") else _quoted_first_line(first)
    if text.startswith(("Indecipherable protocol version", "Invalid SSH banner")):
        return HandshakeFailed(f"it answered {sent or text}", is_ssh=False)
    if text.startswith("Error reading SSH protocol banner"):
        if sent is not None:
            return HandshakeFailed(f"it answered {sent} instead of an SSH banner", is_ssh=False)
        if isinstance(exc.__context__, TimeoutError):
            return HandshakeFailed(f"no SSH banner within {timeout_s:g} s", is_ssh=False)
        return HandshakeFailed(
            "the server closed the connection before its SSH banner",
            is_ssh=True,
            is_transient=True,
        )
    ran_out = text == "No existing session"  # the handshake's time ran out, or its connection
    if isinstance(exc, (EOFError, ConnectionError)) or (ran_out and not alive):
        said = f' after its banner "{banner}"' if banner else ""
        return HandshakeFailed(
            f"the server closed the connection during the ssh handshake{said}",
            is_ssh=True,
            is_transient=True,
        )
    if ran_out and not banner:
        return HandshakeFailed(f"no SSH banner within {timeout_s:g} s", is_ssh=False)
    if ran_out:
        return HandshakeFailed(
            f'no answer to the key exchange within {timeout_s:g} s after its banner "{banner}"',
            is_ssh=True,
            hint="the server took the connection, then went silent: check its load and its "
            "sshd log, and for a firewall that lets only a connection's first packets through",
        )
    return None


def proxy_failure(
    sock: ProxySocket, ended: int | None, exc: BaseException, target: SshTarget
) -> HandshakeFailed | None:
    """A failure through a ProxyCommand told as the command's: it ended (`ended`: its exit
    status), it wrote an error, or it passed on no banner. None: the server's own failure."""
    said = sock.stderr_text().splitlines()[-1:]
    hint = (
        f"run the ProxyCommand by hand (`{sock.command}`): it must carry the connection to "
        f"sshd on {target.hostname} port {target.port} over its stdin and stdout"
    )
    if isinstance(exc, (paramiko.AuthenticationException, *NO_LOGIN)):
        return None  # the server's answer, carried as it should be
    if ended is not None:
        end = f"exited with {ended}" if ended >= 0 else f"was killed by signal {-ended}"
        detail = f": {said[0]}" if said else " before the server's SSH banner"
        return HandshakeFailed(
            f"ProxyCommand `{sock.command}` {end}{detail}", is_ssh=True, hint=hint
        )
    if said:
        return HandshakeFailed(
            f"ProxyCommand `{sock.command}` said: {said[0]}", is_ssh=True, hint=hint
        )
    if isinstance(exc, HandshakeFailed) and not exc.is_ssh:
        reason = f"{exc.reason} through ProxyCommand `{sock.command}`"
        return HandshakeFailed(reason, is_ssh=True, hint=hint)
    return None


def is_transient(exc: BaseException) -> bool:
    """Whether another try can help: a definite answer (refused, no banner, not ssh, a key or
    login refused, no such name or route) stays the same, and a timed-out TCP connect already
    had the kernel's own SYN retries."""
    if isinstance(exc, HopFailed) and exc.is_forwarding:
        # paramiko keeps one refusal per connection: of two channels refused at once, one
        # learns why and the other only that it failed; asked again, it learns why too
        return str(exc.cause) == CHANNEL_UNEXPLAINED
    if isinstance(exc, HopFailed):
        return is_transient(exc.cause)
    if isinstance(exc, HandshakeFailed):
        return exc.is_transient
    definite = (
        NoKeys,
        UnknownHostKey,
        paramiko.BadHostKeyException,
        paramiko.AuthenticationException,
        IncompatiblePeer,
        socket.gaierror,
        ConnectionRefusedError,
        TimeoutError,
    )
    if isinstance(exc, definite):
        return False
    if isinstance(exc, OSError) and exc.errno in DEFINITE_ERRNOS:
        return False
    return isinstance(exc, (paramiko.SSHException, OSError, EOFError))


def describe_connect_error(
    host: Host, target: SshTarget, exc: BaseException, options: SshOptions
) -> Problem:
    """Turn whatever paramiko or the socket raised into a message that says what to do."""
    where = f"{host.name} ({target.display})" if target.hostname != host.name else target.display
    grouped = functools.partial(_grouped, where, host)

    if isinstance(exc, HopFailed):
        return _hop_problem(where, host, target, exc, options)
    if isinstance(exc, NoKeys):
        return _no_keys_problem(where, host, target)
    if isinstance(exc, HandshakeFailed) and not exc.is_ssh:
        return grouped(
            "not_ssh",
            f"not an ssh server: {exc.reason}",
            f"check the port: is {target.port} where sshd listens on {host.name}? "
            "(host:port in the hosts file, or Port in your ssh config)",
            "check the ports: are they where sshd listens on these hosts? "
            "(host:port in the hosts file, or Port in your ssh config)",
            message=f"{where} is not an ssh server: {exc.reason}",
        )
    if isinstance(exc, HandshakeFailed):
        return grouped(
            "handshake",
            exc.reason,
            exc.hint
            or f"sshd on {host.name} may be overloaded (MaxStartups) or refusing this "
            "client (sshd's log says why); --debug shows the ssh exchange",
            exc.hint
            or "sshd on these hosts may be overloaded (MaxStartups) or refusing this "
            "client (sshd's log says why); --debug shows the ssh exchange",
        )
    if isinstance(exc, NO_LOGIN):
        return _no_login_problem(where, host, target, exc)
    if isinstance(exc, paramiko.AuthenticationException):
        tried = ", ".join(target.identity_files) or "ssh-agent and ~/.ssh/id_*"
        return grouped(
            "auth_failed",
            f"the server refused our keys as user {target.user} (tried {tried})",
            f"add your public key to ~{target.user}/.ssh/authorized_keys on {host.name} "
            f"(ssh-copy-id -p {target.port} {target.user}@{target.hostname}); dtrain never "
            "asks for a password",
            f"add your public key to ~{target.user}/.ssh/authorized_keys on each of them "
            "(ssh-copy-id); dtrain never asks for a password",
        )
    if isinstance(exc, socket.gaierror):
        hint = "check the name in the hosts file, or give it a HostName in your ssh config"
        return grouped(
            "dns",
            f"cannot resolve host name: {exc.strerror}",
            hint,
            "check the names in the hosts file, or give them a HostName in your ssh config",
            message=f"{host.name}: cannot resolve host name {target.hostname}: {exc.strerror}",
        )
    if isinstance(exc, (TimeoutError, socket.timeout)):
        return grouped(
            "timeout",
            f"connection timed out after {target.connect_timeout_s:g}s",
            f"check that {host.name} is up and that port {target.port} is open",
            "check that these hosts are up and that their ssh port is open",
        )
    if isinstance(exc, ConnectionRefusedError):
        return grouped(
            "refused",
            "connection refused",
            f"is sshd running on {host.name} and listening on port {target.port}?",
            "is sshd running on these hosts and listening on the port shown?",
        )
    return grouped(
        "connect",
        f"{type(exc).__name__}: {exc}",
        f"--debug shows the ssh exchange; `ssh -p {target.port} {target.user}@"
        f"{target.hostname} true` shows what OpenSSH makes of {host.name}",
        "--debug shows the ssh exchange; `ssh HOST true` shows what OpenSSH makes of a host",
    )


def _hop_problem(
    where: str, host: Host, target: SshTarget, exc: HopFailed, options: SshOptions
) -> Problem:
    """A failed ProxyJump hop, named as the failure's place: every host behind it shares
    the one line and the hop's own hint."""
    hop = exc.hop.name
    hint: str | None
    if exc.is_forwarding:
        reason, hint = _forwarding_failure(hop, target, exc.cause)
        code = "jump_forwarding"
    else:
        problem = describe_connect_error(exc.hop, exc.target, exc.cause, options)
        reason, hint, code = f"via jump host {problem.message}", problem.hint, problem.code
    return _grouped(where, host, code, reason, hint, hint)


def _forwarding_failure(hop: str, target: SshTarget, cause: BaseException) -> tuple[str, str]:
    """(reason, hint) when jump host `hop` would not or could not connect on to `target`."""
    if isinstance(cause, paramiko.ChannelException) and cause.code == 1:
        return (
            f"jump host {hop} refuses to forward connections (administratively prohibited)",
            f"sshd on {hop} must allow forwarding (AllowTcpForwarding yes in its sshd_config), "
            "or reach the host another way (ProxyCommand)",
        )
    if isinstance(cause, paramiko.ChannelException):
        failed = f"jump host {hop} could not connect to {target.display} ({cause.text})"
    elif str(cause) == CHANNEL_TIMEOUT:
        failed = f"jump host {hop} got no connection to {target.display} within " + (
            f"{target.connect_timeout_s:g}s"
        )
    else:
        failed = f"jump host {hop} opened no connection to {target.display}"
    return failed, (
        f"check that {target.hostname} is up and that {hop} can reach its port {target.port} "
        f"(`ssh {hop} nc -zv {target.hostname} {target.port}`)"
    )


def _no_keys_problem(where: str, host: Host, target: SshTarget) -> Problem:
    """Nothing to log in with: which keys were looked for, and how to make one."""
    if target.identity_files:
        files = ", ".join(target.identity_files)
        looked = f"IdentityFile {files} not found"
    else:
        looked = "no ~/.ssh/id_* key"
    agent = target.use_agent and not target.identities_only
    looked += ", and ssh-agent has none" if agent else ", and ssh-agent is not asked"
    return Problem(
        f"{where}: no ssh key to log in with as {target.user} ({looked})",
        host=host.display,
        code="auth_no_key",
        hint=f"make a key (ssh-keygen -t ed25519) and install it on {host.name} "
        f"(ssh-copy-id -p {target.port} {target.user}@{target.hostname}), or name yours "
        "with IdentityFile in your ssh config",
    )


def _grouped(
    where: str,
    host: Host,
    code: str,
    reason: str,
    hint: str | None,
    group_hint: str | None,
    message: str = "",
) -> Problem:
    """A problem that prints as one line with every other host failing for `reason`."""
    return Problem(
        message or f"{where}: {reason}",
        host=host.display,
        hint=hint,
        code=code,
        reason=reason,
        subject=where,
        group_hint=group_hint,
    )


# Answers that mean this host will not let dtrain in as things are: each its own line.
NO_LOGIN = (
    UnknownHostKey,
    paramiko.BadHostKeyException,
    paramiko.PasswordRequiredException,
    paramiko.BadAuthenticationType,
)


def _no_login_problem(where: str, host: Host, target: SshTarget, exc: BaseException) -> Problem:
    """A host key that known_hosts lacks or that changed, a key with a passphrase, a server
    that wants a password: what to do differs for each, so none is grouped."""
    if isinstance(exc, paramiko.PasswordRequiredException):
        return Problem(
            f"{where}: the ssh key is protected by a passphrase and dtrain never prompts",
            host=host.display,
            code="auth_passphrase",
            hint="load the key into ssh-agent first (eval $(ssh-agent); ssh-add KEY)",
        )
    if isinstance(exc, paramiko.BadAuthenticationType):
        allowed = ", ".join(exc.allowed_types) or "none"
        return Problem(
            f"{where}: the server accepts only {allowed} logins as {target.user}; dtrain uses "
            "keys and never asks for a password",
            host=host.display,
            code="auth_password_only",
            hint=f"install your public key on {host.name}: ssh-copy-id -p {target.port} "
            f"{target.user}@{target.hostname}",
        )
    entry = known_hosts_entry(target.hostname, target.port)
    if isinstance(exc, UnknownHostKey):
        return Problem(
            f"{where}: unknown host key {exc.key.get_name()} {fingerprint(exc.key)} "
            f"(not in {target.known_hosts_files[0]})",
            host=host.display,
            code="host_key_unknown",
            hint=f"check the fingerprint, then rerun with --accept-new-host-keys to record it "
            f"(or: ssh-keyscan -p {target.port} {target.hostname} >> "
            f"{target.known_hosts_files[0]}); entry name: {entry}",
        )
    assert isinstance(exc, paramiko.BadHostKeyException)
    return Problem(
        f"{where}: HOST KEY CHANGED: it presents {exc.key.get_name()} "
        f"{fingerprint(exc.key)}, known_hosts has {fingerprint(exc.expected_key)}; "
        "this can be a man-in-the-middle attack, so dtrain will not connect",
        host=host.display,
        code="host_key_changed",
        hint=f"if the host was reinstalled, remove the old key: ssh-keygen -R '{entry}' "
        f"-f {target.known_hosts_files[0]}",
    )
