"""One launcher run on the cluster, from start to a verified clean slate, as a plain record.

How times are taken, and why:

* t0 is `time.time()` just before the launcher is spawned. Each task writes its own start time
  (its first statement) into the run's stamp directory; the hosts share this machine's clock
  and /tmp, so "every task running" is the largest stamp, read after the fact. Nothing polls
  the hosts while a launcher starts, so the harness takes no CPU from it.
* Launcher exit and CPU time come from wait4() on the launcher: its own rusage plus that of
  every child it reaped (pdsh's and the tracker's ssh clients count for them). Peak RSS is the
  launcher process's own VmHWM, sampled every 20 ms.
* "Gone" is watched by root-namespace pid (plus start time) of each task, found once by tag
  after all have started, then polled every 10 ms through /proc: no ssh, no names.
* Remote CPU is the growth of each host's PID 1 (its sshd) cumulative child CPU over the run:
  everything the launcher made the hosts do (sshd, login shells, agents, tasks).

Every run ends by asking the tasks still alive to exit 0 (SIGUSR1, which no launcher sends),
so a launcher still waiting for them reports the failed task's code rather than the harness's
kill; then whatever still carries the run's tag, and the launcher's process group, is killed,
and anything that survived that is recorded as a failure.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

from bench import hostprocs, launchers
from bench.hostprocs import Pid

MODES = {
    "trivial": "stamp",
    "teardown": "fail",
    "sigint": "sleep",
    "sigkill": "sleep",
    "log": "log",
}
POLL_S = 0.01


def rotated(items: Sequence[str], by: int) -> list[str]:
    """The launcher order for repetition `by`: nobody always goes first."""
    shift = by % len(items)
    return [*items[shift:], *items[:shift]]


class HostCluster(Protocol):
    """The part of tests.cluster.netcluster.Cluster the runs need."""

    def sshd_pid(self, host: str) -> int: ...


@dataclass
class Context:
    """What every run of one cluster session shares."""

    cluster: HostCluster | None  # None: tasks run on this machine
    setup: launchers.Setup
    bashrc: str  # "as-is" or "blank"
    hosts: tuple[str, ...]
    life_s: float = 60.0
    start_timeout_s: float = 30.0
    _runs: int = 0

    def stamp_dir(self, name: str) -> Path:
        """A fresh directory whose path is the run's tag."""
        self._runs += 1
        path = self.setup.scratch / f"r{self._runs:04d}-{name}"
        path.mkdir()
        return path

    def host_cpu_s(self, hosts: Sequence[str]) -> float:
        if self.cluster is None:
            return 0.0
        return sum(hostprocs.cpu_of_tree(self.cluster.sshd_pid(h)) for h in hosts)

    def wait_hosts_quiet(self, hosts: Sequence[str], timeout_s: float = 3.0) -> bool:
        """Until only sshd (PID 1) is left on each host, so its child CPU is all accounted."""
        if self.cluster is None:
            return False
        firsts = {hostprocs.pid_namespace(self.cluster.sshd_pid(h)): self.cluster.sshd_pid(h)
                  for h in hosts}  # fmt: skip
        deadline = time.monotonic() + timeout_s
        while hostprocs.others_in_namespaces(firsts):
            if time.monotonic() > deadline:
                return False
            time.sleep(0.02)
        return True


class Waiter:
    """wait4() on the launcher in a thread: exit status, end time and CPU, exactly once; and
    its peak RSS, sampled from /proc while it runs.

    wait4's ru_maxrss would count the harness's own pages that the child had between fork and
    exec; VmHWM starts afresh at exec, so it is the launcher's own peak.
    """

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.exit_code: int | None = None
        self.ended: float | None = None
        self.cpu_s: float | None = None
        self.rss_mb: float | None = None
        self.done = threading.Event()
        self._thread = threading.Thread(target=self._wait, daemon=True)
        self._thread.start()
        self._sampler = threading.Thread(target=self._sample, daemon=True)
        self._sampler.start()

    def _wait(self) -> None:
        _, status, usage = os.wait4(self.popen.pid, 0)
        self.ended = time.time()
        self.exit_code = os.waitstatus_to_exitcode(status)
        self.popen.returncode = self.exit_code  # we reaped it; Popen must not try again
        self.cpu_s = usage.ru_utime + usage.ru_stime
        self.done.set()

    def _sample(self) -> None:
        path = Path(f"/proc/{self.popen.pid}/status")
        while not self.done.is_set():
            with contextlib.suppress(OSError, ValueError):
                for line in path.read_text().splitlines():
                    if line.startswith("VmHWM:"):
                        self.rss_mb = int(line.split()[1]) / 1024
            self.done.wait(0.02)

    def wait(self, timeout_s: float) -> bool:
        return self.done.wait(timeout_s)


