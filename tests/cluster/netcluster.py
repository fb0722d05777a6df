"""A real multi-host ssh cluster on one Linux machine, for tests and benchmarks.

Each host is an OpenSSH server running as PID 1 of its own network, PID, UTS, IPC and mount
namespaces, wired to a private bridge in 198.18.0.0/24 (bridge .1, host K at .(10+K); another /24
of 198.18.0.0/16 with DTRAIN_TEST_CLUSTER_SLOT, see `_slot`), with no
default route, so no packet can leave the machine. Killing a host's sshd kills everything on it.

This module owns the namespaces, links, sshd processes, lock and temp dir of a cluster, and the
per-host faults (firewall, partition, sshd overrides, hidden paths, key trouble). It is a plain
library: it imports only the standard library and `cryptography` (which paramiko needs anyway),
and never pytest, so the benchmarks can use it too.

Needs root, iproute2, util-linux, nftables and openssh-server.
"""

from __future__ import annotations

import atexit
import contextlib
import errno
import fcntl
import hashlib
import ipaddress
import logging
import os
import re
import secrets
import shlex
import shutil
import signal
import socket
import subprocess
import tempfile
import threading
import time
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from types import TracebackType
from typing import IO, Literal, Union

from cryptography.hazmat.primitives import serialization
from cryptography.hazmat.primitives.asymmetric.ed25519 import Ed25519PrivateKey

logger = logging.getLogger(__name__)


def _slot() -> int:
    """Which /24 of 198.18.0.0/16 this process's clusters use: DTRAIN_TEST_CLUSTER_SLOT, 0-9.

    Slot 0 (the default, and CI's) is 198.18.0.0/24. Two test runs on one machine each take
    their own slot and run their clusters side by side; each slot has its own lock, names and
    stale-leftover sweep, so one never waits on or removes the other's.
    """
    text = os.environ.get("DTRAIN_TEST_CLUSTER_SLOT", "0")
    if not (text.isdigit() and 0 <= int(text) <= 9):
        raise ValueError(f"DTRAIN_TEST_CLUSTER_SLOT must be 0-9, got {text!r}")
    return int(text)


SLOT = _slot()
SUBNET = f"198.18.{SLOT}.0/24"
BRIDGE_ADDRESS = f"198.18.{SLOT}.1"
MAX_HOSTS = 244  # host K is 198.18.SLOT.(10+K), and .254 is the last usable address
SSH_PORT = 22
# Every link, netns and temp dir of a cluster starts with this; slot 0 keeps the old names.
NAME_PREFIX = "dtcl" if SLOT == 0 else f"dtc{SLOT}"
WORKDIR_PREFIX = "dtrain-cluster-" if SLOT == 0 else f"dtrain-cluster{SLOT}-"
LOCK_PATH = Path(
    "/run/dtrain-testcluster.lock" if SLOT == 0 else f"/run/dtrain-testcluster{SLOT}.lock"
)
LOCK_TIMEOUT_S = 600.0
SSHD = "/usr/sbin/sshd"
FIREWALL_TABLE = "dtcl_firewall"
PARTITION_TABLE = "dtcl_partition"


def host_address(index: int) -> str:
    """The address of host `index` (from 1) of a cluster in this slot."""
    return f"198.18.{SLOT}.{10 + index}"


FIRST_HOST_ADDRESS = host_address(1)

_ID_RE = r"[0-9a-f]{6}"
_NETNS_RE = re.compile(rf"^{NAME_PREFIX}{_ID_RE}-h\d+$")
_LINK_RE = re.compile(rf"^{NAME_PREFIX}{_ID_RE}(?:br|v\d+)$")
_WORKDIR_RE = re.compile(rf"^{WORKDIR_PREFIX}{_ID_RE}-")
_WORKDIR_PATH_RE = re.compile(rf"/[^\0=:\s]*/{WORKDIR_PREFIX}{_ID_RE}-[^/\0\s]*/")
_MARKER = ".dtrain-cluster"
_PROBE_PORT = 1  # closed on every host: connecting gets an RST, proving the path

# Each tool the cluster runs, and the Debian package that provides it.
_TOOLS = {
    "ip": "iproute2",
    "nsenter": "util-linux",
    "unshare": "util-linux",
    "setpriv": "util-linux",
    "mount": "mount",
    "nft": "nftables",
    "ssh": "openssh-client",
}

FirewallAction = Literal["drop", "reject"]
HostRef = Union["ClusterHost", str]
Command = str | Sequence[str]


class ClusterError(RuntimeError):
    """The test cluster could not do what was asked; the message says what, where and what to do."""

    def __init__(self, what: str, where: str | None = None, hint: str | None = None) -> None:
        self.what, self.where, self.hint = what, where, hint
        text = f"{where}: {what}" if where else what
        super().__init__(f"{text}\n  hint: {hint}" if hint else text)


class CommandFailed(subprocess.CalledProcessError):
    """A command run on a cluster host exited non-zero; str() shows the host and its stderr."""

    def __init__(self, host: str, completed: subprocess.CompletedProcess[str]) -> None:
        super().__init__(completed.returncode, completed.args, completed.stdout, completed.stderr)
        self.host = host

    def __str__(self) -> str:
        tail = "\n".join((self.stderr or "").strip().splitlines()[-10:])
        return f"{self.host}: {self.cmd!r} exited with {self.returncode}\n  stderr: {tail}"


@dataclass(frozen=True)
class ClusterHost:
    """One host of the cluster: `name` is its ssh alias and hostname, `index` counts from 1."""

    name: str
    address: str
    index: int


@dataclass
class HostProcess:
    """A process started inside a host by `Cluster.spawn`.

    `popen` is the `nsenter` in the root namespace that waits for it; `pid` is the process's PID
    in the root namespace and `host_pid` the PID that `ps` shows on the host.
    """

    host: str
    popen: subprocess.Popen[bytes]
    pid: int
    host_pid: int

    def is_alive(self) -> bool:
        """True while the process exists (and is not a zombie)."""
        return _pid_state(self.pid) not in (None, "Z")

    def kill(self, sig: int = signal.SIGKILL) -> None:
        """Signal the process itself (not the `nsenter` that waits for it)."""
        with contextlib.suppress(ProcessLookupError):
            os.kill(self.pid, sig)


@dataclass
class _HostState:
    """Mutable per-host bookkeeping: the launcher, its sshd, keys and the faults applied."""

    host: ClusterHost
    netns: str
    veth: str
    dir: Path
    launcher: subprocess.Popen[bytes] | None = None
    sshd_pid: int | None = None
    sshd_pidfd: int | None = None
    pid_ns: str | None = None
    host_key: str = ""  # the public key the host presents now
    trusted_key: str | None = None  # the key known_hosts holds for it (None: forgotten)
    firewall_rules: list[str] = field(default_factory=list)
    overlays: dict[str, set[str]] = field(default_factory=dict)  # parent dir -> hidden names
    is_bashrc_blank: bool = False

    @property
    def is_up(self) -> bool:
        return self.sshd_pidfd is not None


