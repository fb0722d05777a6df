"""The ssh transport: one paramiko connection per host, resolved and checked like OpenSSH.

Settings are OpenSSH's own answer, `ssh -G` (with `-F FILE` for `--ssh-config FILE`). Host keys
are checked against known_hosts; an unknown key fails (or is recorded with accept-new), a changed
key fails (but for StrictHostKeyChecking no, as OpenSSH). Nothing ever prompts. paramiko is
imported only when a job has remote hosts.
"""

from __future__ import annotations

import base64
import contextlib
import dataclasses
import errno
import functools
import hashlib
import logging
import os
import socket
import threading
import time
from collections.abc import Callable, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

import paramiko

from dtrain.errors import Problem, RemoteError, UsageError
from dtrain.inputfiles import MAX_INPUT_BYTES, InputFile, check_input
from dtrain.plan.hosts import Host, address_port, check_same_targets
from dtrain.transport import sshconfig
from dtrain.transport.bootstrap import agent_payload, remote_command
from dtrain.transport.machine import lookup_name
from dtrain.transport.options import DEFAULT_CONNECT_TIMEOUT_S, SshOptions
from dtrain.transport.proxy import ProxySocket
from dtrain.transport.sshlib import TunedTransport

logger = logging.getLogger(__name__)

MAX_JUMP_DEPTH = 8
MAX_PARALLEL_CONNECTS = 32  # handshakes at once
# a server that offers no protocol version or algorithm we share; the stubs lag paramiko
IncompatiblePeer: type[paramiko.SSHException] = paramiko.IncompatiblePeer  # type: ignore[attr-defined]
FIRST_BYTES = 256  # enough of what a port sends first to quote it when it is not ssh


@dataclass(frozen=True)
class SshTarget:
    """One host's ssh settings, resolved the way OpenSSH would resolve them."""

    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    known_hosts_files: tuple[str, ...] = ()
    strict_host_keys: str = "yes"
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    proxy_jump: str | None = None
    proxy_command: str | None = None  # tokens already expanded
    certificate_files: tuple[str, ...] = ()
    host_key_alias: str | None = None
    use_agent: bool = True
    agent_socket: str | None = None  # IdentityAgent's socket; None: the one SSH_AUTH_SOCK names
    server_alive_s: float = 0.0
    server_alive_count: int = 3

    @property
    def display(self) -> str:
        return address_port(self.hostname, self.port)

    @property
    def silence_limit_s(self) -> float | None:
        """How long this host may stay silent before it is lost, as the user's config tells
        OpenSSH (ServerAliveInterval * ServerAliveCountMax); None when the config is silent."""
        if self.server_alive_s <= 0:
            return None
        return self.server_alive_s * max(self.server_alive_count, 1)


def _config_paths(options: SshOptions) -> list[str]:
    """`--ssh-config FILE` alone (like `ssh -F`), else the user's then the system's config."""
    if options.config_file is not None:
        return [str(options.config_file)]
    return [os.path.join(options.user_config_dir, "config"), "/etc/ssh/ssh_config"]


def split_jump_hop(hop: str) -> tuple[str, str, str]:
    """(user, host, port) of one ProxyJump hop, `[user@]host[:port]` or `[user@][v6addr][:port]`."""
    user, _, rest = hop.rpartition("@")
    if rest.startswith("[") and "]" in rest:
        name, _, tail = rest[1:].partition("]")
        return user, name, tail.removeprefix(":")
    name, _, port = rest.partition(":")
    return user, name, port


def _jump_hops(jump: str, name: str, options: SshOptions) -> list[tuple[str, str, str]]:
    """The hops of the ProxyJump `jump` set for host `name`, or an error naming the bad one."""
    hops = []
    for hop in jump.split(","):
        user, hop_name, port_text = split_jump_hop(hop)
        address = hop.rpartition("@")[2]
        problem = None
        if address.startswith("[") and "]" not in address:
            problem = f'"{hop}" lacks the "]" that closes its address'
        elif not hop_name:
            problem = f'"{hop}" names no host'
        elif port_text and not (port_text.isdigit() and 0 < int(port_text) < 65536):
            problem = f'"{port_text}" is not a port'
        if problem is not None:
            raise UsageError(
                f'ssh config {_config_name(options)} sets ProxyJump "{jump}" for host '
                f"{name}: {problem}",
                hint="write each hop as [user@]host[:port] ([addr]:port for an IPv6 address), "
                "separated by commas",
            )
        hops.append((user, hop_name, port_text))
    return hops