@dataclass
class Run:
    """One launcher on one job; `record` collects what was measured."""

    ctx: Context
    launcher: str
    n_hosts: int
    per_host: int
    scenario: str
    rep: int
    megabytes: float = 0.0
    wrap: Callable[[launchers.Command, Path], launchers.Command] | None = None  # e.g. a profiler
    record: dict[str, Any] = field(default_factory=dict)
    stamp: Path = field(init=False)
    job: launchers.Job = field(init=False)
    t0: float = 0.0
    popen: subprocess.Popen[bytes] | None = None
    waiter: Waiter | None = None
    remote: list[Pid] = field(default_factory=list)
    local: list[Pid] = field(default_factory=list)
    watched: list[Pid] = field(default_factory=list)  # the tasks whose end is timed
    alone: bool = True  # no other run on the hosts: their CPU is all this run's
    first_host: int = 0  # the run's hosts are the cluster's from this one on
    _cpu_before: float = 0.0

    def __post_init__(self) -> None:
        self.stamp = self.ctx.stamp_dir(f"{self.launcher}-{self.scenario}")
        hosts = self.ctx.hosts[self.first_host : self.first_host + self.n_hosts]
        tasks = self.n_hosts * self.per_host
        argv = launchers.task_argv(
            self.stamp, MODES[self.scenario], tasks, self.ctx.life_s, self.megabytes
        )
        self.job = launchers.Job(hosts, self.per_host, argv)
        self.record = {
            "scenario": self.scenario,
            "launcher": self.launcher,
            "bashrc": self.ctx.bashrc,
            "hosts": self.n_hosts,
            "per_host": self.per_host,
            "tasks": tasks,
            "rep": self.rep,
            "ok": True,
            "errors": [],
        }

    # ---- steps ---------------------------------------------------------------------------

    def start(self) -> None:
        command = launchers.command(self.launcher, self.job, self.ctx.setup)
        if self.wrap is not None:
            command = self.wrap(command, self.stamp)
        self._cpu_before = self.ctx.host_cpu_s(self.job.hosts)
        env = {**os.environ, **command.env}
        with open(self.stamp / "stdout", "wb") as out, open(self.stamp / "stderr", "wb") as err:
            self.t0 = time.time()
            self.popen = subprocess.Popen(
                command.argv,
                env=env,
                cwd=self.ctx.setup.scratch,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own group: a terminal's Ctrl-C goes to the group
            )
        self.waiter = Waiter(self.popen)
        self.record["t0"] = self.t0

    def fail(self, why: str) -> None:
        self.record["ok"] = False
        self.record["errors"].append(why)

    def stamps(self, suffix: str = ".start") -> list[float]:
        values = []
        for path in self.stamp.iterdir():
            if path.name.endswith(suffix):
                with contextlib.suppress(OSError, ValueError):
                    values.append(float(path.read_text()))
        return values

    def wait_started(self) -> bool:
        """Until every task has written its start stamp; then note the task pids by tag."""
        deadline = time.time() + self.ctx.start_timeout_s
        want = self.job.tasks
        while sum(1 for p in self.stamp.iterdir() if p.name.endswith(".start")) < want:
            if time.time() > deadline:
                self.fail(f"only some of {want} tasks started within {self.ctx.start_timeout_s}s")
                return False
            if self.waiter is not None and self.waiter.done.is_set():
                time.sleep(0.2)  # a last look: stamps may land just after the launcher exits
                if sum(1 for p in self.stamp.iterdir() if p.name.endswith(".start")) < want:
                    self.fail(f"launcher exited ({self.waiter.exit_code}) before all started")
                    return False
            time.sleep(POLL_S * 2)
        self.note_launch()
        self.remote, self.local = hostprocs.tasks(str(self.stamp))
        if self.popen is not None:  # the launcher's steady state, every task running
            on_hosts = set(hostprocs.remote_tagged(str(self.stamp)))
            helpers = [p for p in hostprocs.tagged(str(self.stamp)) if p not in on_hosts]
            helpers = [p for p in helpers if p not in self.local]
            self.record["footprint"] = hostprocs.footprint(self.popen.pid, helpers)
        self.watched = self.remote if self.ctx.cluster is not None else self.local
        return True

    def note_launch(self) -> None:
        starts = self.stamps()
        if starts:
            self.record["launch_s"] = max(starts) - self.t0
            self.record["first_task_s"] = min(starts) - self.t0
        self.record["started"] = len(starts)

    def wait_exit(self, timeout_s: float) -> bool:
        """Until the launcher and every process in its group have exited."""
        assert self.waiter is not None and self.popen is not None
        if not self.waiter.wait(timeout_s):
            return False
        deadline = time.time() + timeout_s
        while hostprocs.group_alive(self.popen.pid):
            if time.time() > deadline:
                return False
            time.sleep(POLL_S)
        self.record["group_gone_s"] = time.time() - self.t0
        return True

    # ---- scenarios -----------------------------------------------------------------------

    def measure_job(self, timeout_s: float) -> None:
        """trivial and log: the job runs to its end; nothing polls while it runs."""
        if not self.wait_exit(timeout_s):
            self.fail(f"the job did not end within {timeout_s:.0f}s")
            return
        assert self.waiter is not None
        self.note_launch()
        self.record["exit_code"] = self.waiter.exit_code
        self.record["launcher_exit_s"] = (self.waiter.ended or 0.0) - self.t0
        done = self.stamps(".done")
        ended = max([self.t0 + self.record["group_gone_s"], *done])
        self.record["e2e_s"] = ended - self.t0
        if len(done) != self.job.tasks:
            self.fail(f"{len(done)} of {self.job.tasks} tasks finished")
        if self.scenario == "log":
            out = self.stamp / "stdout"
            self.record["bytes_out"] = out.stat().st_size
            self.record["bytes_written"] = int(self.megabytes * 1024 * 1024) // 100 * 100
            self.record["bytes_written"] *= self.job.tasks
            if self.record["bytes_out"] < self.record["bytes_written"]:
                self.fail("some output did not arrive")
            out.unlink()
        if self.waiter.exit_code != 0:
            self.fail(f"exit code {self.waiter.exit_code}")

    def failure_time(self, timeout_s: float) -> float | None:
        path = self.stamp / "failed"
        deadline = time.time() + timeout_s
        while time.time() < deadline:
            with contextlib.suppress(OSError, ValueError):
                return float(path.read_text())
            time.sleep(POLL_S)
        return None

    def send(self, signum: int) -> float:
        """SIGINT goes to the launcher's process group, as a terminal's Ctrl-C does; SIGKILL
        to the launcher alone, as `kill -9 PID` does."""
        assert self.popen is not None
        sent = time.time()
        with contextlib.suppress(ProcessLookupError):
            if signum == signal.SIGINT:
                os.killpg(self.popen.pid, signum)
            else:
                os.kill(self.popen.pid, signum)
        self.record["signal_at"] = sent
        return sent

    def after_signal(self, sent: float, window_s: float, gone_at: float | None) -> None:
        """Orphans: task processes still alive `window_s` after the signal."""
        assert self.waiter is not None
        remote, local = hostprocs.tasks(str(self.stamp))  # by tag: catches any newcomer too
        watched = remote if self.ctx.cluster is not None else local
        self.record["orphans"] = len(set(hostprocs.alive(self.watched)) | set(watched))
        self.record["local_orphans"] = len(hostprocs.alive(self.local))
        on_hosts = set(hostprocs.remote_tagged(str(self.stamp)))
        here = [p for p in hostprocs.tagged(str(self.stamp)) if p not in on_hosts]
        self.record["local_leftovers"] = len([p for p in here if p not in self.local])
        self.record["window_s"] = window_s
        self.record["gone_s"] = None if gone_at is None else gone_at - sent
        if self.waiter.done.is_set():
            self.record["exit_code"] = self.waiter.exit_code
            self.record["launcher_exit_after_signal_s"] = (self.waiter.ended or sent) - sent

    def after_teardown(
        self, failed_at: float | None, gone_at: float | None, bound_s: float
    ) -> None:
        self.record["teardown_bound_s"] = bound_s
        if failed_at is None:
            self.fail("no task failed")
            return
        self.record["teardown_s"] = None if gone_at is None else gone_at - failed_at
        self.record["local_alive"] = len(hostprocs.alive(self.local))
        assert self.waiter is not None
        if not self.waiter.done.is_set():
            self.waiter.wait(max(0.0, failed_at + bound_s + 2.0 - time.time()))
        if self.waiter.done.is_set():
            self.record["exit_code"] = self.waiter.exit_code
            self.record["launcher_exit_after_failure_s"] = (self.waiter.ended or 0.0) - failed_at

    # ---- the clean slate -----------------------------------------------------------------

    def cleanup(self) -> None:
        """Kill the tasks left by tag, let a launcher still waiting for them report an exit
        code, then kill everything else of the run and its process group; verify."""
        tag = str(self.stamp)
        remote, local = hostprocs.tasks(tag)
        if remote or local:
            self.record["stopped_by_harness"] = len(remote) + len(local)
            hostprocs.kill([*remote, *local], signal.SIGUSR1)  # tasks exit 0 on it
            left = hostprocs.alive([*remote, *local])
            if hostprocs.wait_gone(left, time.time() + 2.0) is None:
                hostprocs.kill(left)
        waiting = self.waiter is not None and "exit_code" not in self.record
        if waiting and self.waiter is not None and self.waiter.wait(5.0):
            self.record["exit_code"] = self.waiter.exit_code
            self.record["exit_after_harness_stop"] = bool(remote or local)
        left = hostprocs.remote_tagged(tag)
        if left:
            hostprocs.kill(left)
            hostprocs.wait_gone(left, time.time() + 3.0)
        if self.popen is not None:
            hostprocs.killpg(self.popen.pid)
        for _ in range(3):
            left = hostprocs.tagged(tag)
            if not left:
                break
            hostprocs.kill(left)
            hostprocs.wait_gone(left, time.time() + 2.0)
        if self.waiter is not None and not self.waiter.wait(10.0):
            self.fail("the launcher survived SIGKILL of its group")
        if hostprocs.tagged(tag):
            self.fail("processes survived the cleanup")
        if self.waiter is not None and "exit_code" not in self.record:
            self.record["exit_code_killed"] = self.waiter.exit_code
        if self.waiter is not None:
            self.record["cpu_s"] = self.waiter.cpu_s
            self.record["rss_mb"] = self.waiter.rss_mb
        if self.alone and self.ctx.wait_hosts_quiet(self.job.hosts):
            self.record["remote_cpu_s"] = self.ctx.host_cpu_s(self.job.hosts) - self._cpu_before
        if self.t0:
            self.record["run_s"] = time.time() - self.t0
        for path in (self.stamp / "stdout", self.stamp / "stderr"):
            if path.exists() and path.stat().st_size and not self.record["ok"]:
                self.record.setdefault("stderr_tail", "")
                text = path.read_bytes()[-1500:].decode("utf-8", "replace")
                self.record["stderr_tail"] += f"[{path.name}] {text}\n"


