"""A real Slurm cluster on top of a running netcluster.Cluster, for tests and benchmarks.

slurmctld runs in the root network namespace, bound to the bridge address only; one slurmd runs
inside each host (its net, PID, mount, UTS and IPC namespaces), so a task sees its own node's
hostname, 198.18.0.x address and only its node's processes, as on a real cluster. Debian 12's
slurm-wlm 22.05 with auth/none and cred/none: no munge, no key.

This module owns the slurm.conf, the daemons, the clients started through it, the cgroup mounts
inside the hosts and the state dir (`<cluster workdir>/slurm`). A plain library like
netcluster: standard library only, never pytest. Needs the Debian packages slurmctld, slurmd and
slurm-client.

Facts a later user needs (Slurm 22.05.8 in these namespaces, measured):

- Every client (srun, salloc, sbatch, squeue, scancel, scontrol, sinfo) finds the cluster only
  through `SLURM_CONF` (see env()). Inside a host the same file is on the shared filesystem and
  SlurmctldHost's address (198.18.0.1) is reachable over the host's eth0: nothing else is
  needed. The controller's name (`<prefix>-ctl`) resolves nowhere and need not.
- slurmctld binds 0.0.0.0 by default, and `CommunicationParameters=NoInAddrAny` does not change
  that. `NoCtldInAddrAny` binds the address its *hostname* resolves to (127.0.0.1 on this
  machine), and slurmctld insists that its hostname is SlurmctldHost's name. So slurmctld runs
  in its own UTS and mount namespace, with hostname `<prefix>-ctl` and an /etc/hosts that maps
  that name to the bridge address: it then listens on 198.18.0.1:6817 only. (With auth/none, a
  controller on 0.0.0.0 would run anyone's commands as root.) It also runs as PID 1 of its own
  PID namespace, so its helper (`slurmctld: slurmscriptd`, whose command line names no config)
  dies with it. srun still listens on 0.0.0.0 (ephemeral ports) for its tasks' I/O.
- slurmd only needs a tmpfs on /sys/fs/cgroup with a cgroup v1 hierarchy at
  /sys/fs/cgroup/systemd (it checks that path's filesystem type, nothing else, with
  proctrack/pgid and task/none). A private *named* hierarchy (`none,name=<prefix>`) does: the
  machine's real hierarchies are never attached, slurmd creates no cgroup in it, and it vanishes
  with the last mount (while it exists every process lists it in /proc/self/cgroup).
- slurmstepd and the tasks are children of the host's PID 1 (slurmd double-forks), so killing a
  host still kills every task on it. slurmstepd's environment is empty and its command line is
  `slurmstepd: [JOB.STEP]`; tasks carry `SLURM_CONF` in their environment (srun exports it).
- srun forks a helper process into its own process group, with or without an allocation of
  its own. SIGKILL of srun alone: the helper ends the step (and an allocation srun made) and the
  tasks die within about a second. SIGKILL of the whole process group (srun and helper) leaves
  the tasks running and the job `R` (the step still listed by `squeue -s`) until scancel or the
  allocation's end: a launcher must not rely on srun's death to stop its tasks.
- SIGTERM makes slurmctld save state and wait for its agents (~4 s); stop() uses SIGKILL, as the
  state is thrown away anyway. Nodes reach `idle` well within a second of slurmd starting.
- /usr/sbin/slurmctld, slurmd and slurmstepd are Debian alternatives: /proc/PID/exe reads
  `/usr/sbin/slurmctld-wlm` etc.
- `KillWait=5` (default 30): scancel sends SIGTERM, then SIGKILL 5 s later, and srun waits
  KillWait + 2 s for an aborted step. `extra_conf` lines go last in slurm.conf.
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from .netcluster import BRIDGE_ADDRESS, Cluster, ClusterError, ClusterHost, CommandFailed, reap

logger = logging.getLogger(__name__)

SLURMCTLD = "/usr/sbin/slurmctld"
SLURMD = "/usr/sbin/slurmd"
SLURMSTEPD = "/usr/sbin/slurmstepd"
CONTROLLER_PORT = 6817  # bound to the bridge address only; one cluster owns it at a time
NODE_PORT = 6818  # inside each host's own network namespace
CPUS_PER_NODE = 4
PARTITION = "main"
NO_SSH_TABLE = "dtcl_nossh"
CLIENTS = ("srun", "salloc", "sbatch", "squeue", "scancel", "scontrol", "sinfo")
# Variables a client reads from its environment: inherited ones (the suite itself running
# inside an allocation) would point every client at the wrong job.
_CLIENT_ENV_PREFIXES = ("SLURM_", "SALLOC_", "SBATCH_", "SRUN_", "SQUEUE_", "SINFO_", "SCANCEL_")

HostName = ClusterHost | str | None  # None: the launching machine (the root namespaces)


@dataclass
class SlurmClient:
    """A long-running client started by `SlurmCluster.spawn` (srun, salloc, ...).

    `popen` leads its own process group (srun's helper child is in it too); `pid` is the
    client's PID in the root namespace.
    """

    host: str | None
    popen: subprocess.Popen[bytes]
    pid: int

    def is_alive(self) -> bool:
        return _pid_state(self.pid) not in (None, "Z")

    def kill_group(self, sig: int = signal.SIGKILL) -> None:
        """Signal the client's whole process group (srun and its helper)."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.popen.pid, sig)


class SlurmCluster:
    """slurmctld plus one slurmd per host of a running `Cluster`; start()/stop() or `with`.

    stop() ends every Slurm process it started (and every step and task on the nodes), unmounts
    what it mounted in the hosts and removes its state dir; it is safe to call twice and runs
    from atexit. The Cluster itself stays up.
    """

    def __init__(
        self,
        cluster: Cluster,
        *,
        cpus_per_node: int = CPUS_PER_NODE,
        extra_conf: str = "",
        start_timeout_s: float = 20.0,
    ) -> None:
        self.cluster = cluster
        self.cpus_per_node = cpus_per_node
        self.extra_conf = extra_conf
        self._start_timeout_s = start_timeout_s
        self.controller_name = f"{cluster.prefix}-ctl"
        self._dir: Path | None = None
        self._ctld_launcher: subprocess.Popen[bytes] | None = None
        self._ctld_pid: int | None = None
        self._ctld_pidfd: int | None = None
        self._slurmd: dict[str, tuple[subprocess.Popen[bytes], int]] = {}
        self._mounted: set[str] = set()
        self._no_ssh: set[str] = set()
        self._clients: list[SlurmClient] = []
        self._was_started = False
        self.start_s: float | None = None
        self.stop_s: float | None = None

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> SlurmCluster:
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
        return f"<SlurmCluster {self.cluster.prefix} {len(self.nodes)} nodes>"

    @property
    def nodes(self) -> tuple[ClusterHost, ...]:
        """The nodes: the cluster's hosts, with the same names (h1..hN)."""
        return self.cluster.hosts

    @property
    def dir(self) -> Path:
        """State, spool, logs and slurm.conf: `<cluster workdir>/slurm`, removed by stop()."""
        if self._dir is None:
            raise ClusterError("the Slurm cluster is not running", where=self.cluster.prefix)
        return self._dir

    @property
    def conf(self) -> Path:
        return self.dir / "slurm.conf"

    @property
    def is_running(self) -> bool:
        return self._ctld_pidfd is not None

    def start(self) -> None:
        """Write slurm.conf, start slurmctld and every slurmd, wait (bounded) until all idle."""
        if self._was_started:
            raise ClusterError("a SlurmCluster starts only once", where=self.cluster.prefix)
        self._was_started = True
        if not self.cluster.is_running:
            raise ClusterError("the host cluster is not running", where=self.cluster.prefix)
        check_environment()
        atexit.register(self.stop)
        started = time.monotonic()
        deadline = started + self._start_timeout_s
        try:
            self._write_files()
            self._start_controller()
            for host in self.nodes:
                self._start_node(host)
            self._wait_controller_listens(deadline)
            self.wait_idle(max(0.1, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - started
        logger.info(
            "slurm on %s: %d nodes idle in %.3fs",
            self.cluster.prefix,
            len(self.nodes),
            self.start_s,
        )

    def stop(self) -> None:
        """Kill every Slurm process this started, by PID; unmount; remove the state dir."""
        started = time.monotonic()
        had_anything = self._dir is not None
        try:
            for client in self._clients:
                client.kill_group()
            if self._ctld_pidfd is not None:
                with contextlib.suppress(ProcessLookupError):
                    signal.pidfd_send_signal(self._ctld_pidfd, signal.SIGKILL)
                os.close(self._ctld_pidfd)
                self._ctld_pidfd = None
            if self._ctld_launcher is not None:  # --kill-child kills slurmctld if never adopted
                with contextlib.suppress(ProcessLookupError):
                    self._ctld_launcher.send_signal(signal.SIGKILL)
            for _, pid in self._slurmd.values():
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            for name in self._slurmd:
                self._kill_steps(name)
            for client in self._clients:
                reap(client.popen, timeout_s=5.0)
            self._clients.clear()
            if self._ctld_launcher is not None:
                reap(self._ctld_launcher, timeout_s=5.0)
                self._ctld_launcher = None
            self._ctld_pid = None
            for popen, _ in self._slurmd.values():
                reap(popen, timeout_s=5.0)
            self._slurmd.clear()
            for name in sorted(self._no_ssh):
                self.unblock_ssh(name)
            for name in sorted(self._mounted):
                self._unmount_cgroup(name)
        finally:
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None
            atexit.unregister(self.stop)
        if had_anything:
            self.stop_s = time.monotonic() - started
            logger.info("slurm on %s: down in %.3fs", self.cluster.prefix, self.stop_s)

    # ----------------------------------------------------------------- environment and clients

    def env(self) -> dict[str, str]:
        """What a client needs on top of a clean environment: only `SLURM_CONF`."""
        return {"SLURM_CONF": str(self.conf)}

    def client_env(self, base: Mapping[str, str] | None = None) -> dict[str, str]:
        """`base` (default: this process's environment) without inherited Slurm variables,
        plus env(): what a client started from this machine runs with."""
        source = os.environ if base is None else base
        kept = {k: v for k, v in source.items() if not k.startswith(_CLIENT_ENV_PREFIXES)}
        return {**kept, **self.env()}

    def run(
        self,
        argv: Sequence[str],
        host: HostName = None,
        *,
        timeout: float = 30,
        check: bool = False,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        cwd: str | Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a client command to completion, here (`host` None) or inside a host as a user
        there would. `env` adds variables; `cwd` defaults to dir (shared by every node).

        On timeout the command's process group is killed and `subprocess.TimeoutExpired`
        raised; with `check`, a non-zero exit raises CommandFailed.
        """
        where = self._where(host)
        workdir = str(cwd if cwd is not None else self.dir)
        if host is None:
            return _run_in_session(
                list(argv),
                where,
                timeout,
                check,
                {**self.client_env(), **(env or {})},
                input,
                workdir,
            )
        return self.cluster.run(
            host,
            self._host_argv(argv),
            timeout=timeout,
            check=check,
            env={**self.env(), **(env or {})},
            input=input,
            cwd=workdir,
        )

    def spawn(
        self,
        argv: Sequence[str],
        host: HostName = None,
        *,
        env: Mapping[str, str] | None = None,
        cwd: str | Path | None = None,
        stdout: int | None = subprocess.DEVNULL,
        stderr: int | None = subprocess.DEVNULL,
    ) -> SlurmClient:
        """Start a long-running client (e.g. `srun ... sleep 60`) in its own process group;
        stop() kills its group if it still runs."""
        workdir = str(cwd if cwd is not None else self.dir)
        if host is None:
            popen = subprocess.Popen(
                list(argv),
                stdin=subprocess.DEVNULL,
                stdout=stdout,
                stderr=stderr,
                env={**self.client_env(), **(env or {})},
                cwd=workdir,
                start_new_session=True,
            )
            client = SlurmClient(None, popen, popen.pid)
        else:
            proc = self.cluster.spawn(
                host,
                self._host_argv(argv),
                env={**self.env(), **(env or {})},
                cwd=workdir,
                stdout=stdout,
                stderr=stderr,
            )
            client = SlurmClient(proc.host, proc.popen, proc.pid)
        self._clients.append(client)
        return client

    def srun(
        self, *args: str, host: HostName = None, timeout: float = 30, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        return self.run(["srun", *args], host, timeout=timeout, check=check)

    def salloc(
        self, *args: str, host: HostName = None, timeout: float = 30, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        return self.run(["salloc", *args], host, timeout=timeout, check=check)

    def sbatch(
        self, *args: str, host: HostName = None, timeout: float = 30, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        return self.run(["sbatch", *args], host, timeout=timeout, check=check)

    def squeue(
        self, *args: str, host: HostName = None, timeout: float = 30, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        return self.run(["squeue", *args], host, timeout=timeout, check=check)

    def scancel(
        self, *args: str, host: HostName = None, timeout: float = 30, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        return self.run(["scancel", *args], host, timeout=timeout, check=check)

    def scontrol(
        self, *args: str, host: HostName = None, timeout: float = 30, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        return self.run(["scontrol", *args], host, timeout=timeout, check=check)

    def node_states(self) -> dict[str, str]:
        """Each node's state as sinfo reports it (`idle`, `alloc`, `mixed`, `down*`, ...)."""
        out = self.run(["sinfo", "-h", "-N", "-o", "%N %T"], timeout=10, check=True).stdout
        return dict(line.split(None, 1) for line in out.splitlines() if line.strip())

    def wait_idle(self, timeout_s: float = 10.0) -> None:
        """Wait (bounded) until every node is idle; raise with the daemons' logs otherwise."""
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        while True:
            self._check_daemons_alive()
            with contextlib.suppress(CommandFailed, subprocess.TimeoutExpired):
                states = self.node_states()
            if states and all(states.get(h.name) == "idle" for h in self.nodes):
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"nodes not idle after {timeout_s:.0f}s: {states or 'sinfo failed'}",
                    where=self.cluster.prefix,
                    hint=f"logs:\n{self._log_tails()}",
                )
            time.sleep(0.05)

    # ----------------------------------------------------------------- ssh blocking

    def block_ssh(self, host: ClusterHost | str) -> None:
        """Refuse (TCP reset) every connection to port 22 on the host: ssh to it fails at once,
        while Slurm's own traffic (6817, 6818, srun's ports) flows."""
        name = self.cluster.host(host).name
        ruleset = f"""
            add table inet {NO_SSH_TABLE}
            delete table inet {NO_SSH_TABLE}
            table inet {NO_SSH_TABLE} {{
              chain input {{
                type filter hook input priority -20; policy accept;
                tcp dport 22 reject with tcp reset
              }}
            }}
            """
        self.cluster.run(name, ["nft", "-f", "-"], input=ruleset, check=True)
        self._no_ssh.add(name)

    def block_ssh_all(self) -> None:
        for host in self.nodes:
            self.block_ssh(host)

    def unblock_ssh(self, host: ClusterHost | str) -> None:
        name = self.cluster.host(host).name
        if self.cluster.is_running:
            ruleset = f"add table inet {NO_SSH_TABLE}\ndelete table inet {NO_SSH_TABLE}\n"
            with contextlib.suppress(ClusterError, CommandFailed, subprocess.TimeoutExpired):
                self.cluster.run(name, ["nft", "-f", "-"], input=ruleset, check=True)
        self._no_ssh.discard(name)

    # ----------------------------------------------------------------- lookups

    @property
    def slurmctld_pid(self) -> int:
        if self._ctld_pid is None:
            raise ClusterError("slurmctld is not running", where=self.cluster.prefix)
        return self._ctld_pid

    def slurmd_pid(self, host: ClusterHost | str) -> int:
        """Root-namespace PID of the host's slurmd."""
        return self._slurmd[self.cluster.host(host).name][1]

    def started_pids(self) -> list[int]:
        """Every PID this started in the root namespace's numbering: launchers, daemons,
        clients (for teardown checks)."""
        pids = [p.pid for p, _ in self._slurmd.values()]
        pids += [pid for _, pid in self._slurmd.values()]
        pids += [c.pid for c in self._clients]
        if self._ctld_launcher is not None:
            pids.append(self._ctld_launcher.pid)
        if self._ctld_pid is not None:
            pids.append(self._ctld_pid)
        return pids

    def log(self, host: ClusterHost | str | None = None) -> str:
        """slurmctld's log, or the host's slurmd log."""
        name = "slurmctld" if host is None else f"slurmd.{self.cluster.host(host).name}"
        if self._dir is None:
            return ""
        try:
            return (self._dir / f"{name}.log").read_text(errors="replace")
        except FileNotFoundError:
            return ""

    # ----------------------------------------------------------------- internals

    def _where(self, host: HostName) -> str:
        return "controller machine" if host is None else self.cluster.host(host).name

    def _host_argv(self, argv: Sequence[str]) -> list[str]:
        """Inside a host, drop the Slurm variables this process inherited (nsenter passes its
        environment on), so the client sees only env()."""
        inherited = sorted(k for k in os.environ if k.startswith(_CLIENT_ENV_PREFIXES))
        if not inherited:
            return list(argv)
        return ["env", *(f"--unset={k}" for k in inherited), *argv]

    def _write_files(self) -> None:
        self._dir = self.cluster.workdir / "slurm"
        self._dir.mkdir()
        (self._dir / "state").mkdir()
        for host in self.nodes:
            (self._dir / "spool" / host.name).mkdir(parents=True)
        (self._dir / "hosts").write_text(
            f"127.0.0.1\tlocalhost\n{BRIDGE_ADDRESS}\t{self.controller_name}\n"
        )
        self.conf.write_text(
            _slurm_conf(
                self.cluster.prefix,
                self.controller_name,
                self._dir,
                self.nodes,
                self.cpus_per_node,
                self.extra_conf,
            )
        )

    def _start_controller(self) -> None:
        """slurmctld as PID 1 of its own PID, UTS and mount namespaces (see the module doc)."""
        q = shlex.quote
        d = self.dir
        script = "\n".join(
            [
                "set -e",
                f"hostname {q(self.controller_name)}",
                f"mount --bind {q(str(d / 'hosts'))} /etc/hosts",
                f"exec {SLURMCTLD} -D -f {q(str(self.conf))}",
            ]
        )
        argv = [
            "unshare", "--pid", "--fork", "--mount-proc", "--uts", "--mount",
            "--kill-child=SIGKILL", "sh", "-c", script,
        ]  # fmt: skip
        if threading.current_thread() is threading.main_thread():
            argv = ["setpriv", "--pdeathsig", "KILL", *argv]  # dies with this process
        with open(d / "slurmctld.out", "ab") as out:
            self._ctld_launcher = subprocess.Popen(
                argv,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=out,
                env={**self.client_env(), "SLURM_CONF": str(self.conf)},
                start_new_session=True,
            )

    def _start_node(self, host: ClusterHost) -> None:
        name = host.name
        p = self.cluster.prefix
        script = (
            f"set -e; mount -t tmpfs -o mode=0755,size=1m {p}-cgroup /sys/fs/cgroup; "
            "mkdir /sys/fs/cgroup/systemd; "
            f"mount -t cgroup -o none,name={p} {p}-cgroup /sys/fs/cgroup/systemd"
        )
        self.cluster.run(name, script, check=True)
        self._mounted.add(name)
        with open(self.dir / f"slurmd.{name}.out", "ab") as out:
            proc = self.cluster.spawn(
                name,
                self._host_argv([SLURMD, "-D", "-f", str(self.conf), "-N", name]),
                env=self.env(),
                cwd=str(self.dir),
                stdout=out,
                stderr=out,
            )
        self._slurmd[name] = (proc.popen, proc.pid)

    def _wait_controller_listens(self, deadline: float) -> None:
        """Adopt slurmctld (the launcher's child) and wait until it listens on the bridge."""
        assert self._ctld_launcher is not None
        while True:
            if self._ctld_launcher.poll() is not None:
                raise ClusterError(
                    f"slurmctld exited during start (status {self._ctld_launcher.returncode})",
                    where=self.cluster.prefix,
                    hint=f"logs:\n{self._log_tails()}",
                )
            if self._ctld_pid is None:
                kids = _children_of(self._ctld_launcher.pid)
                if kids:
                    self._ctld_pidfd = os.pidfd_open(kids[0])
                    self._ctld_pid = kids[0]
            if (
                self._ctld_pid is not None
                and _exe(self._ctld_pid) == os.path.realpath(SLURMCTLD)  # a Debian alternative
                and _listens(self._ctld_pid, BRIDGE_ADDRESS, CONTROLLER_PORT)
            ):
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"slurmctld did not listen on {BRIDGE_ADDRESS}:{CONTROLLER_PORT} in time",
                    where=self.cluster.prefix,
                    hint=f"logs:\n{self._log_tails()}",
                )
            time.sleep(0.01)

    def _check_daemons_alive(self) -> None:
        dead = [n for n, (popen, _) in self._slurmd.items() if popen.poll() is not None]
        if self._ctld_launcher is not None and self._ctld_launcher.poll() is not None:
            dead.insert(0, "slurmctld")
        if dead:
            raise ClusterError(
                f"{', '.join(dead)} exited", where=self.cluster.prefix, hint=self._log_tails()
            )

    def _kill_steps(self, name: str) -> None:
        """SIGKILL what slurmd left on the host (slurmstepd and tasks), until none is left: a
        stepd killed mid-launch may have forked a task after the previous sweep."""
        if not self.cluster.is_running:
            return  # the host is gone, and everything on it with it
        for _ in range(5):
            try:
                found = [p for p in self.cluster.host_pids(name) if self._is_leftover(p)]
            except ClusterError:
                return  # the host was stopped
            if not found:
                return
            for pid in found:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.01)

    def _is_leftover(self, pid: int) -> bool:
        """slurmstepd (its environment is empty), or a task (srun exports SLURM_CONF)."""
        if _exe(pid) == os.path.realpath(SLURMSTEPD):
            return True
        try:
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False
        return f"SLURM_CONF={self.conf}".encode() in environ

    def _unmount_cgroup(self, name: str) -> None:
        if self.cluster.is_running:
            script = "umount /sys/fs/cgroup/systemd; umount /sys/fs/cgroup"
            with contextlib.suppress(ClusterError, subprocess.TimeoutExpired):
                self.cluster.run(name, script)
        self._mounted.discard(name)

    def _log_tails(self, chars: int = 1500) -> str:
        parts = []
        for label, host in [("slurmctld", None), *((h.name, h) for h in self.nodes)]:
            text = self.log(host)
            if host is None and self._dir is not None:
                with contextlib.suppress(FileNotFoundError):
                    text += (self._dir / "slurmctld.out").read_text(errors="replace")
            parts.append(f"[{label}] {text[-chars:].strip()}")
        return "\n".join(parts)


def check_environment() -> None:
    """Raise with what to install unless the Slurm daemons and clients are here."""
    missing = []
    if not os.access(SLURMCTLD, os.X_OK):
        missing.append("slurmctld")
    if not os.access(SLURMD, os.X_OK):
        missing.append("slurmd")
    if any(shutil.which(tool) is None for tool in CLIENTS):
        missing.append("slurm-client")
    if missing:
        raise ClusterError(
            f"missing Slurm packages for the test cluster: {', '.join(missing)}",
            hint=f"apt-get install -y {' '.join(missing)} (scripts/test.sh does)",
        )


def _slurm_conf(
    cluster_name: str,
    controller_name: str,
    d: Path,
    nodes: Sequence[ClusterHost],
    cpus: int,
    extra: str,
) -> str:
    partition = f"PartitionName={PARTITION} Nodes=ALL Default=YES MaxTime=INFINITE State=UP"
    partition += " OverSubscribe=YES"  # steps may share CPUs (srun --overlap, several sruns)
    node_lines = "".join(
        f"NodeName={h.name} NodeAddr={h.address} CPUs={cpus} State=UNKNOWN\n" for h in nodes
    )
    return f"""\
ClusterName={cluster_name}
SlurmctldHost={controller_name}({BRIDGE_ADDRESS})
SlurmctldPort={CONTROLLER_PORT}
SlurmdPort={NODE_PORT}
CommunicationParameters=NoCtldInAddrAny
SlurmUser=root
SlurmdUser=root
AuthType=auth/none
CredType=cred/none
ProctrackType=proctrack/pgid
TaskPlugin=task/none
JobAcctGatherType=jobacct_gather/none
AccountingStorageType=accounting_storage/none
SelectType=select/cons_tres
SelectTypeParameters=CR_CPU
MpiDefault=none
MailProg=/bin/true
ReturnToService=2
SlurmdParameters=config_overrides
KillWait=5
StateSaveLocation={d / "state"}
SlurmctldPidFile={d / "slurmctld.pid"}
SlurmctldLogFile={d / "slurmctld.log"}
SlurmdSpoolDir={d / "spool"}/%n
SlurmdPidFile={d}/slurmd.%n.pid
SlurmdLogFile={d}/slurmd.%n.log
{node_lines}{partition}
{extra}"""


def _run_in_session(
    argv: list[str],
    where: str,
    timeout: float,
    check: bool,
    env: dict[str, str],
    input: str | None,
    cwd: str,
) -> subprocess.CompletedProcess[str]:
    proc = subprocess.Popen(
        argv,
        stdin=subprocess.PIPE if input is not None else subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        cwd=cwd,
        start_new_session=True,
    )
    try:
        out, err = proc.communicate(input, timeout=timeout)
    except subprocess.TimeoutExpired:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(proc.pid, signal.SIGKILL)
        out, err = proc.communicate()
        raise subprocess.TimeoutExpired(argv, timeout, out, err) from None
    completed = subprocess.CompletedProcess(argv, proc.returncode, out, err)
    if check and completed.returncode != 0:
        raise CommandFailed(where, completed)
    return completed


def _pid_state(pid: int) -> str | None:
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()[0]


def _children_of(parent: int) -> list[int]:
    kids = []
    for name in os.listdir("/proc"):
        if not name.isdigit():
            continue
        try:
            text = Path(f"/proc/{name}/stat").read_text()
        except OSError:
            continue
        if int(text[text.rindex(")") + 2 :].split()[1]) == parent:
            kids.append(int(name))
    return kids


def _exe(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/exe")
    except OSError:
        return None


def _listens(pid: int, address: str, port: int) -> bool:
    """True if a TCP socket in `pid`'s network namespace listens on address:port exactly."""
    packed = socket.inet_aton(address)
    want = f"{int.from_bytes(packed, 'little'):08X}:{port:04X}"
    try:
        lines = Path(f"/proc/{pid}/net/tcp").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(line.split()[1] == want and line.split()[3] == "0A" for line in lines)