# Only one cluster can own 198.18.0.0/24; this catches a second one in the same process, which
# would otherwise wait on its own lock.
_active_lock = threading.Lock()
_active: Cluster | None = None


class Cluster:
    """N ssh hosts in namespaces on a private bridge; use as a context manager or start()/stop().

    Every method that opens a connection first checks that 198.18.0.0/24 is routed to this
    cluster's bridge (`assert_routes_to_bridge`), so nothing is ever sent off the machine.
    The cluster's files live in a fresh temp dir under `workdir` (default: the system temp
    dir, where cleanup_stale() also looks). A Cluster starts once; hosts can restart.
    """

    bridge_address = BRIDGE_ADDRESS

    def __init__(
        self,
        n_hosts: int,
        workdir: Path | None = None,
        *,
        lock_path: Path = LOCK_PATH,
        lock_timeout_s: float = LOCK_TIMEOUT_S,
        start_timeout_s: float = 15.0,
    ) -> None:
        if not 1 <= n_hosts <= MAX_HOSTS:
            raise ValueError(f"n_hosts must be 1..{MAX_HOSTS}, got {n_hosts}")
        self.id = secrets.token_hex(3)
        self.prefix = f"{NAME_PREFIX}{self.id}"
        self.bridge = f"{self.prefix}br"
        # Our links share a link group, so teardown deletes them in one batch; never 0 (the
        # default group every other link is in).
        self._link_group = 0x10000000 | int(self.id, 16)
        self.hosts = tuple(
            ClusterHost(name=f"h{k}", address=host_address(k), index=k)
            for k in range(1, n_hosts + 1)
        )
        self._parent_dir = workdir
        self._lock_path = lock_path
        self._lock_timeout_s = lock_timeout_s
        self._start_timeout_s = start_timeout_s
        self._lock: _LockHandle | None = None
        self._was_started = False
        self._root: Path | None = None
        self._states: dict[str, _HostState] = {}
        self._spawned: list[HostProcess] = []
        self._netns_created: list[str] = []
        self._bridge_created = False
        self._is_running = False
        self._hosts_files = 0
        self.start_s: float | None = None  # wall time of the last start()
        self.stop_s: float | None = None  # wall time of the last stop()

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> Cluster:
        self.start()
        return self

    def __exit__(
        self,
        exc_type: type[BaseException] | None,
        exc: BaseException | None,
        tb: TracebackType | None,
    ) -> None:
        self.stop()

    def __repr__(self) -> str:
        state = "running" if self._is_running else "stopped"
        return f"<Cluster {self.prefix} {len(self.hosts)} hosts {state}>"

    @property
    def is_running(self) -> bool:
        return self._is_running

    @property
    def workdir(self) -> Path:
        """The cluster's temp dir (keys, configs, logs); removed by stop()."""
        if self._root is None:
            raise ClusterError("the cluster has not been started", where=self.prefix)
        return self._root

    @property
    def key(self) -> Path:
        """The suite's own ed25519 client key, accepted by every host."""
        return self.workdir / "client" / "id_ed25519"

    @property
    def known_hosts(self) -> Path:
        """known_hosts with every host's key under both its alias and address."""
        return self.workdir / "known_hosts"

    @property
    def ssh_config(self) -> Path:
        """An ssh_config with one `Host` block per host (alias and address), strict checking on."""
        return self.workdir / "ssh_config"

    def start(self) -> None:
        """Bring every host up and wait until each sshd accepts; on any failure, undo it all."""
        global _active
        if self._was_started:
            raise ClusterError("a Cluster starts only once; make a new one", where=self.prefix)
        self._was_started = True
        check_environment()
        with _active_lock:
            if _active is not None:
                raise ClusterError(
                    f"another cluster ({_active.prefix}) in this process owns {SUBNET}",
                    hint="stop it before starting a new one",
                )
            _active = self
        atexit.register(self.stop)
        started = time.monotonic()
        try:
            self._lock = _acquire_lock(self._lock_path, self._lock_timeout_s, self.prefix)
            _cleanup_stale_locked()
            _refuse_foreign_subnet()
            self._make_files()
            self._create_network()
            for state in self._states.values():
                self._launch(state)
            self._wait_until_up(list(self._states.values()))
            self._is_running = True
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - started
        logger.info("cluster %s: %d hosts up in %.3fs", self.prefix, len(self.hosts), self.start_s)

    def stop(self) -> None:
        """Kill every host and remove every namespace, link and file; safe to call any time."""
        global _active
        started = time.monotonic()
        had_anything = self._root is not None or self._lock is not None
        self._is_running = False
        try:
            for state in self._states.values():
                self._signal_host(state)
            for state in self._states.values():
                self._reap_host(state)
            self._delete_network()
        finally:
            if self._root is not None:
                shutil.rmtree(self._root, ignore_errors=True)
                self._root = None
            if self._lock is not None:
                self._lock.close()  # closing releases the flock
                self._lock = None
            with _active_lock:
                if _active is self:
                    _active = None
            atexit.unregister(self.stop)
        if had_anything:
            self.stop_s = time.monotonic() - started
            logger.info("cluster %s: down in %.3fs", self.prefix, self.stop_s)

    # ----------------------------------------------------------------- lookups

    def host(self, host: HostRef) -> ClusterHost:
        """Resolve a host name ("h2") or a ClusterHost to this cluster's ClusterHost."""
        return self._state(host).host

    def sshd_pid(self, host: HostRef) -> int:
        """Root-namespace PID of the host's sshd, which is PID 1 on the host."""
        state = self._up_state(host)
        assert state.sshd_pid is not None
        return state.sshd_pid

    def sshd_log(self, host: HostRef) -> str:
        """Everything the host's sshd wrote to stderr (-e), across restarts."""
        state = self._state(host)
        try:
            return (state.dir / "sshd.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def private_dir(self, host: HostRef) -> Path:
        """The host's "local disk": this directory is mounted at /srv on that host only."""
        return self._state(host).dir / "srv"

    def host_pids(self, host: HostRef, *, include_sshd: bool = False) -> list[int]:
        """Root-namespace PIDs of the processes on the host, by PID namespace.

        sshd processes (the listener and per-session sshd) are left out unless `include_sshd`;
        zombies are left out (their namespace links are gone).
        """
        state = self._up_state(host)
        pids = []
        for pid in _all_pids():
            try:
                if os.readlink(f"/proc/{pid}/ns/pid") != state.pid_ns:
                    continue
                if not include_sshd and os.readlink(f"/proc/{pid}/exe") == SSHD:
                    continue
            except OSError:
                continue  # gone, or a kernel thread without exe
            pids.append(pid)
        return pids

    def hosts_file(
        self,
        names: Iterable[HostRef] | None = None,
        slots: int | Mapping[str, int] | None = None,
        by: Literal["alias", "address"] = "alias",
        user: str | None = None,
        path: Path | None = None,
    ) -> Path:
        """Write a dtrain hosts file, one `[user@]host [slots=N]` per line, and return its path.

        Aliases resolve through `ssh_config` (and /etc/hosts inside hosts), not in the root
        namespace's resolver; use by="address" for clients that read no ssh_config.
        """
        if by not in ("alias", "address"):
            raise ValueError(f"by must be 'alias' or 'address', got {by!r}")
        chosen = [self.host(h) for h in names] if names is not None else list(self.hosts)
        lines = []
        for h in chosen:
            line = h.name if by == "alias" else h.address
            if user:
                line = f"{user}@{line}"
            n = slots.get(h.name) if isinstance(slots, Mapping) else slots
            if n is not None:
                line += f" slots={n}"
            lines.append(line)
        if path is None:
            self._hosts_files += 1
            path = self.workdir / f"hosts-{self._hosts_files}"
        path.write_text("".join(f"{line}\n" for line in lines))
        return path

    # ----------------------------------------------------------------- running commands

    def run(
        self,
        host: HostRef,
        cmd: Command,
        timeout: float = 10,
        check: bool = False,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        cwd: str | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run `cmd` as root inside the host (its net, PID, mount, UTS and IPC namespaces).

        A string runs under `sh -c`. `env` adds to this process's environment. On timeout the
        command's process group is killed and `subprocess.TimeoutExpired` raised.
        """
        state = self._up_state(host)
        argv = self._nsenter_argv(state, cwd) + _command_argv(cmd)
        return _run_in_session(
            argv, state.host.name, timeout, check, env=_merged_env(env), input=input
        )

    def spawn(
        self,
        host: HostRef,
        cmd: Command,
        env: Mapping[str, str] | None = None,
        cwd: str | None = None,
        stdout: int | IO[bytes] | None = subprocess.DEVNULL,
        stderr: int | IO[bytes] | None = subprocess.DEVNULL,
    ) -> HostProcess:
        """Start a long-lived process on the host and return once it exists there.

        It is visible to plain ssh (`ps`, /proc/PID/environ) like any process on that host, and
        dies with the host at stop() or stop_host().
        """
        state = self._up_state(host)
        popen = subprocess.Popen(
            self._nsenter_argv(state, cwd) + _command_argv(cmd),
            stdin=subprocess.DEVNULL,
            stdout=stdout,
            stderr=stderr,
            env=_merged_env(env),
            start_new_session=True,
        )
        deadline = time.monotonic() + 5.0
        while True:
            children = _children_of({popen.pid}).get(popen.pid, [])
            if children:
                pid = children[0]
                break
            if popen.poll() is not None or time.monotonic() > deadline:
                _killpg(popen.pid)
                reap(popen, timeout_s=2.0)
                raise ClusterError(
                    f"could not start {cmd!r} (nsenter exited {popen.returncode})",
                    where=state.host.name,
                )
            time.sleep(0.001)
        proc = HostProcess(state.host.name, popen, pid, _ns_pid(pid))
        self._spawned.append(proc)
        return proc

    def ssh_argv(self, host: HostRef, *options: str) -> list[str]:
        """`ssh -F <ssh_config> [options] <alias>`: append the remote command to use it."""
        state = self._up_state(host)
        assert_routes_to_bridge(self, state.host.address)
        return ["ssh", "-F", str(self.ssh_config), *options, state.host.name]

    def ssh_run(
        self, host: HostRef, cmd: str, timeout: float = 10, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """Run `cmd` over a real OpenSSH login (strict host key checking, the suite key)."""
        name = self._state(host).host.name
        argv = [*self.ssh_argv(host), cmd]  # one argument, like `ssh host 'cmd'`
        return _run_in_session(argv, name, timeout, check)

    # ----------------------------------------------------------------- faults

    def firewall(
        self, host: HostRef, ports: tuple[int, int] | int, action: FirewallAction = "drop"
    ) -> None:
        """Drop (connect times out) or reject (refused at once) TCP to `ports` on the host.

        Rules add up until clear_firewall(); loopback traffic on the host is never filtered.
        """
        state = self._state(host)
        low, high = (ports, ports) if isinstance(ports, int) else ports
        if not 1 <= low <= high <= 65535:
            raise ValueError(f"bad port range {ports!r}")
        verdicts = {"drop": "drop", "reject": "reject with tcp reset"}
        if action not in verdicts:
            raise ValueError(f"action must be one of {', '.join(verdicts)}, got {action!r}")
        verdict = verdicts[action]
        dport = str(low) if low == high else f"{low}-{high}"
        state.firewall_rules.append(f"tcp dport {dport} {verdict}")
        self._apply_firewall(state)

    def refuse_from(self, host: HostRef, source: str, port: int = SSH_PORT) -> None:
        """Drop TCP to `port` on the host from `source` only: e.g. from the launcher's bridge
        address, so the host is reachable only through another (a jump host)."""
        state = self._state(host)
        address = ipaddress.ip_address(source)
        state.firewall_rules.append(f"ip saddr {address} tcp dport {port} drop")
        self._apply_firewall(state)

    def _apply_firewall(self, state: _HostState) -> None:
        rules = "\n".join(state.firewall_rules)
        self._nft(
            state,
            f"""
            table inet {FIREWALL_TABLE} {{
              chain input {{
                type filter hook input priority 0; policy accept;
                iif "lo" accept
                {rules}
              }}
            }}""",
            FIREWALL_TABLE,
        )

    def clear_firewall(self, host: HostRef) -> None:
        """Remove every rule firewall() added on the host."""
        state = self._state(host)
        state.firewall_rules.clear()
        self._nft(state, "", FIREWALL_TABLE)

    def partition(self, host: HostRef, all_traffic: bool = False, one_way: bool = False) -> None:
        """Silently drop the host's ssh traffic (port 22, both directions, established too).

        An open session stalls with no FIN or RST; new connects time out. With `all_traffic`,
        every packet on the host's eth0 is dropped instead. With `one_way`, only what comes in
        to its port 22 is dropped: the host's own packets still leave (and are answered, but
        the answers never arrive).
        """
        state = self._state(host)
        match = "drop" if all_traffic else "tcp dport 22 drop\ntcp sport 22 drop"
        outgoing = "" if one_way else match
        if one_way:
            match = "tcp dport 22 drop"
        self._nft(
            state,
            f"""
            table inet {PARTITION_TABLE} {{
              chain input {{
                type filter hook input priority -10; policy accept;
                iif "lo" accept
                {match}
              }}
              chain output {{
                type filter hook output priority -10; policy accept;
                oif "lo" accept
                {outgoing}
              }}
            }}""",
            PARTITION_TABLE,
        )

    def heal(self, host: HostRef) -> None:
        """Undo partition(); stalled TCP connections resume on their next retransmit."""
        self._nft(self._state(host), "", PARTITION_TABLE)

    def sshd_override(self, host: HostRef, text: str) -> None:
        """Put `text` at the top of the host's sshd_config (first value wins) and reload sshd.

        E.g. "SetEnv FOO=bar" (new sessions only). "" removes the override. The config is
        checked with `sshd -t` first; a bad one raises and leaves the host as it was.
        """
        state = self._up_state(host)
        self._rewrite_sshd_include(state, "override.conf", text)

    def revoke_key(self, host: HostRef) -> None:
        """The host's sshd stops accepting the suite key (ssh fails with "publickey")."""
        state = self._up_state(host)
        self._rewrite_sshd_include(state, "access.conf", "AuthorizedKeysFile none\n")

    def restore_key(self, host: HostRef) -> None:
        """Undo revoke_key()."""
        state = self._up_state(host)
        self._rewrite_sshd_include(state, "access.conf", "")

    def rotate_host_key(self, host: HostRef) -> None:
        """The host presents a new host key; known_hosts keeps the old one ("changed key")."""
        state = self._up_state(host)
        state.host_key = _write_keypair(state.dir / "ssh_host_ed25519_key")
        self._reload_sshd(state)

    def forget_host_key(self, host: HostRef) -> None:
        """Drop the host from known_hosts (strict checking then reports an unknown key)."""
        self._state(host).trusted_key = None
        self._write_known_hosts()

    def trust_host_key(self, host: HostRef) -> None:
        """Put the key the host presents now into known_hosts (undoes rotate/forget)."""
        state = self._state(host)
        state.trusted_key = state.host_key
        self._write_known_hosts()

    def blank_bashrc(self, host: HostRef) -> None:
        """Bind /dev/null over root's ~/.bashrc on the host, so ssh commands get sshd's PATH.

        Debian's bash sources ~/.bashrc even for `ssh host cmd`; a pyenv init there rewrites
        PATH and costs ~90 ms per command. A no-op when there is no ~/.bashrc.
        """
        state = self._up_state(host)
        bashrc = _root_home() / ".bashrc"
        if state.is_bashrc_blank or not bashrc.exists():
            return
        self._host_script(state, f"mount --bind /dev/null {shlex.quote(str(bashrc))}")
        state.is_bashrc_blank = True

    def restore_bashrc(self, host: HostRef) -> None:
        """Undo blank_bashrc()."""
        state = self._up_state(host)
        if state.is_bashrc_blank:
            self._host_script(state, f"umount {shlex.quote(str(_root_home() / '.bashrc'))}")
            state.is_bashrc_blank = False

    def hide_path(self, host: HostRef, *paths: Path | str) -> None:
        """Make files or directories vanish on one host only (e.g. a package and its dist-info).

        Each parent directory gets an overlay whose upper layer holds whiteouts; an empty tmpfs
        would not do, as Python imports an empty directory as a namespace package. Writes into
        that parent on that host then land in a scratch layer.
        """
        state = self._up_state(host)
        changed: dict[str, set[str]] = {}
        for raw in paths:
            path = Path(os.path.abspath(raw))
            if not path.exists() and not path.is_symlink():
                raise ClusterError(f"{path} does not exist", where=state.host.name)
            parent = str(path.parent)
            if any(c in parent for c in ",:\\") or path.parent == path:
                raise ClusterError(f"cannot hide {path}: unsupported characters or location")
            changed.setdefault(parent, set(state.overlays.get(parent, set()))).add(path.name)
        for parent, names in changed.items():
            self._mount_overlay(state, parent, names)

    def unhide_path(self, host: HostRef, *paths: Path | str) -> None:
        """Undo hide_path() for these paths."""
        state = self._up_state(host)
        changed: dict[str, set[str]] = {}
        for raw in paths:
            path = Path(os.path.abspath(raw))
            parent = str(path.parent)
            names = changed.setdefault(parent, set(state.overlays.get(parent, set())))
            names.discard(path.name)
        for parent, names in changed.items():
            self._mount_overlay(state, parent, names)

    def stop_host(self, host: HostRef) -> None:
        """Kill the host's sshd (its PID 1): every process on the host dies; ssh is refused."""
        state = self._state(host)
        self._kill_host(state)

    def start_host(self, host: HostRef) -> None:
        """Boot a stopped host again: fresh sshd and mounts; its network and files are kept."""
        state = self._state(host)
        if state.is_up:
            raise ClusterError("host is already up", where=state.host.name)
        state.overlays.clear()
        state.is_bashrc_blank = False
        self._launch(state)
        try:
            self._wait_until_up([state])
        except BaseException:
            self._kill_host(state)
            raise

    # ----------------------------------------------------------------- internals: bring-up

    def _state(self, host: HostRef) -> _HostState:
        name = host.name if isinstance(host, ClusterHost) else host
        try:
            return self._states[name]
        except KeyError:
            known = ", ".join(h.name for h in self.hosts)
            hint = f"hosts: {known}"
            raise ClusterError(f"no host {name!r}", where=self.prefix, hint=hint) from None

    def _up_state(self, host: HostRef) -> _HostState:
        state = self._state(host)
        if not state.is_up:
            raise ClusterError("host is stopped", where=state.host.name, hint="start_host() it")
        return state

    def _make_files(self) -> None:
        """Create the temp dir with keys, sshd configs, ssh_config and known_hosts."""
        self._root = Path(
            tempfile.mkdtemp(prefix=f"{WORKDIR_PREFIX}{self.id}-", dir=self._parent_dir)
        )
        (self._root / _MARKER).write_text(f"{os.getpid()} {self.prefix}\n")
        client = self._root / "client"
        client.mkdir()
        client_pub = _write_keypair(client / "id_ed25519")
        (self._root / "authorized_keys").write_text(client_pub + "\n")
        for h in self.hosts:
            hdir = self._root / h.name
            (hdir / "srv").mkdir(parents=True)
            (hdir / "log").mkdir()
            for name in ("wtmp", "btmp", "lastlog"):
                (hdir / "log" / name).touch()
            for name in ("override.conf", "access.conf"):
                (hdir / name).touch()
            host_key = _write_keypair(hdir / "ssh_host_ed25519_key")
            (hdir / "sshd_config").write_text(_sshd_config(hdir, self._root / "authorized_keys"))
            (hdir / "hosts").write_text(_etc_hosts(self.hosts))
            self._states[h.name] = _HostState(
                host=h,
                netns=f"{self.prefix}-{h.name}",
                veth=f"{self.prefix}v{h.index}",
                dir=hdir,
                host_key=host_key,
                trusted_key=host_key,
            )
        self._write_known_hosts()
        self.ssh_config.write_text(
            "".join(_ssh_config_block(h, self.key, self.known_hosts) for h in self.hosts)
        )

    def _create_network(self) -> None:
        """One `ip -batch`: a netns per host, the bridge with .1, a veth per host into its netns."""
        lines = [f"link add {self.bridge} group {self._link_group} type bridge"]
        self._bridge_created = True
        if _has_ipv6():
            lines.append(f"link set {self.bridge} addrgenmode none")
        lines += [f"addr add {BRIDGE_ADDRESS}/24 dev {self.bridge}", f"link set {self.bridge} up"]
        for state in self._states.values():
            self._netns_created.append(state.netns)
            lines.insert(0, f"netns add {state.netns}")
            lines.append(
                f"link add {state.veth} group {self._link_group} "
                f"type veth peer name eth0 netns {state.netns}"
            )
            if _has_ipv6():
                lines.append(f"link set {state.veth} addrgenmode none")
            lines += [f"link set {state.veth} master {self.bridge}", f"link set {state.veth} up"]
        result = _ip_batch(lines)
        if result.returncode != 0:
            raise ClusterError(
                f"could not create the cluster network: {result.stderr.strip()}",
                where=self.prefix,
                hint="this needs root with CAP_NET_ADMIN and CAP_SYS_ADMIN (ip netns, bridges)",
            )

    def _launch(self, state: _HostState) -> None:
        """Start the host's sshd as PID 1 of fresh PID/UTS/IPC/mount namespaces in its netns."""
        h, d = state.host, state.dir
        q = shlex.quote
        host_ip = [
            f"addr replace {h.address}/24 dev eth0",
            "link set eth0 up",
            "link set lo up",
        ]
        if _has_ipv6():
            host_ip.insert(0, "link set eth0 addrgenmode none")
        mounts = [
            # Drop this mount namespace's copies of every netns handle, then give the host its
            # own /run (sshd's privilege separation dir, utmp) like a real machine.
            "umount -R -l /run/netns 2>/dev/null || true",
            f"mount -t tmpfs -o mode=0755,size=64m {NAME_PREFIX}-run /run",
            "mkdir -m 0755 /run/sshd",
            f"if [ -d /dev/shm ]; then mount -t tmpfs -o mode=1777 {NAME_PREFIX}-shm /dev/shm; fi",
            f"mount --bind {q(str(d / 'hosts'))} /etc/hosts",
            f"mount --bind {q(str(d / 'srv'))} /srv",
        ]
        shims = _pyenv_shims()
        if shims is not None:
            # The login shells run `pyenv rehash`, which takes a lock file in the shared shims
            # dir; a host killed mid-login (stop_host, teardown) would leave it behind and every
            # later login on this machine would wait 60 s for it. Each host gets its own layer.
            up, work = d / "shims-up", d / "shims-work"
            mounts.append(
                f"mkdir -p {q(str(up))} {q(str(work))} && mount -t overlay {NAME_PREFIX}-shims "
                f"-o lowerdir={q(str(shims))},upperdir={q(str(up))},workdir={q(str(work))} "
                f"{q(str(shims))} || true"
            )
        for name in ("wtmp", "btmp", "lastlog"):
            target = f"/var/log/{name}"
            mounts.append(
                f"if [ -f {target} ]; then mount --bind {q(str(d / 'log' / name))} {target}; fi"
            )
        script = "\n".join(
            [
                "set -e",
                f"hostname {h.name}",
                f"printf '%s\\n' {' '.join(q(line) for line in host_ip)} | ip -batch -",
                *mounts,
                f"exec {SSHD} -D -e -f {q(str(d / 'sshd_config'))}",
            ]
        )
        argv = [
            "ip", "netns", "exec", state.netns,
            "unshare", "--pid", "--fork", "--mount-proc", "--uts", "--ipc", "--mount",
            "--kill-child=SIGKILL",
            "sh", "-c", script,
        ]  # fmt: skip
        if threading.current_thread() is threading.main_thread():
            # If this process dies without stop(), the kernel kills the launcher, and
            # --kill-child then kills sshd and so the whole host. (The death signal fires when
            # the *thread* that forked exits, hence only from the main thread.)
            argv = ["setpriv", "--pdeathsig", "KILL", *argv]
        with open(d / "sshd.log", "ab") as log:
            state.launcher = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )

    def _wait_until_up(self, states: list[_HostState]) -> None:
        """Wait (bounded) until each sshd is PID 1 of its host and listens on :22."""
        deadline = time.monotonic() + self._start_timeout_s
        pending = {s.host.name: s for s in states}
        while pending:
            launchers = {s.launcher.pid for s in pending.values() if s.launcher is not None}
            children = _children_of(launchers)
            for name, state in list(pending.items()):
                assert state.launcher is not None
                if state.launcher.poll() is not None:
                    raise ClusterError(
                        f"sshd exited during start (status {state.launcher.returncode})",
                        where=name,
                        hint=f"sshd log:\n{self.sshd_log(name).strip()}",
                    )
                if state.sshd_pid is None:
                    kids = children.get(state.launcher.pid, [])
                    if not kids:
                        continue
                    self._adopt_sshd(state, kids[0])
                assert state.sshd_pid is not None
                if _exe(state.sshd_pid) == SSHD and _listen_inodes(state.sshd_pid, SSH_PORT):
                    del pending[name]
            if not pending:
                break
            if time.monotonic() > deadline:
                names = ", ".join(sorted(pending))
                logs = "\n".join(f"[{n}] {self.sshd_log(n).strip()}" for n in sorted(pending))
                raise ClusterError(
                    f"sshd on {names} did not listen within {self._start_timeout_s:.0f}s",
                    where=self.prefix,
                    hint=f"sshd logs:\n{logs}",
                )
            time.sleep(0.003)
        assert_routes_to_bridge(self)
        _wait_reachable([s.host.address for s in states], deadline)

    def _adopt_sshd(self, state: _HostState, pid: int) -> None:
        """Hold a pidfd on the host's PID 1, so later signals cannot hit a recycled PID."""
        pidfd = os.pidfd_open(pid)
        assert state.launcher is not None
        if _ppid(pid) != state.launcher.pid:  # it died before we held it
            os.close(pidfd)
            raise ClusterError("sshd died during start", where=state.host.name)
        state.sshd_pid, state.sshd_pidfd = pid, pidfd
        state.pid_ns = os.readlink(f"/proc/{pid}/ns/pid")

    # ----------------------------------------------------------------- internals: teardown

    def _kill_host(self, state: _HostState) -> None:
        self._signal_host(state)
        self._reap_host(state)

    def _signal_host(self, state: _HostState) -> None:
        """SIGKILL the host's PID 1; the kernel then kills every other process on the host."""
        if state.sshd_pidfd is not None:
            with contextlib.suppress(ProcessLookupError):
                signal.pidfd_send_signal(state.sshd_pidfd, signal.SIGKILL)
            os.close(state.sshd_pidfd)
            state.sshd_pidfd = None
        if state.launcher is not None:
            # If sshd was never adopted, killing the launcher makes --kill-child kill it.
            with contextlib.suppress(ProcessLookupError):
                state.launcher.send_signal(signal.SIGKILL)

    def _reap_host(self, state: _HostState) -> None:
        """Reap the host's launcher, and the nsenter of each process spawned there."""
        if state.launcher is not None:
            reap(state.launcher, timeout_s=5.0)
            state.launcher = None
        state.sshd_pid = None
        for proc in [p for p in self._spawned if p.host == state.host.name]:
            reap(proc.popen)
            self._spawned.remove(proc)

    def _delete_network(self) -> None:
        """Delete our links in one kernel batch (per-link deletes cost ~20 ms each), then netns."""
        lines = []
        if self._bridge_created:
            members = _link_names(group=self._link_group)
            if members and all(name.startswith(self.prefix) for name in members):
                lines.append(f"link del group {self._link_group}")
            else:  # never delete a group holding a link that is not ours
                lines += [f"link del {name}" for name in members if name.startswith(self.prefix)]
        lines += [f"netns del {name}" for name in self._netns_created]
        if lines:
            result = _ip_batch(lines, force=True)
            if result.returncode != 0:
                logger.debug("teardown of %s: %s", self.prefix, result.stderr.strip())
        self._netns_created.clear()
        self._bridge_created = False
        leftovers = [n for n in _netns_names() if n.startswith(self.prefix)]
        leftovers += [n for n in _link_names() if n.startswith(self.prefix)]
        if leftovers:
            raise ClusterError(f"teardown left {', '.join(leftovers)} behind", where=self.prefix)

    # ----------------------------------------------------------------- internals: faults

    def _nsenter_argv(self, state: _HostState, cwd: str | None = None) -> list[str]:
        argv = ["nsenter", f"--target={state.sshd_pid}", "--net", "--pid", "--mount"]
        argv += ["--uts", "--ipc"]
        if cwd is not None:
            argv.append(f"--wd={cwd}")
        return [*argv, "--"]

    def _host_script(self, state: _HostState, script: str) -> None:
        """Run a root shell script in the host's mount namespace; raise with its stderr."""
        # All of the host's namespaces: with only its mount namespace, /proc/self would not
        # resolve (that /proc belongs to the host's PID namespace) and umount would fail.
        argv = [*self._nsenter_argv(state), "sh", "-ec", script]
        result = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        if result.returncode != 0:
            raise ClusterError(f"{script!r} failed: {result.stderr.strip()}", where=state.host.name)

    def _nft(self, state: _HostState, table_text: str, table: str) -> None:
        """Replace (or, with empty text, delete) one nft table in the host's netns, atomically."""
        ruleset = f"add table inet {table}\ndelete table inet {table}\n{table_text}\n"
        argv = ["nsenter", f"--net=/run/netns/{state.netns}", "--", "nft", "-f", "-"]
        result = subprocess.run(
            argv, input=ruleset, capture_output=True, text=True, timeout=10, check=False
        )
        if result.returncode != 0:
            raise ClusterError(f"nft failed: {result.stderr.strip()}", where=state.host.name)

    def _rewrite_sshd_include(self, state: _HostState, name: str, text: str) -> None:
        path = state.dir / name
        previous = path.read_text()
        path.write_text(text if not text or text.endswith("\n") else text + "\n")
        config = str(state.dir / "sshd_config")
        argv = [*self._nsenter_argv(state), SSHD, "-t", "-f", config]
        check = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        if check.returncode != 0:
            path.write_text(previous)
            raise ClusterError(
                f"sshd rejects the config: {check.stderr.strip()}",
                where=state.host.name,
                hint=f"the override was:\n{text}",
            )
        self._reload_sshd(state)

    def _reload_sshd(self, state: _HostState) -> None:
        """SIGHUP sshd (it re-execs with the same PID) and wait for its new listening socket."""
        assert state.sshd_pid is not None and state.sshd_pidfd is not None
        before = _listen_inodes(state.sshd_pid, SSH_PORT)
        signal.pidfd_send_signal(state.sshd_pidfd, signal.SIGHUP)
        deadline = time.monotonic() + 10.0
        while True:
            now = _listen_inodes(state.sshd_pid, SSH_PORT)
            if now and not now & before:
                return
            if _pid_state(state.sshd_pid) in (None, "Z") or time.monotonic() > deadline:
                raise ClusterError(
                    "sshd did not come back after SIGHUP",
                    where=state.host.name,
                    hint=f"sshd log:\n{self.sshd_log(state.host).strip()[-2000:]}",
                )
            time.sleep(0.002)

    def _mount_overlay(self, state: _HostState, parent: str, names: set[str]) -> None:
        """(Re)mount the overlay over `parent` on the host so that exactly `names` are hidden."""
        q = shlex.quote
        digest = hashlib.sha256(parent.encode()).hexdigest()[:16]
        layer = f"/run/{NAME_PREFIX}-overlay/{digest}"  # the host's private /run is a tmpfs
        steps = ["set -e"]
        if parent in state.overlays:
            steps.append(f"umount {q(parent)}")
        if names:
            steps += [
                f"rm -rf {q(layer)}",
                f"mkdir -p {q(layer)}/upper {q(layer)}/work",
                *(f"mknod {q(layer + '/upper/' + n)} c 0 0" for n in sorted(names)),
                f"mount -t overlay {NAME_PREFIX}-hide "
                f"-o lowerdir={q(parent)},upperdir={q(layer)}/upper,workdir={q(layer)}/work "
                f"{q(parent)}",
            ]
        self._host_script(state, "\n".join(steps))
        if names:
            state.overlays[parent] = set(names)
        else:
            state.overlays.pop(parent, None)

    def _write_known_hosts(self) -> None:
        lines = [
            f"{s.host.name},{s.host.address} {s.trusted_key}\n"
            for s in self._states.values()
            if s.trusted_key is not None
        ]
        self.known_hosts.write_text("".join(lines))