def watch_gone(runs: Sequence[Run], starts: Sequence[float], window_s: float) -> list[float | None]:
    """For each run, the wall time its remote tasks were all gone (None: not within the window
    after its own start time). All runs are polled together, so a slow one delays no other."""
    gone: list[float | None] = [None] * len(runs)
    pending = {i: list(run.watched) for i, run in enumerate(runs)}
    while pending:
        now = time.time()
        for i in list(pending):
            pending[i] = hostprocs.alive(pending[i])
            if not pending[i]:
                gone[i] = now
                del pending[i]
            elif now >= starts[i] + window_s:
                del pending[i]
        if pending:
            time.sleep(POLL_S)
    return gone


# ---- the scenarios, as the harness runs them -------------------------------------------------


def job(ctx: Context, launcher: str, n_hosts: int, per_host: int, scenario: str, rep: int,
        megabytes: float = 0.0, timeout_s: float = 120.0) -> dict[str, Any]:  # fmt: skip
    """trivial or log: start, let it end by itself, clean up."""
    run = Run(ctx, launcher, n_hosts, per_host, scenario, rep, megabytes)
    try:
        run.start()
        run.measure_job(timeout_s)
    finally:
        run.cleanup()
        if scenario == "log":
            forget_logs(ctx)
    return run.record


