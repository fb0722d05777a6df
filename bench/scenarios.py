"""One launcher run on the cluster, from start to a verified clean slate, as a plain record.

How times are taken, and why:

* t0 is `time.time()` just before the launcher is spawned. Each task writes its own start time
  (its first statement) into the run's stamp directory; the hosts share this machine's clock
  and /tmp, so "every task running" is the largest stamp, read after the fact. Nothing polls
  the hosts while a launcher starts, so the harness takes no CPU from it.
* "Gone" is watched through psutil on the task processes, found by tag once all have started.
* "Left on the hosts" counts every process below the hosts' sshd listeners (bench/procs.py):
  tasks, agents, shells and sshd sessions, tagged or not.

Every run ends by asking the tasks still alive to exit 0 (SIGUSR1, which no launcher sends),
so a launcher still waiting for them reports the failed task's code rather than the harness's
kill; then whatever still carries the run's tag, the launcher's process group and anything
left on the hosts is killed (counted as `killed_on_hosts`).
"""

from __future__ import annotations

import contextlib
import os
import shutil
import signal
import subprocess
import threading
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Protocol

import psutil

from bench import launchers, procs

MODES = {
    "trivial": "stamp",
    "teardown": "fail",
    "sigint": "sleep",
    "sigkill": "sleep",
    "log": "log",
}
POLL_S = 0.01
# The launchers run as users run them: not with the harness's unbuffered output or path.
DROPPED_ENV = ("PYTHONUNBUFFERED", "PYTHONPATH")


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

    cluster: HostCluster
    setup: launchers.Setup
    hosts: tuple[str, ...]
    life_s: float = 90.0
    start_timeout_s: float = 60.0
    _runs: int = 0

    def stamp_dir(self, name: str) -> Path:
        """A fresh directory whose path is the run's tag."""
        self._runs += 1
        path = self.setup.scratch / f"r{self._runs:04d}-{name}"
        path.mkdir()
        return path

    def left_on(self, hosts: Sequence[str]) -> list[int]:
        return procs.on_hosts(self.cluster.sshd_pid(h) for h in hosts)

    def wait_hosts_quiet(self, hosts: Sequence[str], timeout_s: float) -> list[int]:
        """Until nothing but each host's sshd listener is left; what is left at the end."""
        deadline = time.monotonic() + timeout_s
        while (left := self.left_on(hosts)) and time.monotonic() < deadline:
            time.sleep(0.05)
        return left


class Waiter:
    """Waits for the launcher in a thread: its exit code and end time, exactly once."""

    def __init__(self, popen: subprocess.Popen[bytes]) -> None:
        self.popen = popen
        self.exit_code: int | None = None
        self.ended: float | None = None
        self.done = threading.Event()
        threading.Thread(target=self._wait, daemon=True).start()

    def _wait(self) -> None:
        self.exit_code = self.popen.wait()
        self.ended = time.time()
        self.done.set()

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
    record: dict[str, Any] = field(default_factory=dict)
    stamp: Path = field(init=False)
    job: launchers.Job = field(init=False)
    t0: float = 0.0
    popen: subprocess.Popen[bytes] | None = None
    waiter: Waiter | None = None
    watched: list[psutil.Process] = field(default_factory=list)  # the tasks, once started

    def __post_init__(self) -> None:
        self.stamp = self.ctx.stamp_dir(f"{self.launcher}-{self.scenario}")
        tasks = self.n_hosts * self.per_host
        argv = launchers.task_argv(
            self.stamp, MODES[self.scenario], tasks, self.ctx.life_s, self.megabytes
        )
        self.job = launchers.Job(self.ctx.hosts[: self.n_hosts], self.per_host, argv)
        self.record = {
            "scenario": self.scenario,
            "launcher": self.launcher,
            "hosts": self.n_hosts,
            "per_host": self.per_host,
            "tasks": tasks,
            "rep": self.rep,
            "ok": True,
            "errors": [],
        }

    def start(self) -> None:
        command = launchers.command(self.launcher, self.job, self.ctx.setup)
        env = {k: v for k, v in os.environ.items() if k not in DROPPED_ENV}
        with open(self.stamp / "stdout", "wb") as out, open(self.stamp / "stderr", "wb") as err:
            self.t0 = time.time()
            self.popen = subprocess.Popen(
                command.argv,
                env={**env, **command.env},
                cwd=self.ctx.setup.scratch,
                stdin=subprocess.DEVNULL,
                stdout=out,
                stderr=err,
                start_new_session=True,  # its own group: a terminal's Ctrl-C goes to the group
            )
        self.waiter = Waiter(self.popen)

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

    def count(self, suffix: str = ".start") -> int:
        return sum(1 for p in self.stamp.iterdir() if p.name.endswith(suffix))

    def wait_started(self) -> bool:
        """Until every task has written its start stamp; then note the task processes."""
        assert self.waiter is not None
        deadline = time.time() + self.ctx.start_timeout_s
        while self.count() < self.job.tasks:
            if time.time() > deadline:
                self.fail(f"only some of {self.job.tasks} tasks started in time")
                return False
            if self.waiter.done.is_set():
                time.sleep(0.2)  # a last look: stamps may land just after the launcher exits
                if self.count() < self.job.tasks:
                    self.fail(f"launcher exited ({self.waiter.exit_code}) before all started")
                    return False
            time.sleep(POLL_S * 2)
        self.note_launch()
        self.watched = procs.tasks(str(self.stamp))
        return True

    def note_launch(self) -> None:
        starts = self.stamps()
        if starts:
            self.record["launch_s"] = max(starts) - self.t0

    def measure_job(self, timeout_s: float) -> None:
        """trivial and log: the job runs to its end; nothing polls while it runs."""
        assert self.waiter is not None and self.popen is not None
        if not self.waiter.wait(timeout_s):
            self.fail(f"the job did not end within {timeout_s:.0f}s")
            return
        self.note_launch()
        self.record["exit_code"] = self.waiter.exit_code
        done = self.stamps(".done")
        if len(done) != self.job.tasks:
            self.fail(f"{len(done)} of {self.job.tasks} tasks finished")
        if self.scenario == "log" and done:
            first = min(self.stamps())
            out = self.stamp / "stdout"
            written = int(self.megabytes * 1024 * 1024) // 100 * 100 * self.job.tasks
            self.record["mb_per_s"] = written / 1e6 / ((self.waiter.ended or 0.0) - first)
            if out.stat().st_size < written:
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
        return sent

    def note_exit(self, since: float, key: str, wait_s: float = 0.0) -> None:
        assert self.waiter is not None
        if self.waiter.wait(wait_s):
            self.record["exit_code"] = self.waiter.exit_code
            self.record[key] = (self.waiter.ended or since) - since

    def cleanup(self) -> None:
        """Stop the tasks left by tag (exit 0), let a launcher still waiting report its exit
        code, then kill whatever is left of the run, here and on its hosts; verify."""
        tag = str(self.stamp)
        left = procs.tasks(tag)
        if left:
            procs.kill(left, signal.SIGUSR1)  # tasks exit 0 on it
            if not procs.wait_gone(left, 2.0):
                procs.kill(left)
        if self.waiter is not None and "exit_code" not in self.record and self.waiter.wait(5.0):
            self.record["exit_code"] = self.waiter.exit_code
            self.record["exit_after_harness_stop"] = bool(left)
        if self.popen is not None:
            procs.killpg(self.popen.pid)
        for _ in range(3):
            if not (left := procs.tagged(tag)):
                break
            procs.kill(left)
            procs.wait_gone(left, 2.0)
        if self.waiter is not None and not self.waiter.wait(10.0):
            self.fail("the launcher survived SIGKILL of its group")
        if procs.tagged(tag):
            self.fail("processes survived the cleanup")
        stray = self.ctx.wait_hosts_quiet(self.job.hosts, 5.0)
        if stray:  # a launcher that cleans up left something; a peer is known not to
            self.record["killed_on_hosts"] = len(stray)
            procs.kill_pids(stray)
            self.ctx.wait_hosts_quiet(self.job.hosts, 5.0)
        for path in (self.stamp / "stdout", self.stamp / "stderr"):
            if not self.record["ok"] and path.exists() and path.stat().st_size:
                text = path.read_bytes()[-1500:].decode("utf-8", "replace")
                self.record.setdefault("stderr_tail", "")
                self.record["stderr_tail"] += f"[{path.name}] {text}\n"
        shutil.rmtree(self.stamp, ignore_errors=True)