# --------------------------------------------------------------------- safety and environment


def assert_routes_to_bridge(cluster: Cluster, address: str = FIRST_HOST_ADDRESS) -> None:
    """Refuse unless the kernel routes `address` to this cluster's bridge (never off-machine)."""
    _refuse_outside_subnet(address)
    result = subprocess.run(
        ["ip", "route", "get", address], capture_output=True, text=True, timeout=5, check=False
    )
    match = re.search(r"\bdev (\S+)", result.stdout)
    device = match.group(1) if match else None
    if result.returncode != 0 or device != cluster.bridge:
        raise ClusterError(
            f"{address} is routed via {device or 'nothing'} ({result.stdout.strip()}"
            f"{result.stderr.strip()}), not via {cluster.bridge}; refusing to connect",
            where=cluster.prefix,
            hint=f"the cluster is down or another interface claims {SUBNET}",
        )


def check_environment() -> None:
    """Raise with what to do unless this process is root and has every tool the cluster runs."""
    if os.geteuid() != 0:
        raise ClusterError(
            "the ssh test cluster needs root (network namespaces, bridges, mounts)",
            hint="run the cluster tests as root, e.g. in the CI container",
        )
    missing = sorted({pkg for tool, pkg in _TOOLS.items() if shutil.which(tool) is None})
    if not os.access(SSHD, os.X_OK):
        missing.append("openssh-server")
    if missing:
        raise ClusterError(
            f"missing tools for the ssh test cluster: {', '.join(missing)}",
            hint=f"apt-get install -y {' '.join(missing)}",
        )
    if not Path("/srv").is_dir():
        raise ClusterError("/srv does not exist (hosts mount their private dir there)")


