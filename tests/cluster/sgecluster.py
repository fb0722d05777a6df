"""A real Grid Engine cluster on top of a running netcluster.Cluster, for tests and benchmarks.

sge_qmaster runs inside the first host (which is also an execution host, as on a small real
cluster); one sge_execd runs inside every host (its net, PID, mount, UTS and IPC namespaces), so
a job's tasks see their own host's name, address and processes. Debian 12's gridengine 8.1.9,
classic security mode, berkeleydb spooling, a parallel environment `dtrain` with
`control_slaves TRUE`, `job_is_first_task FALSE` and a queue `all.q` on every host.

This module owns SGE_ROOT (`<cluster workdir>/sge`: the cell, the spool, the job files), the
daemons, every job and task they started (swept at stop) and nothing else. A plain library like
netcluster: standard library only, never pytest. Needs the Debian packages gridengine-master,
gridengine-exec and gridengine-client (preseeded: see scripts/test.sh).

Facts a later user needs (8.1.9 in these namespaces, measured):

- Every daemon and client needs a hostname that resolves to its own address: each host's UTS
  namespace and /etc/hosts give that. Clients run only inside a host (run(), spawn()); from
  the root namespace they cannot resolve themselves. env() is what they need.
- `min_uid 0` is in the global configuration before any execd starts: root's jobs are refused
  otherwise, and changing it later leaves the queue in state E.
- The daemons run with `SGE_ND=1` (no daemonizing) under a clean environment: jobs inherit the
  execd's environment. Each execd's spool is `<spool>/execd/<host>` (SGE adds the hostname);
  the queue's tmpdir is /srv/sge-tmp, the host's private disk (a shared tmpdir is deleted by
  the first host to finish).
- A job's processes carry `SGE_ROOT=<this cluster's root>` in their environment (the execd's),
  including a child that setsid'd away (which survives qdel when root owns the job): stop()
  sweeps them by that, on every host, by PID.
- `qsub -sync y` exits 0 after "Unable to run job": submit() and wait() read the outcome from
  qacct instead (accounting flushed every second here).
"""

from __future__ import annotations

import atexit
import contextlib
import logging
import os
import pwd
import re
import shutil
import signal
import subprocess
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path
from types import TracebackType

from .netcluster import Cluster, ClusterError, ClusterHost, CommandFailed, HostProcess, reap

logger = logging.getLogger(__name__)

SGE_LIB = Path("/var/lib/gridengine")  # bin, lib, utilbin by architecture
SGE_SHARE = Path("/usr/share/gridengine")
SGE_BIN = Path("/usr/lib/gridengine")  # the real binaries (/usr/bin's are wrappers)
QMASTER = SGE_BIN / "sge_qmaster"
EXECD = SGE_BIN / "sge_execd"
SHEPHERD = SGE_BIN / "sge_shepherd"
ADMIN_USER = "sgeadmin"
ARCH = "lx-amd64"
CELL = "dtrain"
PE = "dtrain"
QUEUE = "all.q"
QMASTER_PORT = 6444  # inside the first host's network namespace
EXECD_PORT = 6445  # inside each host's
SLOTS_PER_HOST = 4
HOST_TMPDIR = "/srv/sge-tmp"  # /srv is each host's private disk
CLIENTS = ("qsub", "qstat", "qdel", "qconf", "qrsh", "qacct", "qhost")
# Variables a client reads from its environment: inherited ones (the suite itself running in
# an SGE job) would point every client at the wrong cluster or job.
_CLIENT_ENV = re.compile(r"^(SGE_\w+|JOB_ID|JOB_NAME|PE|PE_HOSTFILE|NSLOTS|NHOSTS|QUEUE|TMPDIR)$")
_CLEAN_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"

HostName = ClusterHost | str | None  # None: the master host (the first)


@dataclass(frozen=True)
class JobOutcome:
    """What qacct says of a finished job: `exit_status` and `failed` (0 when SGE itself did
    not fail it), plus the job script's stdout and stderr files."""

    job_id: str
    exit_status: int
    failed: str
    stdout: str
    stderr: str