def gone_at(watched: Sequence[psutil.Process], since: float, window_s: float) -> float | None:
    """The wall time every one of `watched` was gone; None if some outlived the window."""
    pending = list(watched)
    while pending := procs.alive(pending):
        if time.time() >= since + window_s:
            return None
        time.sleep(POLL_S)
    return time.time()


# ---- the scenarios, as the harness runs them -------------------------------------------------


def job(ctx: Context, launcher: str, n_hosts: int, per_host: int, scenario: str, rep: int,
        megabytes: float = 0.0, timeout_s: float = 180.0) -> dict[str, Any]:  # fmt: skip
    """trivial or log: start, let it end by itself, clean up."""
    run = Run(ctx, launcher, n_hosts, per_host, scenario, rep, megabytes)
    try:
        run.start()
        run.measure_job(timeout_s)
    finally:
        run.cleanup()
        shutil.rmtree(ctx.setup.scratch / "dtrain-logs", ignore_errors=True)  # up to GBs
    return run.record


def teardown(run: Run, bound_s: float) -> dict[str, Any]:
    """One task exits 7 once all have started: the time until the others are gone."""
    try:
        run.start()
        if run.wait_started():
            failed_at = run.failure_time(run.ctx.start_timeout_s)
            if failed_at is None:
                run.fail("no task failed")
            else:
                gone = gone_at(run.watched, failed_at, bound_s)
                run.record["teardown_s"] = None if gone is None else gone - failed_at
                run.record["bound_s"] = bound_s
                run.note_exit(failed_at, "exit_after_failure_s", 2.0)
    finally:
        run.cleanup()
    return run.record


def interrupt(run: Run, signum: int, window_s: float) -> dict[str, Any]:
    """Signal the launcher once every task runs; count what is left `window_s` later (or as
    soon as nothing is: the launcher is gone by then, nothing can come back)."""
    try:
        run.start()
        if run.wait_started():
            sent = run.send(signum)
            gone = gone_at(run.watched, sent, window_s)
            run.record["gone_s"] = None if gone is None else gone - sent
            while (left := run.ctx.left_on(run.job.hosts)) and time.time() < sent + window_s:
                time.sleep(0.05)
            run.record["tasks_left"] = len(procs.alive(run.watched))
            run.record["left_on_hosts"] = len(left)
            run.record["window_s"] = window_s
            run.note_exit(sent, "exit_after_signal_s", 2.0)
    finally:
        run.cleanup()
    return run.record