def cleanup_stale(lock_path: Path = LOCK_PATH, lock_timeout_s: float = LOCK_TIMEOUT_S) -> list[str]:
    """Remove what crashed earlier runs left (by this module's name prefix only); return it.

    start() does this itself; call it alone to tidy a machine. Waits for any live cluster.
    """
    if _active is not None:
        raise ClusterError(f"cluster {_active.prefix} is running in this process; stop it first")
    with _acquire_lock(lock_path, lock_timeout_s, "cleanup_stale"):
        return _cleanup_stale_locked()


def _cleanup_stale_locked() -> list[str]:
    """Under the lock no live cluster exists, so everything with our prefix is stale."""
    removed: list[str] = []
    stale_netns = [n for n in _netns_names() if _NETNS_RE.match(n)]
    for name in stale_netns:
        pids = subprocess.run(
            ["ip", "netns", "pids", name], capture_output=True, text=True, timeout=5, check=False
        ).stdout.split()
        for text in pids:
            with contextlib.suppress(ProcessLookupError, ValueError):
                os.kill(int(text), signal.SIGKILL)
                removed.append(f"process {text} in netns {name}")
    for pid in _all_pids():
        # Outside any netns: sshd of a stale cluster whose netns was already deleted, daemons
        # started beside a cluster with a config in its workdir (slurmctld of slurmcluster.py),
        # and clients whose environment points into one (SLURM_CONF).
        workdir = _stale_workdir_named_by(pid)
        if workdir is not None:
            with contextlib.suppress(ProcessLookupError):
                os.kill(pid, signal.SIGKILL)
                removed.append(f"process {pid} of {workdir}")
    links = [n for n in _link_names() if _LINK_RE.match(n)]
    lines = [f"link del {n}" for n in links]
    lines += [f"netns del {n}" for n in stale_netns]
    if lines:
        _ip_batch(lines, force=True)
        removed += links + [f"netns {n}" for n in stale_netns]
    tmp = Path(tempfile.gettempdir())
    for path in tmp.iterdir() if tmp.is_dir() else ():
        if not (_WORKDIR_RE.match(path.name) and (path / _MARKER).is_file()):
            continue
        with contextlib.suppress(OSError, ValueError, IndexError):
            owner = int((path / _MARKER).read_text().split()[0])
            if owner != os.getpid() and _pid_state(owner) not in (None, "Z"):
                continue  # its process still lives; leave it alone
        shutil.rmtree(path, ignore_errors=True)
        removed.append(str(path))
    if removed:
        logger.warning("removed leftovers of crashed cluster runs: %s", ", ".join(removed))
    return removed