class SgeCluster:
    """sge_qmaster on the first host plus one sge_execd per host of a running `Cluster`.

    start() waits (bounded) until every queue instance takes jobs; stop() kills every daemon,
    job and task it started, by PID, and removes the SGE root; safe twice, runs from atexit.
    The Cluster itself stays up.
    """

    def __init__(
        self,
        cluster: Cluster,
        *,
        slots_per_host: int = SLOTS_PER_HOST,
        control_slaves: bool = True,
        start_timeout_s: float = 30.0,
    ) -> None:
        self.cluster = cluster
        self.slots_per_host = slots_per_host
        self.control_slaves = control_slaves
        self._start_timeout_s = start_timeout_s
        self._dir: Path | None = None
        self._qmaster: HostProcess | None = None
        self._execd: dict[str, HostProcess] = {}
        self._clients: list[HostProcess] = []
        self._was_started = False
        self._jobs = 0
        self.start_s: float | None = None
        self.stop_s: float | None = None

    # ----------------------------------------------------------------- lifecycle

    def __enter__(self) -> SgeCluster:
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
        return f"<SgeCluster {self.cluster.prefix} {len(self.hosts)} hosts>"

    @property
    def hosts(self) -> tuple[ClusterHost, ...]:
        """The execution hosts: the cluster's hosts (h1..hN); h1 runs sge_qmaster too."""
        return self.cluster.hosts

    @property
    def master(self) -> ClusterHost:
        return self.hosts[0]

    @property
    def dir(self) -> Path:
        """SGE_ROOT: the cell, spool, logs and job files; removed by stop()."""
        if self._dir is None:
            raise ClusterError("the SGE cluster is not running", where=self.cluster.prefix)
        return self._dir

    @property
    def is_running(self) -> bool:
        return self._qmaster is not None and self._qmaster.is_alive()

    def start(self) -> None:
        """Write the cell, start qmaster, configure it, start every execd, wait until ready."""
        if self._was_started:
            raise ClusterError("an SgeCluster starts only once", where=self.cluster.prefix)
        self._was_started = True
        if not self.cluster.is_running:
            raise ClusterError("the host cluster is not running", where=self.cluster.prefix)
        check_environment()
        atexit.register(self.stop)
        started = time.monotonic()
        deadline = started + self._start_timeout_s
        try:
            self._write_files()
            self._qmaster = self._start_daemon(self.master, QMASTER, "qmaster")
            self._wait_qmaster(deadline)
            self._configure()
            for host in self.hosts:
                self._execd[host.name] = self._start_daemon(host, EXECD, f"execd.{host.name}")
            self.wait_ready(max(0.1, deadline - time.monotonic()))
        except BaseException:
            self.stop()
            raise
        self.start_s = time.monotonic() - started
        logger.info(
            "sge on %s: %d hosts ready in %.3fs", self.cluster.prefix, len(self.hosts), self.start_s
        )

    def stop(self) -> None:
        """Kill every daemon, client, job and task this started, by PID; remove SGE_ROOT."""
        started = time.monotonic()
        had_anything = self._dir is not None
        try:
            for proc in [*self._clients, *self._execd.values()]:
                proc.kill()
            if self._qmaster is not None:
                self._qmaster.kill()
            for host in self.hosts:
                self._sweep(host.name)
            for proc in [*self._clients, *self._execd.values()]:
                reap(proc.popen, timeout_s=5.0)
            if self._qmaster is not None:
                reap(self._qmaster.popen, timeout_s=5.0)
            self._clients.clear()
            self._execd.clear()
            self._qmaster = None
        finally:
            if self._dir is not None:
                shutil.rmtree(self._dir, ignore_errors=True)
                self._dir = None
            atexit.unregister(self.stop)
        if had_anything:
            self.stop_s = time.monotonic() - started
            logger.info("sge on %s: down in %.3fs", self.cluster.prefix, self.stop_s)

    # ----------------------------------------------------------------- environment and clients

    def env(self) -> dict[str, str]:
        """What a client (and every daemon, so every job) needs: the root, cell and ports."""
        return {
            "SGE_ROOT": str(self.dir),
            "SGE_CELL": CELL,
            "SGE_ARCH": ARCH,
            "SGE_QMASTER_PORT": str(QMASTER_PORT),
            "SGE_EXECD_PORT": str(EXECD_PORT),
        }

    def run(
        self,
        argv: Sequence[str] | str,
        host: HostName = None,
        *,
        timeout: float = 30,
        check: bool = False,
        env: Mapping[str, str] | None = None,
        input: str | None = None,
        cwd: str | Path | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Run a client inside a host (default: the master) as a user there would; `env` adds
        variables, `cwd` defaults to SGE_ROOT's job dir (shared by every host)."""
        name = self.cluster.host(host).name if host is not None else self.master.name
        return self.cluster.run(
            name,
            self._host_argv(argv),
            timeout=timeout,
            check=check,
            env={**self.env(), **(env or {})},
            input=input,
            cwd=str(cwd if cwd is not None else self.jobs_dir),
        )

    def spawn(
        self,
        argv: Sequence[str] | str,
        host: HostName = None,
        *,
        env: Mapping[str, str] | None = None,
        stdout: int | None = subprocess.DEVNULL,
        stderr: int | None = subprocess.DEVNULL,
    ) -> HostProcess:
        """Start a long-running client (e.g. `qsub -sync y`) inside a host; stop() kills it."""
        name = self.cluster.host(host).name if host is not None else self.master.name
        proc = self.cluster.spawn(
            name,
            self._host_argv(argv),
            env={**self.env(), **(env or {})},
            cwd=str(self.jobs_dir),
            stdout=stdout,
            stderr=stderr,
        )
        self._clients.append(proc)
        return proc

    @property
    def jobs_dir(self) -> Path:
        """Where job scripts and their output files go (shared by every host)."""
        return self.dir / "jobs"

    def write_script(self, body: str, name: str | None = None) -> Path:
        """A job script file under jobs_dir, `#!/bin/sh` plus `body`."""
        self._jobs += 1
        path = self.jobs_dir / (name or f"job{self._jobs}.sh")
        path.write_text(f"#!/bin/sh\n{body}\n")
        path.chmod(0o755)
        return path

    def submit(
        self,
        body: str,
        slots: int,
        *,
        pe: str = PE,
        extra: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        host: HostName = None,
        cwd: str | Path | None = None,
    ) -> str:
        """qsub a script of `body` as a `-pe PE slots` job (`slots` 0: no PE) from `cwd`
        (default jobs_dir), where it runs; its id. Its output goes to jobs_dir/<name>.o<id>
        and .e<id> (see wait())."""
        return self.submit_script(
            self.write_script(body), slots, pe=pe, extra=extra, env=env, host=host, cwd=cwd
        )

    def submit_script(
        self,
        script: Path,
        slots: int,
        *,
        pe: str = PE,
        extra: Sequence[str] = (),
        env: Mapping[str, str] | None = None,
        host: HostName = None,
        cwd: str | Path | None = None,
    ) -> str:
        """qsub an existing script file, as submit() does (its own `#$` lines count, and the
        options given here override them)."""
        out = f"{self.jobs_dir}/"
        argv = ["qsub", "-terse", "-cwd", "-N", script.stem, "-o", out, "-e", out]
        if slots:
            argv += ["-pe", pe, str(slots)]
        done = self.run([*argv, *extra, str(script)], host, check=True, env=env, cwd=cwd)
        job_id = done.stdout.strip().split(".")[0]
        if not job_id.isdigit():
            raise ClusterError(f"qsub printed no job id: {done.stdout!r} {done.stderr!r}")
        return job_id

    def job_state(self, job_id: str) -> str | None:
        """The job's state letters as qstat shows them (`qw`, `r`, `dr`, ...); None once gone."""
        out = self.run(["qstat", "-u", "*"], timeout=10, check=True).stdout
        for line in out.splitlines():
            words = line.split()
            if words and words[0] == job_id:
                return words[4]
        return None

    def wait_state(self, job_id: str, state: str, timeout_s: float = 30.0) -> None:
        """Wait (bounded) until the job shows `state` (e.g. "r")."""
        deadline = time.monotonic() + timeout_s
        seen: str | None = None
        while True:
            seen = self.job_state(job_id)
            if seen == state:
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"job {job_id} is {seen or 'gone'}, not {state}, after {timeout_s:.0f}s",
                    where=self.cluster.prefix,
                    hint=self._log_tails(),
                )
            time.sleep(0.2)

    def wait(self, job_id: str, timeout_s: float = 60.0) -> JobOutcome:
        """Wait (bounded) until the job has left the queue and is accounted; its outcome.

        On timeout the job is deleted (qdel -f) before raising: a job larger than what the PE
        offers would otherwise stay queued forever.
        """
        deadline = time.monotonic() + timeout_s
        while True:
            if self.job_state(job_id) is None:
                outcome = self._accounted(job_id)
                if outcome is not None:
                    return outcome
            if time.monotonic() > deadline:
                state = self.job_state(job_id)
                with contextlib.suppress(CommandFailed, subprocess.TimeoutExpired):
                    self.run(["qdel", "-f", job_id], timeout=10)
                raise ClusterError(
                    f"job {job_id} did not finish within {timeout_s:.0f}s "
                    f"(state {state or 'gone, not accounted'}); deleted",
                    where=self.cluster.prefix,
                    hint=self._log_tails(),
                )
            time.sleep(0.2)

    def qdel(self, job_id: str) -> None:
        self.run(["qdel", job_id], timeout=10, check=True)

    def _accounted(self, job_id: str) -> JobOutcome | None:
        done = self.run(["qacct", "-j", job_id], timeout=10)
        if done.returncode != 0:
            return None
        fields: dict[str, str] = {}
        for line in done.stdout.splitlines():
            key, _, value = line.partition(" ")
            fields.setdefault(key, value.strip())
        name = fields.get("jobname", "")
        return JobOutcome(
            job_id=job_id,
            exit_status=int(fields.get("exit_status", "-1").split()[0]),
            failed=fields.get("failed", ""),
            stdout=_read(self.jobs_dir / f"{name}.o{job_id}"),
            stderr=_read(self.jobs_dir / f"{name}.e{job_id}"),
        )

    def queue_states(self) -> dict[str, str]:
        """Each queue instance's state letters (`` when fine; `u` unknown, `E` error, ...)."""
        out = self.run(["qstat", "-f", "-q", QUEUE], timeout=10, check=True).stdout
        states: dict[str, str] = {}
        for line in out.splitlines():
            words = line.split()
            if words and words[0].startswith(f"{QUEUE}@"):
                host = words[0].split("@", 1)[1]
                states[host] = words[5] if len(words) > 5 else ""
        return states

    def wait_ready(self, timeout_s: float = 20.0) -> None:
        """Wait (bounded) until every host's queue instance has no state flag (takes jobs)."""
        deadline = time.monotonic() + timeout_s
        states: dict[str, str] = {}
        while True:
            self._check_daemons_alive()
            with contextlib.suppress(CommandFailed, subprocess.TimeoutExpired):
                states = self.queue_states()
            if states and all(states.get(h.name, "?") == "" for h in self.hosts):
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"queue instances not ready after {timeout_s:.0f}s: {states or 'qstat failed'}",
                    where=self.cluster.prefix,
                    hint=f"logs:\n{self._log_tails()}",
                )
            time.sleep(0.1)

    # ----------------------------------------------------------------- lookups

    def execd_pid(self, host: ClusterHost | str) -> int:
        """Root-namespace PID of the host's sge_execd."""
        return self._execd[self.cluster.host(host).name].pid

    def job_pids(self, host: ClusterHost | str) -> list[int]:
        """Root-namespace PIDs on the host that belong to SGE's jobs: shepherds, and every
        process with this cluster's SGE_ROOT in its environment but the daemons."""
        name = self.cluster.host(host).name
        daemons = {p.pid for p in [*self._execd.values(), self._qmaster] if p is not None}
        daemons |= {p.pid for p in self._clients}
        return [p for p in self.cluster.host_pids(name) if p not in daemons and self._is_ours(p)]

    def started_pids(self) -> list[int]:
        """Every daemon and client PID this started (root namespace), for teardown checks."""
        procs = [*self._execd.values(), *self._clients]
        if self._qmaster is not None:
            procs.append(self._qmaster)
        return [p.pid for p in procs]

    def log(self, host: ClusterHost | str | None = None) -> str:
        """The qmaster's messages file, or the host's execd messages."""
        if self._dir is None:
            return ""
        if host is None:
            path = self._dir / "spool" / "qmaster" / "messages"
        else:
            path = self._dir / "spool" / "execd" / self.cluster.host(host).name / "messages"
        return _read(path)

    # ----------------------------------------------------------------- internals

    def _host_argv(self, argv: Sequence[str] | str) -> list[str]:
        """Inside a host, drop the SGE variables this process inherited (nsenter passes its
        environment on), so the client sees only env()."""
        command = ["sh", "-c", argv] if isinstance(argv, str) else list(argv)
        inherited = sorted(k for k in os.environ if _CLIENT_ENV.match(k))
        return ["env", *(f"--unset={k}" for k in inherited), *command]

    def _write_files(self) -> None:
        """SGE_ROOT with the cell's bootstrap, the spool (owned by the admin user), and the
        qmaster's initial configuration through spoolinit/spooldefaults."""
        admin = pwd.getpwnam(ADMIN_USER)
        # The admin user must traverse the cluster's (0700) temp dir to reach its spool.
        self.cluster.workdir.chmod(0o711)
        root = self._dir = self.cluster.workdir / "sge"
        root.mkdir()
        for name in ("bin", "lib", "utilbin"):
            (root / name).symlink_to(SGE_LIB / name)
        (root / "util").symlink_to(SGE_SHARE / "util")
        common = root / CELL / "common"
        common.mkdir(parents=True)
        spool = root / "spool"
        for sub in ("qmaster", "db", "execd"):
            (spool / sub).mkdir(parents=True)
        (root / "jobs").mkdir(mode=0o777)
        (root / "jobs").chmod(0o1777)
        (common / "bootstrap").write_text(_bootstrap(spool))
        (common / "act_qmaster").write_text(f"{self.master.name}\n")
        (common / "configuration.init").write_text(_global_configuration(spool / "execd"))
        for path in (common, *common.iterdir(), spool, *spool.iterdir()):
            os.chown(path, admin.pw_uid, admin.pw_gid)
        for host in self.hosts:
            tmp = self.cluster.private_dir(host) / HOST_TMPDIR.removeprefix("/srv/")
            tmp.mkdir(exist_ok=True)
            tmp.chmod(0o1777)
        util = SGE_SHARE / "util" / "resources"
        steps = [
            ["spoolinit", "berkeleydb", "libspoolb", str(spool / "db"), "init"],
            ["spooldefaults", "configuration", str(common / "configuration.init")],
            ["spooldefaults", "complexes", str(util / "centry")],
            ["spooldefaults", "usersets", str(util / "usersets")],
            ["spooldefaults", "managers", ADMIN_USER, "root"],
        ]
        for step in steps:
            argv = ["setpriv", f"--reuid={admin.pw_uid}", f"--regid={admin.pw_gid}"]
            argv += ["--clear-groups", str(SGE_BIN / step[0]), *step[1:]]
            self.run(argv, check=True, cwd=root)

    def _start_daemon(self, host: ClusterHost, binary: Path, log_name: str) -> HostProcess:
        """One daemon in the foreground (SGE_ND) with a clean environment: jobs inherit it."""
        argv = ["env", "-i", f"PATH={_CLEAN_PATH}", "SGE_ND=1"]
        argv += [f"{k}={v}" for k, v in self.env().items()]
        with open(self.dir / f"{log_name}.out", "ab") as out:
            proc = self.cluster.spawn(
                host, [*argv, str(binary)], cwd=str(self.dir), stdout=out, stderr=out
            )
        return proc

    def _wait_qmaster(self, deadline: float) -> None:
        """Until qconf gets an answer from the qmaster."""
        while True:
            self._check_daemons_alive()
            done = self.run(["qconf", "-sh"], timeout=10)
            if done.returncode == 0:
                return
            if time.monotonic() > deadline:
                raise ClusterError(
                    f"sge_qmaster did not answer in time: {done.stderr.strip()}",
                    where=self.cluster.prefix,
                    hint=f"logs:\n{self._log_tails()}",
                )
            time.sleep(0.1)

    def _configure(self) -> None:
        """Scheduler intervals, the parallel environment and the queue (full definitions)."""
        files = self.dir / "conf"
        files.mkdir()
        names = " ".join(h.name for h in self.hosts)
        (files / "sched").write_text(_SCHEDULER)
        (files / PE).write_text(_pe(PE, self.control_slaves))
        (files / QUEUE).write_text(_queue(QUEUE, names, PE, self.slots_per_host))
        # An execd started on an admin host registers itself as an execution host.
        self.run(["qconf", "-ah", names.replace(" ", ",")], check=True)
        self.run(["qconf", "-as", names.replace(" ", ",")], check=True)
        self.run(["qconf", "-Msconf", str(files / "sched")], check=True)
        self.run(["qconf", "-Ap", str(files / PE)], check=True)
        self.run(["qconf", "-Aq", str(files / QUEUE)], check=True)

    def _check_daemons_alive(self) -> None:
        dead = [n for n, p in self._execd.items() if p.popen.poll() is not None]
        if self._qmaster is not None and self._qmaster.popen.poll() is not None:
            dead.insert(0, "sge_qmaster")
        if dead:
            raise ClusterError(
                f"{', '.join(dead)} exited", where=self.cluster.prefix, hint=self._log_tails()
            )

    def _sweep(self, name: str) -> None:
        """SIGKILL what SGE left on the host (shepherds, jobs, tasks, setsid'd children),
        until none is left."""
        if not self.cluster.is_running or self._dir is None:
            return
        for _ in range(5):
            try:
                found = [p for p in self.cluster.host_pids(name) if self._is_ours(p)]
            except ClusterError:
                return  # the host was stopped, and everything on it with it
            if not found:
                return
            for pid in found:
                with contextlib.suppress(ProcessLookupError):
                    os.kill(pid, signal.SIGKILL)
            time.sleep(0.02)

    def _is_ours(self, pid: int) -> bool:
        """A shepherd, or a process with this cluster's SGE_ROOT in its environment."""
        try:
            if os.readlink(f"/proc/{pid}/exe") == str(SHEPHERD):
                return True
            environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
        except OSError:
            return False
        return f"SGE_ROOT={self._dir}".encode() in environ

    def _log_tails(self, chars: int = 1500) -> str:
        parts = [f"[qmaster] {self.log()[-chars:].strip()}"]
        if self._dir is not None:
            parts.append(f"[qmaster.out] {_read(self._dir / 'qmaster.out')[-chars:].strip()}")
        parts += [f"[{h.name}] {self.log(h)[-chars:].strip()}" for h in self.hosts]
        return "\n".join(parts)


