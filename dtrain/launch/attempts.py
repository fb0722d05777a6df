"""A job that may restart (`--max-restarts N`): attempt after attempt until one ends for good.

Each attempt is a whole launch (`Launch.run_attempt`: connect, or keep the last attempt's
agents when every host is still there; plan, start, supervise, and every task stopped and
gone before it returns); between two, a wait that doubles, which a
signal or `dtrain kill` ends at once, and for good. Which failure restarts, how long to wait
and which hosts to drop are `restarts`' pure rules; this module applies them and keeps the
record: job.json lists every attempt, and each attempt's logs stay in `attempt-N/`.
"""

from __future__ import annotations

import contextlib
import queue
import random
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime
from typing import TYPE_CHECKING, Any, Protocol

from dtrain.agents.session import Event, Interrupt
from dtrain.errors import DtrainError, ExitCode, one_line, signal_exit_code
from dtrain.launch import joblog, restarts
from dtrain.launch.results import JobResult, JobState, signal_name
from dtrain.launch.signals import forward_signals
from dtrain.plan import planner
from dtrain.plan.hosts import Host
from dtrain.plan.spec import JobPlan, PlacedTask

if TYPE_CHECKING:
    from dtrain.launch.lifecycle import LaunchOptions
    from dtrain.launch.supervise import Console


class Launch(Protocol):
    """What the attempts need of the launch that runs them (`lifecycle.Launch`)."""

    request: planner.JobRequest
    options: LaunchOptions
    console: Console
    plan: JobPlan | None
    job_file: joblog.JobFile | None
    tasks_started_at: float | None
    dropped: dict[str, restarts.DroppedHost]

    def run_attempt(
        self, paths: joblog.JobPaths, placed: Sequence[PlacedTask], attempt: int | None
    ) -> JobResult: ...

    def drop_host(self, host: Host, why: str, attempt: int) -> None: ...

    def keep_alive(self) -> contextlib.AbstractContextManager[object]: ...


def wait_for_signal(delay_s: float) -> int | None:
    """Sleep `delay_s`, or less: the signal (SIGINT, SIGTERM, SIGHUP) that ended the wait."""
    events: queue.SimpleQueue[Event | Interrupt] = queue.SimpleQueue()
    with forward_signals(events):
        try:
            event = events.get(timeout=max(delay_s, 0.0))
        except queue.Empty:
            return None
    return event.signum if isinstance(event, Interrupt) else None