def _stale_workdir_named_by(pid: int) -> str | None:
    """The stale cluster workdir that `pid`'s command line or environment names, if any.

    A workdir whose owner (its marker) still lives is not stale; one already removed is.
    """
    if pid == os.getpid():
        return None
    try:
        text = Path(f"/proc/{pid}/cmdline").read_bytes() + b"\0"
        text += Path(f"/proc/{pid}/environ").read_bytes()
    except OSError:
        return None
    for match in _WORKDIR_PATH_RE.finditer(text.decode(errors="replace")):
        workdir = Path(match.group(0).rstrip("/"))
        with contextlib.suppress(OSError, ValueError, IndexError):
            owner = int((workdir / _MARKER).read_text().split()[0])
            if owner != os.getpid() and _pid_state(owner) not in (None, "Z"):
                continue
        return str(workdir)
    return None


def _acquire_lock(path: Path, timeout_s: float, owner: str) -> _LockHandle:
    """Take the machine-wide flock that makes a cluster the only owner of 198.18.0.0/24."""
    lock_file = open(path, "a+")  # noqa: SIM115 - held for the cluster's whole life
    deadline = time.monotonic() + timeout_s
    announced = False
    while True:
        try:
            fcntl.flock(lock_file, fcntl.LOCK_EX | fcntl.LOCK_NB)
            break
        except BlockingIOError:
            lock_file.seek(0)
            holder = lock_file.read().strip() or "unknown"
            if time.monotonic() > deadline:
                lock_file.close()
                raise ClusterError(
                    f"{SUBNET} is still held by another test cluster ({holder}) after "
                    f"{timeout_s:.0f}s",
                    where=str(path),
                    hint="wait for the other test run to finish, or kill that pid if it hangs",
                ) from None
            if not announced:
                logger.warning("waiting up to %.0fs for %s (held by %s)", timeout_s, path, holder)
                announced = True
            time.sleep(0.1)
    lock_file.seek(0)
    lock_file.truncate()
    lock_file.write(f"pid {os.getpid()} cluster {owner}\n")
    lock_file.flush()
    return _LockHandle(lock_file)