def _config_name(options: SshOptions) -> str:
    return " or ".join(_config_paths(options))


def strictness(value: str) -> str:
    """StrictHostKeyChecking as one word: yes, no, accept-new or ask (`ssh -G` prints yes and
    no as true and false; OpenSSH also takes off)."""
    value = value.lower()
    return {"true": "yes", "false": "no", "off": "no"}.get(value, value)


def agent_socket(identity_agent: str) -> str | None:
    """The socket an IdentityAgent value names (`~` and `$VAR` expanded, as OpenSSH does), or
    None for `none`, `SSH_AUTH_SOCK` and the very socket SSH_AUTH_SOCK names."""
    if identity_agent in ("none", "SSH_AUTH_SOCK"):
        return None
    path = os.path.expanduser(os.path.expandvars(identity_agent))
    return None if path == os.environ.get("SSH_AUTH_SOCK") else path


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


def openssh_target(
    host: Host, settings: sshconfig.Settings, options: SshOptions, local: sshconfig.Local
) -> SshTarget:
    """A target from `ssh -G`'s settings for `host` (asked with the hosts file's user and
    port, so they already win); tokens in files and ProxyCommand expanded as OpenSSH does."""

    def get(key: str, default: str) -> str:
        return sshconfig.one(settings, key, default)

    def paths(key: str) -> tuple[str, ...]:
        return tuple(
            sshconfig.expand_tokens(value, settings, host.name, local)
            for line in settings.get(key, ())
            for value in line.split()
        )

    known = (*paths("userknownhostsfile"), *paths("globalknownhostsfile"))
    proxy = get("proxycommand", "none")
    jump = get("proxyjump", "none")
    alive = get("serveraliveinterval", "0")
    alive_count = get("serveralivecountmax", "3")
    hostname, port, user = sshconfig.endpoint(settings, host.name)
    return SshTarget(
        hostname=hostname,
        port=port,
        user=user,
        identity_files=paths("identityfile"),
        identities_only=get("identitiesonly", "no") in ("yes", "true"),
        known_hosts_files=known or (os.path.join(options.user_config_dir, "known_hosts"),),
        strict_host_keys=strictness(get("stricthostkeychecking", "ask")),
        connect_timeout_s=sshconfig.connect_timeout_s(settings, options.connect_timeout_s),
        proxy_jump=None if jump == "none" else jump,
        proxy_command=None
        if proxy == "none"
        else sshconfig.expand_tokens(proxy, settings, host.name, local),
        certificate_files=paths("certificatefile"),
        host_key_alias=get("hostkeyalias", "none") if "hostkeyalias" in settings else None,
        use_agent=get("identityagent", "SSH_AUTH_SOCK") != "none",
        agent_socket=agent_socket(
            sshconfig.expand_tokens(
                get("identityagent", "SSH_AUTH_SOCK"), settings, host.name, local
            )
        ),
        server_alive_s=float(alive) if alive.isdigit() else 0.0,
        server_alive_count=int(alive_count) if alive_count.isdigit() else 3,
    )


def refuse_unhonoured(
    host: Host, settings: sshconfig.Settings, options: SshOptions, ssh: str
) -> None:
    """An error naming the setting, its file:line and the host when the config asks for a
    way of connecting dtrain cannot follow: never silently connect some other way."""
    refused = sshconfig.refused_settings(settings)
    if not refused:
        return
    keyword, value, why = refused[0]
    where = sshconfig.where_set(ssh, host.name, options.config_file, keyword)
    raise UsageError(
        f"ssh config {where} sets {keyword} {value} for host {host.name}: {why}",
        hint=f"give {host.name} a way in by key (IdentityFile, CertificateFile, ssh-agent) in "
        f"a Host block dtrain reads first, or use --ssh-config FILE without {keyword}",
    )


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


def _quoted_first_line(first: bytes) -> str:
    line = first.split(b"\n", 1)[0].rstrip(b"\r")[:80]
    return '"' + line.decode("ascii", "backslashreplace").encode("unicode_escape").decode() + '"'