def check_environment() -> None:
    """Raise with what to install unless the Grid Engine daemons and clients are here."""
    missing = []
    if not os.access(QMASTER, os.X_OK):
        missing.append("gridengine-master")
    if not os.access(EXECD, os.X_OK):
        missing.append("gridengine-exec")
    if any(shutil.which(tool) is None for tool in CLIENTS):
        missing.append("gridengine-client")
    try:
        pwd.getpwnam(ADMIN_USER)
    except KeyError:
        missing.append("gridengine-common")
    if missing:
        raise ClusterError(
            f"missing Grid Engine packages for the test cluster: {', '.join(missing)}",
            hint="preseed shared/gridengineconfig false, then apt-get install -y "
            f"{' '.join(missing)} (scripts/test.sh does)",
        )


def _bootstrap(spool: Path) -> str:
    return f"""\
# Version: 8.1.9
admin_user              {ADMIN_USER}
default_domain          none
ignore_fqdn             true
spooling_method         berkeleydb
spooling_lib            libspoolb
spooling_params         {spool / "db"}
binary_path             {SGE_BIN}
qmaster_spool_dir       {spool / "qmaster"}
security_mode           none
listener_threads        2
worker_threads          2
scheduler_threads       1
jvm_threads             0
"""


def _global_configuration(execd_spool: Path) -> str:
    """Debian's default configuration with what these tests need (see the module doc)."""
    text = (SGE_SHARE / "default-configuration").read_text()
    changes = {
        "execd_spool_dir": str(execd_spool),
        "mailer": "/bin/true",
        "xterm": "/bin/true",
        "min_uid": "0",
        "min_gid": "0",
        "load_report_time": "00:00:05",
        "execd_params": "ENABLE_ADDGRP_KILL=TRUE",
        "reporting_params": (
            "accounting=true reporting=false flush_time=00:00:01 joblog=false sharelog=00:00:00"
        ),
    }
    lines = []
    for line in text.splitlines():
        key = line.split(None, 1)[0] if line.strip() else ""
        lines.append(f"{key:<22} {changes.pop(key)}" if key in changes else line)
    lines += [f"{key:<22} {value}" for key, value in changes.items()]
    return "\n".join(lines) + "\n"


