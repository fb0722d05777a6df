"""The ssh transport: one paramiko connection per host, checked like OpenSSH.

What to connect to comes from `sshtarget` (OpenSSH's own answer, `ssh -G`); what a failure
means, from `ssherrors`. Host keys are checked against known_hosts; an unknown key fails (or is
recorded with accept-new), a changed key fails (but for StrictHostKeyChecking no, as OpenSSH).
Nothing ever prompts. paramiko is imported only when a job has remote hosts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from pathlib import Path

import paramiko

from dtrain.errors import Problem, RemoteError, UsageError
from dtrain.plan.hosts import Host, check_same_targets
from dtrain.transport import sshconfig
from dtrain.transport.bootstrap import agent_payload, remote_command
from dtrain.transport.options import DEFAULT_CONNECT_TIMEOUT_S, SshOptions
from dtrain.transport.proxy import ProxySocket
from dtrain.transport.ssherrors import (
    HandshakeFailed,
    HopFailed,
    NoKeys,
    UnknownHostKey,
    describe_connect_error,
    fingerprint,
    handshake_failure,
    is_transient,
    proxy_failure,
)
from dtrain.transport.sshlib import TunedTransport
from dtrain.transport.sshtarget import (
    SshTarget,
    config_name,
    hop_host,
    jump_hops,
    openssh_target,
    refuse_unhonoured,
    refuse_unreadable_files,
    split_jump_hop,
)

logger = logging.getLogger(__name__)

MAX_JUMP_DEPTH = 8
MAX_PARALLEL_CONNECTS = 32  # handshakes at once
FIRST_BYTES = 256  # enough of what a port sends first to quote it when it is not ssh


class _SocketAgent(paramiko.Agent):
    """The ssh-agent listening at an IdentityAgent path (paramiko's own Agent knows only
    SSH_AUTH_SOCK). Like OpenSSH, an agent that is not there is skipped, not an error."""

    def __init__(self, path: str) -> None:
        paramiko.agent.AgentSSH.__init__(self)
        conn = socket.socket(socket.AF_UNIX, socket.SOCK_STREAM)
        try:
            conn.connect(path)
        except OSError as exc:
            conn.close()
            logger.debug("IdentityAgent %s: %s; going on without it", path, exc)
            return
        self._connect(conn)  # type: ignore[attr-defined]  # not in paramiko's stubs


def _await_first_bytes(sock: socket.socket, timeout_s: float) -> bytes:
    """The server's first bytes, left unread for paramiko.

    A silent port then fails in one clear line at the deadline (paramiko would wait as long,
    then only say "Error reading SSH protocol banner"), and bytes that are not an SSH banner
    can be quoted if the handshake fails.
    """
    sock.settimeout(timeout_s)
    try:
        first = sock.recv(FIRST_BYTES, socket.MSG_PEEK)
    except TimeoutError:
        raise HandshakeFailed(f"no SSH banner within {timeout_s:g} s", is_ssh=False) from None
    if not first:
        raise HandshakeFailed(
            "the server closed the connection before its SSH banner", is_ssh=True, is_transient=True
        )
    return first


class _HostKeyPolicy(paramiko.MissingHostKeyPolicy):
    """Unknown keys fail, or with accept-new are recorded; changed keys fail (paramiko checks
    them before asking here). With `trusting` (StrictHostKeyChecking no) the client knows no
    key, so every key comes here: as OpenSSH does, a changed one is let through with a
    warning, an unknown one recorded."""

    _record_lock = threading.Lock()

    def __init__(
        self, accept_new: bool, record_file: str, trusting: paramiko.HostKeys | None = None
    ) -> None:
        self.accept_new = accept_new
        self.record_file = record_file
        self.trusting = trusting

    def missing_host_key(
        self, client: paramiko.SSHClient, hostname: str, key: paramiko.PKey
    ) -> None:
        known = self.trusting.lookup(hostname) if self.trusting is not None else None
        if known is not None and key.get_name() in known:
            if known[key.get_name()] != key:
                logger.warning(
                    "HOST KEY CHANGED for %s: it presents %s %s; connecting anyway, because "
                    "its ssh config says StrictHostKeyChecking no",
                    hostname,
                    key.get_name(),
                    fingerprint(key),
                )
            return
        if not self.accept_new:
            raise UnknownHostKey(hostname, key)
        client.get_host_keys().add(hostname, key.get_name(), key)
        with self._record_lock:
            Path(self.record_file).parent.mkdir(mode=0o700, parents=True, exist_ok=True)
            with open(self.record_file, "a") as out:
                out.write(f"{hostname} {key.get_name()} {key.get_base64()}\n")
        logger.info("recorded the host key of %s in %s", hostname, self.record_file)


def _certified_key(identities: Sequence[str], certificates: Sequence[str]) -> paramiko.PKey | None:
    """The first identity that one of the CertificateFiles certifies, with its certificate
    loaded (paramiko itself only finds `KEY-cert.pub` next to the key)."""
    for cert in certificates:
        if not os.path.exists(cert):
            continue
        for path in identities:
            try:
                key = paramiko.PKey.from_path(path)
                key.load_certificate(cert)
            except (ValueError, paramiko.SSHException, OSError):
                continue
            return key
    return None


class SshTransport:
    """One authenticated connection per host, opened in parallel, reused for every channel."""

    def __init__(self, options: SshOptions) -> None:
        self.options = options
        self.openssh = sshconfig.openssh_client()  # every host's settings: `ssh -G`
        self._settings: dict[tuple[str, str | None, int | None], sshconfig.Settings] = {}
        self._local = sshconfig.Local.here()
        self.clients: dict[str, paramiko.SSHClient] = {}  # by Host.key: name and port
        self.connect_times_s: dict[str, float] = {}
        # One connection per ProxyJump spec, shared by every host behind it: a Future while
        # the first host that needs it connects, so the others wait for it instead of each
        # opening (and leaking) their own.
        self._jumps: dict[str, Future[paramiko.SSHClient]] = {}
        self._spare_jumps: list[paramiko.SSHClient] = []  # nested hops that could not wait
        self._jump_depth = threading.local()
        self._lock = threading.Lock()
        # what connections under way run over, to stop them at once (`abort`)
        self._opened: list[socket.socket | ProxySocket] = []
        self.is_aborted = False

    def target(self, host: Host, proxy_jump: str | None = None) -> SshTarget:
        """`host`'s settings, with every file they name that paramiko would read checked."""
        target = self._resolve(host, proxy_jump)
        refuse_unreadable_files(host, target)
        return target

    def _resolve(self, host: Host, proxy_jump: str | None) -> SshTarget:
        self.prefetch([host])
        settings = self._settings[(host.name, host.user, host.port)]
        refuse_unhonoured(host, settings, self.options, self.openssh)
        target = openssh_target(host, settings, self.options, self._local)
        if proxy_jump:  # a hop of `ProxyJump a,b`: through the hops before it
            return dataclasses.replace(target, proxy_jump=proxy_jump, proxy_command=None)
        if proxy_jump == "":  # asked for the hop's own settings only
            return target
        if target.proxy_jump and not target.proxy_command:
            self._check_jump_loop(host, target)
        return target

    def _check_jump_loop(self, host: Host, target: SshTarget) -> None:
        """The ProxyJump chain as OpenSSH resolves each hop; a host and port met twice is a
        loop: an error naming the whole chain, before any connection (OpenSSH would start ssh
        inside ssh until it runs out of processes)."""
        chain, seen = [host.name], [(host.name, target.port)]
        via, jump = host.name, target.proxy_jump
        while jump:
            hops = jump_hops(jump, via, self.options)
            for user, name, port in reversed(hops):
                hop = self.target(hop_host(user, name, port), proxy_jump="")
                if (name, hop.port) in seen:
                    path = " -> ".join([*chain, name])
                    raise UsageError(
                        f"ssh config {config_name(self.options)}: ProxyJump loops: {path} "
                        "(each reached through the next)",
                        hint=f"give {name} a way in that does not pass through itself: "
                        f"ProxyJump none in a Host {name} block above the others",
                    )
                chain.append(name)
                seen.append((name, hop.port))
            user, via, port = hops[0]
            via_host = hop_host(user, via, port)
            first = self.target(via_host, proxy_jump="")
            settings = self._settings[(via_host.name, via_host.user, via_host.port)]
            jump = None if first.proxy_command else sshconfig.one(settings, "proxyjump", "none")
            jump = None if jump == "none" else jump

    def prefetch(self, hosts: Sequence[Host]) -> None:
        """`ssh -G` for every host not yet resolved, in parallel: once per host per run."""
        keys = list(dict.fromkeys((h.name, h.user, h.port) for h in hosts))
        started = time.monotonic()
        missing = [key for key in keys if key not in self._settings]
        if not missing:
            return
        found = sshconfig.resolve_all(self.openssh, missing, self.options.config_file)
        with self._lock:
            self._settings.update(zip(missing, found, strict=True))
        logger.debug("ssh -G for %d hosts: %.3fs", len(missing), time.monotonic() - started)

    def distinct_targets(self, hosts: Sequence[Host]) -> list[SshTarget]:
        """Each host's target; a `HostsFileError` if two lines reach one (hostname, port, user)."""
        self.prefetch(hosts)
        targets = [self.target(host) for host in hosts]
        check_same_targets(hosts, [(t.hostname, t.port, t.user) for t in targets])
        return targets

    def try_connect_all(
        self, hosts: Sequence[Host], then: Callable[[Host], Problem | None] | None = None
    ) -> dict[str, Problem]:
        """Connect every host that can be reached; return the problems of the others.

        `then(host)` runs as soon as that host is connected, in the same bounded pool, so a
        host's next step (starting its agent) never waits for the slowest connection.
        """

        def one(host: Host, target: SshTarget) -> Problem | None:
            problem = self._connect_one(host, target)
            if problem is None and then is not None and not self.is_aborted:
                problem = then(host)
            return problem

        # a bad ssh config setting, or one host listed twice, stops everything before any connection
        targets = self.distinct_targets(hosts)
        problems: dict[str, Problem] = {}
        width = max(1, min(MAX_PARALLEL_CONNECTS, len(hosts)))
        pool = ThreadPoolExecutor(max_workers=width, thread_name_prefix="dtrain-connect")
        try:
            outcomes = list(pool.map(one, hosts, targets))
        except BaseException:  # Ctrl-C or SIGTERM while connecting: stop now, not at a timeout
            self.abort()
            pool.shutdown(wait=False, cancel_futures=True)
            raise
        pool.shutdown()
        for host, problem in zip(hosts, outcomes, strict=True):
            if problem is not None:
                problems[host.key] = problem
        return problems

    def abort(self) -> None:
        """Stop every connection under way at once (Ctrl-C while connecting): shut down each
        socket and end each ProxyCommand (and what it started), so no thread waits out a
        timeout and nothing outlives dtrain; no connection starts after this."""
        with self._lock:
            self.is_aborted = True
            opened, self._opened = self._opened, []
        for sock in opened:
            if isinstance(sock, ProxySocket):
                sock.end()
            else:
                with contextlib.suppress(OSError):  # closed meanwhile
                    sock.shutdown(socket.SHUT_RDWR)

    def _track(self, sock: socket.socket | paramiko.Channel | ProxySocket) -> None:
        """Note a connection's socket for `abort`; after it, end the socket at once."""
        if isinstance(sock, paramiko.Channel):  # it runs over its jump host's socket
            return
        with self._lock:
            if not self.is_aborted:
                self._opened.append(sock)
                return
        sock.close()
        raise ConnectionAbortedError("dtrain stopped connecting")

    def _connect_one(self, host: Host, target: SshTarget) -> Problem | None:
        started = time.monotonic()
        last: Problem | None = None
        for attempt in range(2):
            try:
                client = self._connect(target)
            except Exception as exc:  # every failure becomes a message naming the host
                last = describe_connect_error(host, target, exc, self.options)
                if not is_transient(exc) or attempt == 1 or self.is_aborted:
                    return last
                time.sleep(0.2)
                continue
            with self._lock:
                self.clients[host.key] = client
                self.connect_times_s[host.key] = time.monotonic() - started
            return None
        return last

    def _open_socket(self, target: SshTarget) -> socket.socket | paramiko.Channel | ProxySocket:
        if target.proxy_command:  # OpenSSH: ProxyCommand wins over ProxyJump
            return ProxySocket(target.proxy_command)
        if target.proxy_jump:
            jump = self._jump_client(target.proxy_jump)
            transport = jump.get_transport()
            assert transport is not None
            try:
                return transport.open_channel(
                    "direct-tcpip",
                    (target.hostname, target.port),
                    ("127.0.0.1", 0),
                    timeout=target.connect_timeout_s,
                )
            except paramiko.SSHException as exc:  # the hop could not or would not forward
                user, name, port = split_jump_hop(target.proxy_jump.split(",")[-1])
                hop = hop_host(user, name, port)
                raise HopFailed(hop, target, exc, is_forwarding=True) from exc
        sock = socket.create_connection(
            (target.hostname, target.port),
            timeout=target.connect_timeout_s,
        )
        # paramiko sets no socket options: Nagle + delayed ACK cost ~40 ms per round trip.
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        return sock

    def _jump_client(self, spec: str) -> paramiko.SSHClient:
        """The one connection to a ProxyJump host, opened by the first host that needs it.

        A failure is handed to the hosts waiting for that attempt and forgotten, so a retry
        connects afresh. A hop reached through another hop never waits (a ProxyJump cycle
        across threads would deadlock): unless that connection is ready, it opens its own.
        """
        with self._lock:
            pending = self._jumps.get(spec)
            is_first = pending is None
            if pending is None:
                pending = self._jumps[spec] = Future()
        if not is_first:
            if pending.done() or not getattr(self._jump_depth, "value", 0):
                return pending.result()
            client = self._connect_jump(spec)
            with self._lock:
                self._spare_jumps.append(client)
            return client
        try:
            client = self._connect_jump(spec)
        except BaseException as exc:
            with self._lock:
                del self._jumps[spec]
            pending.set_exception(exc)
            raise
        pending.set_result(client)
        return client

    def _connect_jump(self, spec: str) -> paramiko.SSHClient:
        """The last hop of `spec`, reached through the hops before it (as `ssh -J a,b`)."""
        *before, last = spec.split(",")
        user, name, port = split_jump_hop(last)
        jump_host = hop_host(user, name, port)
        depth = getattr(self._jump_depth, "value", 0)
        if depth >= MAX_JUMP_DEPTH:
            raise UsageError(
                f"ssh config {config_name(self.options)}: ProxyJump goes through more than "
                f"{MAX_JUMP_DEPTH} hops to reach {name} (a loop?)",
                hint=f"`ssh -G {name}` shows its ProxyJump; end the chain with ProxyJump none",
            )
        target = self.target(jump_host, proxy_jump=",".join(before) or None)
        self._jump_depth.value = depth + 1
        try:
            return self._connect(target)
        except HopFailed:  # a hop before this one: it is the one to name
            raise
        except Exception as exc:
            raise HopFailed(jump_host, target, exc) from exc
        finally:
            self._jump_depth.value = depth

    def _connect(self, target: SshTarget) -> paramiko.SSHClient:
        client = paramiko.SSHClient()
        no_check = target.strict_host_keys == "no"
        trusting = (
            paramiko.HostKeys() if no_check and not self.options.accept_new_host_keys else None
        )
        for path in target.known_hosts_files:
            if os.path.exists(path):
                if trusting is not None:
                    trusting.load(path)  # the policy compares; the client checks nothing
                else:
                    client.load_system_host_keys(path)
        accept_new = self.options.accept_new_host_keys or target.strict_host_keys == "accept-new"
        policy = _HostKeyPolicy(accept_new or no_check, target.known_hosts_files[0], trusting)
        client.set_missing_host_key_policy(policy)
        sock = self._open_socket(target)
        self._track(sock)
        try:
            first = None
            if isinstance(sock, socket.socket):
                first = _await_first_bytes(sock, target.connect_timeout_s)
            self._handshake(client, sock, target, first)
        except BaseException as exc:
            client.close()
            sock.close()
            if isinstance(sock, ProxySocket):
                failure = proxy_failure(sock, sock.own_exit_status(), exc, target)
                if failure is not None:
                    raise failure from exc
            raise
        transport = client.get_transport()
        if target.server_alive_s and transport is not None:
            transport.set_keepalive(int(target.server_alive_s))
        return client

    def _handshake(
        self,
        client: paramiko.SSHClient,
        sock: socket.socket | paramiko.Channel | ProxySocket,
        target: SshTarget,
        first: bytes | None,
    ) -> None:
        identities = [p for p in target.identity_files if os.path.exists(p)]
        allow_agent = target.use_agent and not target.identities_only
        if allow_agent and target.agent_socket is not None:
            # connect() asks `_agent` for keys (Agent() otherwise); not in paramiko's stubs
            client._agent = _SocketAgent(target.agent_socket)  # type: ignore[attr-defined]
        # HostKeyAlias: OpenSSH looks the host key up under the alias, without a port
        try:
            client.connect(
                hostname=target.host_key_alias or target.hostname,
                port=22 if target.host_key_alias else target.port,
                pkey=_certified_key(identities, target.certificate_files),
                username=target.user,
                sock=sock,  # type: ignore[arg-type]  # a ProxySocket is socket-like
                timeout=target.connect_timeout_s,
                banner_timeout=target.connect_timeout_s,
                auth_timeout=target.connect_timeout_s,
                key_filename=identities or None,  # type: ignore[arg-type]
                look_for_keys=not target.identity_files,
                allow_agent=allow_agent,
                passphrase=None,
                transport_factory=TunedTransport,
            )
        except (paramiko.SSHException, EOFError, ConnectionError) as exc:
            if str(exc) == "No authentication methods available":
                raise NoKeys() from exc
            transport = client.get_transport()
            banner = transport.remote_version if transport is not None else ""
            alive = transport is not None and transport.is_active()
            failure = handshake_failure(exc, first, target.connect_timeout_s, banner, alive)
            if failure is None:
                raise
            raise failure from exc

    def open_link(self, host: Host, python: str) -> SshLink:
        """The agent on a new session of the host's connection; a session sshd refuses is a
        `RemoteError` saying so and what to look at, not paramiko's words."""
        client = self.clients[host.key]
        try:
            return SshLink(client, remote_command(python, self.options.container))
        except paramiko.ChannelException as exc:
            raise RemoteError(
                f"sshd refused it a session ({exc.text})",
                host=host.display,
                hint=f"sshd on {host.name} allows only so many sessions on one connection "
                "(MaxSessions), and its log says why it refused this one",
            ) from exc

    def drop(self, host: Host) -> None:
        """Abandon a host (lost or partitioned): closing unblocks any reader."""
        client = self.clients.pop(host.key, None)
        if client is not None:
            client.close()

    def close(self) -> None:
        jumps = [
            pending.result()
            for pending in self._jumps.values()
            if pending.done() and pending.exception() is None
        ]
        for client in [*self.clients.values(), *jumps, *self._spare_jumps]:
            client.close()
        self.clients.clear()
        self._jumps.clear()
        self._spare_jumps.clear()