class _LockHandle:
    """The open lock file; closing it releases the lock. Usable as a context manager."""

    def __init__(self, lock_file: IO[str]) -> None:
        self._file = lock_file

    def close(self) -> None:
        self._file.close()

    def __enter__(self) -> _LockHandle:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


def _refuse_outside_subnet(address: str) -> None:
    try:
        inside = ipaddress.ip_address(address) in ipaddress.ip_network(SUBNET)
    except ValueError:
        inside = False
    if not inside:
        raise ClusterError(f"{address} is outside {SUBNET}; refusing to connect")


def _refuse_foreign_subnet() -> None:
    result = subprocess.run(
        ["ip", "-o", "-4", "addr", "show", "to", SUBNET],
        capture_output=True,
        text=True,
        timeout=5,
        check=False,
    )
    if result.stdout.strip():
        device = result.stdout.split()[1]
        raise ClusterError(
            f"{SUBNET} is already assigned to {device}; refusing to start a second network there",
            hint=f"find out what owns {device}; leftovers of this suite are removed automatically",
        )


# --------------------------------------------------------------------- config text


def _sshd_config(hdir: Path, authorized_keys: Path) -> str:
    """Base sshd_config; the two Includes come first because the first value wins."""
    return f"""\
Include {hdir / "override.conf"}
Include {hdir / "access.conf"}
Port {SSH_PORT}
AddressFamily inet
HostKey {hdir / "ssh_host_ed25519_key"}
PidFile none
AuthorizedKeysFile {authorized_keys}
PermitRootLogin prohibit-password
PubkeyAuthentication yes
PasswordAuthentication no
KbdInteractiveAuthentication no
UsePAM no
StrictModes no
PrintMotd no
PrintLastLog no
Subsystem sftp internal-sftp
"""