@dataclass
class Attempts:
    """The attempts of one job, run by `launch` one after another (the seam: `launch`'s
    `run_attempt`, `wait` and `draw`; tests pass stand-ins for them)."""

    launch: Launch
    paths: joblog.JobPaths
    wait: Callable[[float], int | None] = wait_for_signal
    draw: Callable[[], float] = random.random
    records: list[dict[str, Any]] = field(default_factory=list)
    starting: tuple[int, float] | None = None  # the attempt being run, and since when

    def run(self, placed: Sequence[PlacedTask]) -> JobResult:
        try:
            return self._run(placed)
        except BaseException as exc:  # a start that failed, a signal between two attempts
            self._ended_by(exc)
            raise

    def _run(self, placed: Sequence[PlacedTask]) -> JobResult:
        launch = self.launch
        policy = launch.options.restart
        base = launch.request
        total = policy.max_restarts + 1
        attempt = 1
        while True:
            placed = self._prepare(base, placed, attempt)
            started_at = time.time()
            dropped = list(launch.dropped.values())
            self.starting = (attempt, started_at)
            result = launch.run_attempt(self.paths, placed, attempt)
            self.starting = None
            hosts = self._hosts_used()
            self.records.append(self._record(attempt, started_at, hosts, dropped, result))
            verdict = restarts.verdict(policy, attempt - 1, result, launch.tasks_started_at)
            if not verdict.restart:
                if result.state is JobState.FAILED:
                    launch.console.note(
                        f"attempt {attempt} of {total} failed; the job ends: {verdict.why}"
                    )
                return self._finish(result)
            self._drop_lost(result, attempt)
            delay_s = restarts.backoff_s(policy, attempt, self.draw())
            at = datetime.fromtimestamp(time.time() + delay_s).strftime("%H:%M:%S")
            launch.console.note(
                f"attempt {attempt} of {total} failed: {verdict.why}; every task is stopped; "
                f"attempt {attempt + 1} starts in {delay_s:.1f}s (at {at})"
            )
            self._update(next_attempt_at=time.time() + delay_s)
            with launch.keep_alive():
                signum = self.wait(delay_s)
            if signum is not None:
                launch.console.note(
                    f"{signal_name(signum)} while waiting to restart: the job ends, "
                    f"nothing is running"
                )
                stopped = replace(
                    result,
                    state=JobState.INTERRUPTED,
                    interrupt_signal=signum,
                    ended_at=time.time(),
                )
                return self._finish(stopped)
            self._update(next_attempt_at=None)
            attempt += 1

    def _prepare(
        self, base: planner.JobRequest, placed: Sequence[PlacedTask], attempt: int
    ) -> Sequence[PlacedTask]:
        """The request of this attempt: its restart count, the hosts not cooling down."""
        launch = self.launch
        policy = launch.options.restart
        request = replace(
            base if attempt > 1 else launch.request,
            restart_count=attempt - 1,
            max_restarts=policy.max_restarts,
        )
        if attempt > 1 and base.hosts:
            hosts = restarts.hosts_to_try(
                base.hosts, launch.dropped, time.monotonic(), policy.host_cooldown_s
            )
            for host in base.hosts:
                if host in hosts:
                    launch.dropped.pop(host.key, None)  # cooled down: tried again
            request = replace(request, hosts=hosts)
        launch.request = request
        return placed if attempt == 1 else planner.place(request)

    def _hosts_used(self) -> list[str]:
        plan = self.launch.plan
        return [h.display for h in plan.hosts] if plan is not None else []

    def _record(
        self,
        attempt: int,
        started_at: float,
        hosts: Sequence[str],
        dropped: Sequence[restarts.DroppedHost],
        result: JobResult | None = None,
        error: str | None = None,
        error_code: int | None = None,
    ) -> dict[str, Any]:
        where = str(joblog.attempt_dir(self.paths, attempt))
        dropped_now = [*dropped, *self.launch.dropped.values()]
        unique = {d.key: d for d in dropped_now}
        record = restarts.attempt_record(
            attempt, started_at, hosts, list(unique.values()), where, result, error, error_code
        )
        job_file = self.launch.job_file
        if job_file is not None and result is not None:  # what started its agents (Slurm's step)
            record["engine"] = job_file.document.get("engine")
        return record

    def _drop_lost(self, result: JobResult, attempt: int) -> None:
        """With --min-hosts, a host the attempt lost sits out the next ones for a cool-down."""
        launch = self.launch
        if launch.options.restart.min_hosts is None:
            return
        lost = restarts.lost_hosts(result)
        hosts = launch.request.hosts
        gone = [host for host in hosts if host.display in lost]
        if not gone or not restarts.enough_hosts(launch.options.restart, len(hosts) - len(gone)):
            return  # too few would be left: the next attempt asks every host again
        for host in gone:
            why = f"lost during attempt {attempt}: {lost[host.display]}"
            launch.drop_host(host, why, attempt + 1)

    def _update(self, **fields: Any) -> None:
        job_file = self.launch.job_file
        if job_file is not None:
            job_file.update(attempts=self.records, **fields)

    def _finish(self, result: JobResult) -> JobResult:
        """job.json's final state: the last attempt's result and every attempt."""
        job_file = self.launch.job_file
        if job_file is not None:
            try:
                job_file.finish(
                    result.state.value,
                    result.to_dict(),
                    attempts=self.records,
                    next_attempt_at=None,
                )
            except OSError as exc:
                self.launch.console.note(
                    f"cannot write {job_file.paths.job_file}: {exc.strerror or exc}; "
                    "it still says the job is running"
                )
        return result

    def _ended_by(self, exc: BaseException) -> None:
        """A job that ends by an exception (an attempt after the first that could not start,
        Ctrl-C or SIGTERM between two attempts) says so in job.json; without one (the first
        attempt never started anything) its directory goes, as without restarts."""
        job_file = self.launch.job_file
        if job_file is None or job_file.document.get("state") != joblog.RUNNING:
            return
        state, code = JobState.FAILED, int(ExitCode.JOB_FAILED)
        what = one_line(str(exc).splitlines()[0]) if str(exc) else type(exc).__name__
        if isinstance(exc, DtrainError):
            code = exc.exit_code
        elif isinstance(exc, KeyboardInterrupt):
            state, code, what = JobState.INTERRUPTED, 130, "interrupted (SIGINT)"
        elif exc.args and isinstance(exc.args[0], int):  # the CLI's SIGTERM before a start
            state, code = JobState.INTERRUPTED, signal_exit_code(exc.args[0])
            what = f"stopped by {signal_name(exc.args[0])}"
        if self.starting is not None:
            attempt, started_at = self.starting
            record = self._record(attempt, started_at, [], [], error=what, error_code=code)
            self.records.append(record)
        with contextlib.suppress(OSError):  # the error itself is what the user sees
            job_file.finish(
                state.value,
                {"state": state.value, "exit_code": code, "error": what},
                attempts=self.records,
                next_attempt_at=None,
            )