def forget_logs(ctx: Context) -> None:
    """Delete dtrain's task logs after a log run, as `measure_job` deletes its stdout: hundreds
    of MB a run that would otherwise pile up in the scratch directory, and that the kernel
    would write back to disk while later runs are timed."""
    shutil.rmtree(ctx.setup.scratch / "dtrain-logs", ignore_errors=True)


def split_log(ctx: Context, parts: int, n_hosts: int, per_host: int, rep: int,
              megabytes: float, timeout_s: float = 120.0) -> dict[str, Any]:  # fmt: skip
    """The log job relayed by `parts` dtrain launchers at once, each with its own share of
    the hosts: whether one launcher process (one interpreter's lock) is what holds the relay
    back. One record for the whole, as launcher `launchers.SPLIT`: the first task's start, the
    last end, and every launcher's and host's CPU added up (the shares share no host)."""
    share = n_hosts // parts
    runs = [
        Run(ctx, "dtrain", share, per_host, "log", rep, megabytes, first_host=i * share)
        for i in range(parts)
    ]
    started: list[Run] = []
    try:
        for run in runs:
            started.append(run)
            run.start()
        for run in runs:
            run.measure_job(timeout_s)
    finally:
        for run in started:
            run.cleanup()
        forget_logs(ctx)
    t0 = min(run.t0 for run in runs)
    records = [run.record for run in runs]
    record: dict[str, Any] = {
        **{key: records[0][key] for key in ("scenario", "bashrc", "per_host", "rep")},
        "launcher": launchers.SPLIT,
        "hosts": share * parts,
        "tasks": share * parts * per_host,
        "processes": parts,
        "ok": all(r["ok"] for r in records),
        "errors": [e for r in records for e in r["errors"]],
        "t0": t0,
    }
    for key in ("bytes_written", "bytes_out", "cpu_s", "remote_cpu_s"):
        found = [r.get(key) for r in records]
        record[key] = None if None in found else sum(found)
    for key in ("first_task_s", "launch_s", "e2e_s"):
        if all(r.get(key) is not None for r in records):
            at = [run.t0 + run.record[key] for run in runs]
            record[key] = (min(at) if key == "first_task_s" else max(at)) - t0
    return record