def _ssh_config_block(h: ClusterHost, key: Path, known_hosts: Path) -> str:
    return f"""\
Host {h.name} {h.address}
  HostName {h.address}
  Port {SSH_PORT}
  User root
  IdentityFile {key}
  IdentitiesOnly yes
  UserKnownHostsFile {known_hosts}
  GlobalKnownHostsFile /dev/null
  StrictHostKeyChecking yes
  BatchMode yes
  ConnectTimeout 5
"""


def _etc_hosts(hosts: Sequence[ClusterHost]) -> str:
    lines = ["127.0.0.1\tlocalhost", "::1\tlocalhost ip6-localhost ip6-loopback"]
    lines += [f"{h.address}\t{h.name}" for h in hosts]
    return "\n".join(lines) + "\n"


def _write_keypair(path: Path) -> str:
    """Write an ed25519 key pair (private 0600, OpenSSH format) and return the public line."""
    key = Ed25519PrivateKey.generate()
    private = key.private_bytes(
        serialization.Encoding.PEM,
        serialization.PrivateFormat.OpenSSH,
        serialization.NoEncryption(),
    )
    public = (
        key.public_key()
        .public_bytes(serialization.Encoding.OpenSSH, serialization.PublicFormat.OpenSSH)
        .decode()
    )
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL, 0o600)
    with os.fdopen(fd, "wb") as f:
        f.write(private)
    Path(f"{path}.pub").write_text(public + "\n")
    return public