def _handshake_failure(
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


def _proxy_failure(
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


def _hop_host(user: str, name: str, port: str) -> Host:
    return Host(name=name, user=user or None, port=int(port) if port else None)


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


MAX_KNOWN_HOSTS_BYTES = 256 * 1024 * 1024  # a site-wide known_hosts may list many hosts
DEFAULT_KEY_NAMES = ("id_rsa", "id_dsa", "id_ecdsa", "id_ed25519")  # paramiko's look_for_keys


def refuse_unreadable_files(host: Host, target: SshTarget) -> None:
    """Keys, certificates and known_hosts files that paramiko would read are regular files of
    a sane size: an `IdentityFile /dev/zero` would fill memory, a FIFO wait forever. A file
    that is not there is skipped, as OpenSSH skips it."""
    keys = target.identity_files or tuple(
        os.path.expanduser(f"~/.ssh/{name}") for name in DEFAULT_KEY_NAMES
    )
    hint = f"point it at a regular file in the ssh config for {host.name}, or remove the line"
    named = (
        *((path, "IdentityFile", MAX_INPUT_BYTES) for path in keys),
        *((path, "CertificateFile", MAX_INPUT_BYTES) for path in target.certificate_files),
        *((path, "UserKnownHostsFile", MAX_KNOWN_HOSTS_BYTES) for path in target.known_hosts_files),
    )
    for path, setting, limit in named:
        if os.path.exists(path):
            flag = f"{setting} for host {host.name}"
            check_input(InputFile(Path(path), flag, "ssh file", hint), limit)


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
            hops = _jump_hops(jump, via, self.options)
            for user, name, port in reversed(hops):
                hop = self.target(_hop_host(user, name, port), proxy_jump="")
                if (name, hop.port) in seen:
                    path = " -> ".join([*chain, name])
                    raise UsageError(
                        f"ssh config {_config_name(self.options)}: ProxyJump loops: {path} "
                        "(each reached through the next)",
                        hint=f"give {name} a way in that does not pass through itself: "
                        f"ProxyJump none in a Host {name} block above the others",
                    )
                chain.append(name)
                seen.append((name, hop.port))
            user, via, port = hops[0]
            via_host = _hop_host(user, via, port)
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
                if not _is_transient(exc) or attempt == 1 or self.is_aborted:
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
                hop = _hop_host(user, name, port)
                raise HopFailed(hop, target, exc, is_forwarding=True) from exc
        sock = socket.create_connection(
            (lookup_name(target.hostname), target.port),  # type: ignore[arg-type]  # bytes: no idna
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
        jump_host = Host(name=name, user=user or None, port=int(port) if port else None)
        depth = getattr(self._jump_depth, "value", 0)
        if depth >= MAX_JUMP_DEPTH:
            raise UsageError(
                f"ssh config {_config_name(self.options)}: ProxyJump goes through more than "
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
                failure = _proxy_failure(sock, sock.own_exit_status(), exc, target)
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
            failure = _handshake_failure(exc, first, target.connect_timeout_s, banner, alive)
            if failure is None:
                raise
            raise failure from exc

    def open_link(self, host: Host, python: str) -> SshLink:
        """The agent on a new session of the host's connection; a session sshd refuses is a
        `RemoteError` saying so and what to look at, not paramiko's words."""
        client = self.clients[host.key]
        try:
            return SshLink(client, remote_command(python))
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


DEFINITE_ERRNOS = (errno.EHOSTUNREACH, errno.ENETUNREACH)
CHANNEL_TIMEOUT = "Timeout opening channel."  # paramiko's words for a forwarding that hangs
CHANNEL_UNEXPLAINED = "Unable to open channel."  # ... and for one refused, reason taken


def _is_transient(exc: BaseException) -> bool:
    """Whether another try can help: a definite answer (refused, no banner, not ssh, a key or
    login refused, no such name or route) stays the same, and a timed-out TCP connect already
    had the kernel's own SYN retries."""
    if isinstance(exc, HopFailed) and exc.is_forwarding:
        # paramiko keeps one refusal per connection: of two channels refused at once, one
        # learns why and the other only that it failed; asked again, it learns why too
        return str(exc.cause) == CHANNEL_UNEXPLAINED
    if isinstance(exc, HopFailed):
        return _is_transient(exc.cause)
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