def teardown(runs: Sequence[Run], bound_s: float) -> list[dict[str, Any]]:
    """Start each run (one after another, each fully up), then watch every one's failure."""
    started: list[Run] = []
    try:
        for run in runs:
            run.alone = len(runs) == 1
            started.append(run)
            run.start()
            run.wait_started()
        ready = [run for run in started if run.record["ok"]]
        failed = [run.failure_time(run.ctx.start_timeout_s) for run in ready]
        starts = [f if f is not None else time.time() for f in failed]
        gone = watch_gone(ready, starts, bound_s)
        for run, failed_at, gone_at in zip(ready, failed, gone, strict=True):
            run.after_teardown(failed_at, gone_at, bound_s)
    finally:
        for run in started:
            run.cleanup()
    return [run.record for run in runs]


def interrupt(runs: Sequence[Run], signum: int, window_s: float) -> list[dict[str, Any]]:
    """Start each run, then signal every launcher at once and count survivors after the window."""
    started: list[Run] = []
    try:
        for run in runs:
            run.alone = len(runs) == 1
            started.append(run)
            run.start()
            run.wait_started()
        ready = [run for run in started if run.record["ok"]]
        sent = [run.send(signum) for run in ready]
        gone = watch_gone(ready, sent, window_s)
        if len(runs) > 1 or None in gone:  # alone and all gone: nothing can come back
            time.sleep(max(0.0, max(sent, default=0.0) + window_s - time.time()))
        for run, at, gone_at in zip(ready, sent, gone, strict=True):
            run.after_signal(at, window_s, gone_at)
    finally:
        for run in started:
            run.cleanup()
    return [run.record for run in runs]