_SCHEDULER = """\
algorithm                         default
schedule_interval                 0:0:1
maxujobs                          0
queue_sort_method                 load
job_load_adjustments              NONE
load_adjustment_decay_time        0:0:0
load_formula                      np_load_avg
schedd_job_info                   true
flush_submit_sec                  1
flush_finish_sec                  1
params                            none
reprioritize_interval             0:0:0
halftime                          168
usage_weight_list                 cpu=1.000000,mem=0.000000,io=0.000000
compensation_factor               5.000000
weight_user                       0.250000
weight_project                    0.250000
weight_department                 0.250000
weight_job                        0.250000
weight_tickets_functional         0
weight_tickets_share              0
share_override_tickets            TRUE
share_functional_shares           TRUE
max_functional_jobs_to_schedule   200
report_pjob_tickets               TRUE
max_pending_tasks_per_job         50
halflife_decay_list               none
policy_hierarchy                  OFS
weight_ticket                     0.010000
weight_waiting_time               0.000000
weight_deadline                   3600000.000000
weight_urgency                    0.100000
weight_priority                   1.000000
max_reservation                   0
default_duration                  INFINITY
"""


def _pe(name: str, control_slaves: bool) -> str:
    return f"""\
pe_name            {name}
slots              999
user_lists         NONE
xuser_lists        NONE
start_proc_args    NONE
stop_proc_args     NONE
allocation_rule    $round_robin
control_slaves     {"TRUE" if control_slaves else "FALSE"}
job_is_first_task  FALSE
urgency_slots      min
accounting_summary TRUE
qsort_args         NONE
"""