# --------------------------------------------------------------------- small OS helpers


def _ip_batch(lines: Sequence[str], force: bool = False) -> subprocess.CompletedProcess[str]:
    argv = ["ip", *(["-force"] if force else []), "-batch", "-"]
    return subprocess.run(
        argv, input="\n".join(lines) + "\n", capture_output=True, text=True, timeout=30, check=False
    )


def _netns_names() -> list[str]:
    try:
        return [p.name for p in Path("/run/netns").iterdir()]
    except FileNotFoundError:
        return []


def _link_names(group: int | None = None) -> list[str]:
    """Names of the root namespace's links, or only those in link `group`."""
    if group is None:
        return [p.name for p in Path("/sys/class/net").iterdir()]
    result = subprocess.run(
        ["ip", "-o", "link", "show", "group", str(group)],
        capture_output=True,
        text=True,
        timeout=5,
        check=False,
    )
    return [line.split(":")[1].strip().split("@")[0] for line in result.stdout.splitlines()]


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def _stat_fields(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name (state is [0], ppid [1])."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _pid_state(pid: int) -> str | None:
    fields = _stat_fields(pid)
    return fields[0] if fields else None


def _ppid(pid: int) -> int | None:
    fields = _stat_fields(pid)
    return int(fields[1]) if fields else None


def _children_of(parents: set[int]) -> dict[int, list[int]]:
    """Map each of `parents` to its child PIDs (this kernel has no /proc/PID/task/*/children)."""
    found: dict[int, list[int]] = {}
    if not parents:
        return found
    for pid in _all_pids():
        ppid = _ppid(pid)
        if ppid in parents:
            found.setdefault(ppid, []).append(pid)
    return found


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _ns_pid(pid: int) -> int:
    """The PID a process has inside its own (innermost) PID namespace."""
    for line in Path(f"/proc/{pid}/status").read_text().splitlines():
        if line.startswith("NSpid:"):
            return int(line.split()[-1])
    return pid


def _listen_inodes(pid: int, port: int) -> set[str]:
    """Inodes of TCP sockets listening on `port` in the netns of `pid` (no packets sent)."""
    inodes: set[str] = set()
    try:
        lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return inodes
    for line in lines:
        fields = line.split()
        if fields[3] == "0A" and int(fields[1].rsplit(":", 1)[1], 16) == port:
            inodes.add(fields[9])
    return inodes


def _wait_reachable(addresses: Sequence[str], deadline: float) -> None:
    """Prove the bridge path to each host without touching its sshd: a closed port answers RST.

    Together with the LISTEN check in /proc this means each sshd accepts; probing :22 itself
    would fork an sshd per host and log a preauth disconnect.
    """
    for address in addresses:
        _refuse_outside_subnet(address)
    pending = set(addresses)
    while pending:
        for address in sorted(pending):
            with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
                s.settimeout(max(0.05, min(1.0, deadline - time.monotonic())))
                err = s.connect_ex((address, _PROBE_PORT))
            if err in (0, errno.ECONNREFUSED):
                pending.discard(address)
        if pending and time.monotonic() > deadline:
            raise ClusterError(f"{', '.join(sorted(pending))} not reachable over the bridge")
        if pending:
            time.sleep(0.01)


def _command_argv(cmd: Command) -> list[str]:
    return ["sh", "-c", cmd] if isinstance(cmd, str) else list(cmd)


def _merged_env(env: Mapping[str, str] | None) -> dict[str, str] | None:
    return None if env is None else {**os.environ, **env}


def _run_in_session(
    argv: list[str],
    where: str,
    timeout: float,
    check: bool,
    env: dict[str, str] | None = None,
    input: str | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` to completion in a new session; on timeout kill its process group and raise
    `subprocess.TimeoutExpired`; with `check`, a non-zero exit raises CommandFailed(`where`)."""
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        _killpg(proc.pid)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(argv, timeout, out, err) from None
    completed = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    if check and completed.returncode != 0:
        raise CommandFailed(where, completed)
    return completed


def _killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def reap(popen: subprocess.Popen[bytes] | subprocess.Popen[str], timeout_s: float = 2.0) -> None:
    """Wait for a child we started (killing its group past the bound) and close its pipes."""
    try:
        popen.wait(timeout=timeout_s)
    except subprocess.TimeoutExpired:
        _killpg(popen.pid)
        popen.wait(timeout=timeout_s)
    for stream in (popen.stdin, popen.stdout, popen.stderr):
        if stream is not None:
            stream.close()


def _pyenv_shims() -> Path | None:
    root = Path(os.environ.get("PYENV_ROOT") or Path.home() / ".pyenv")
    shims = root / "shims"
    return shims if shims.is_dir() else None


def _has_ipv6() -> bool:
    return Path("/proc/sys/net/ipv6").is_dir()


def _root_home() -> Path:
    import pwd

    return Path(pwd.getpwnam("root").pw_dir)