class SshLink:
    """The agent on one exec channel of the host's shared connection."""

    def __init__(self, client: paramiko.SSHClient, command: str) -> None:
        transport = client.get_transport()
        if transport is None or not transport.is_active():
            raise ConnectionError("the ssh connection is closed")
        self.channel = transport.open_session(timeout=DEFAULT_CONNECT_TIMEOUT_S)
        self.channel.exec_command(command)
        self._stderr = bytearray()
        self.send(agent_payload())

    def send(self, data: bytes) -> None:
        self.channel.sendall(data)

    def recv(self, size: int) -> bytes:
        data = self.channel.recv(size)
        self._collect_stderr()
        if not data:
            # The exit status and final stderr arrive around EOF: collect them before we report.
            deadline = time.monotonic() + 0.5
            while not self.channel.exit_status_ready() and time.monotonic() < deadline:
                time.sleep(0.01)
            self._collect_stderr()
        return data

    def _collect_stderr(self) -> None:
        while self.channel.recv_stderr_ready():
            chunk = self.channel.recv_stderr(65536)
            if not chunk:
                break
            self._stderr += chunk[: max(0, 65536 - len(self._stderr))]

    def stderr_text(self) -> str:
        if self.channel.eof_received:  # it ended (no python3 for it): wait for its last words
            deadline = time.monotonic() + 0.5
            while not self.channel.exit_status_ready() and time.monotonic() < deadline:
                time.sleep(0.01)
        self._collect_stderr()
        return self._stderr.decode("utf-8", "replace")

    def close_input(self) -> None:
        if not self.channel.closed:
            self.channel.shutdown_write()

    def close(self) -> None:
        self.channel.close()