def _queue(name: str, hosts: str, pe: str, slots: int) -> str:
    limits = "".join(
        f"{kind}_{what:<19} INFINITY\n"
        for what in ("rt", "cpu", "fsize", "data", "stack", "core", "rss", "vmem")
        for kind in ("s", "h")
    )
    return f"""\
qname                 {name}
hostlist              {hosts}
seq_no                0
load_thresholds       NONE
suspend_thresholds    NONE
nsuspend              1
suspend_interval      00:05:00
priority              0
min_cpu_interval      00:05:00
processors            UNDEFINED
qtype                 BATCH INTERACTIVE
ckpt_list             NONE
pe_list               {pe}
rerun                 FALSE
slots                 {slots}
tmpdir                {HOST_TMPDIR}
shell                 /bin/sh
prolog                NONE
epilog                NONE
shell_start_mode      unix_behavior
starter_method        NONE
suspend_method        NONE
resume_method         NONE
terminate_method      NONE
notify                00:00:60
owner_list            NONE
user_lists            NONE
xuser_lists           NONE
subordinate_list      NONE
complex_values        NONE
projects              NONE
xprojects             NONE
calendar              NONE
initial_state         default
{limits}"""


def _read(path: Path) -> str:
    try:
        return path.read_text(errors="replace")
    except OSError:
        return ""
