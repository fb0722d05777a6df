"""Runs a started job to its end: streams output, fails fast, and tears everything down.

The supervisor reads one queue of events from every host's agent and decides (task output
does not queue: each host's reader thread writes it to the log and console as it comes, and
only then queues the task's exit, so an exit is always handled after the output before it):

* success: every task of a finishing role (workers; TF's chief) exited 0. The others
  (scheduler, servers) then get `linger_s` to exit by themselves and are stopped after it;
* failure: the first task that exits non-zero, dies of a signal it did not get from dtrain,
  hangs after a traceback, cannot start, or loses its host; everything else is stopped;
* interruption (SIGINT/SIGTERM to dtrain) and the job deadline stop everything too.

A job stopped because it hung (the deadline, a task hung after its traceback, the first Ctrl-C
after a long silence) first has every task's stack taken (`StackTaker`), for at most
`stacks_budget_s`; a second Ctrl-C never waits for it.

"Stopped" is always SIGTERM to each task's process group, SIGKILL after the grace, and a
bound after which dtrain gives up on an unresponsive host (whose agent then cleans up alone).
"""

from __future__ import annotations

import logging
import queue
import threading
import time
from collections.abc import Callable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Protocol

from dtrain.agents.session import (
    OUTPUT_KINDS,
    AgentEvent,
    AgentSession,
    Event,
    Interrupt,
    LinkClosed,
)
from dtrain.launch.joblog import TaskLog
from dtrain.launch.results import JobResult, JobState, TaskExit, signal_name
from dtrain.plan.spec import JobPlan, TaskSpec
from dtrain.remote import proto

logger = logging.getLogger(__name__)

STDERR_TAIL_BYTES = 16384
KILL_AFTER_GRACE_S = 2.0  # after the grace, KILL what did not report an exit
GIVE_UP_AFTER_KILL_S = 3.0  # after that, stop waiting for a host that does not answer
POLL_S = 0.2  # the longest the loop waits for an event before checking its timers


class Console(Protocol):
    """Where task output and dtrain's progress notes go (the CLI decides how they look).

    `task_output` runs on the host's reader thread and may wait for the terminal; `note` and
    `task_closed` run on the supervisor's and must not: it has a job to stop meanwhile."""

    def task_output(self, task: TaskSpec, is_stderr: bool, data: bytes) -> None: ...

    def task_closed(self, task: TaskSpec) -> None: ...

    def note(self, message: str) -> None: ...

    def setup_output(self, host: str, data: bytes) -> None:
        """What a host's --setup wrote (stdout and stderr alike), before any task starts."""
        ...


class StackTaker(Protocol):
    """Takes every task's stack in the background (into the log directory) when a job hung."""

    def start(self) -> None: ...

    def is_done(self) -> bool: ...

    def summary(self) -> list[str]:
        """What came back so far, in a few lines (the grouped stacks, where the files are)."""
        ...


@dataclass(frozen=True)
class SupervisorOptions:
    grace_s: float = 5.0
    timeout_s: float | None = None
    lease_s: float = 15.0
    host_leases: Mapping[str, float] = field(default_factory=dict)  # by host key, over lease_s
    linger_s: float = 5.0
    stacks_budget_s: float = 3.0  # the longest a hung job's stop waits for its stacks
    hang_silence_s: float = 60.0  # a first Ctrl-C after this long without output: a hang


@dataclass
class TaskRun:
    spec: TaskSpec
    session: AgentSession
    log: TaskLog
    log_path: str
    pid: int | None = None
    started_at: float | None = None
    exit: TaskExit | None = None
    stderr: bytearray = field(default_factory=bytearray)
    lock: threading.Lock = field(default_factory=threading.Lock)  # output (readers) vs exit


class Supervisor:
    def __init__(
        self,
        plan: JobPlan,
        sessions: Mapping[str, AgentSession],
        events: queue.SimpleQueue[Event | Interrupt],
        log_dir: Path,
        console: Console,
        options: SupervisorOptions,
        clock: Callable[[], float] = time.monotonic,
        stacks: StackTaker | None = None,
    ) -> None:
        self.plan = plan
        self.events = events
        self.console = console
        self.options = options
        self.clock = clock
        self.log_dir = log_dir
        self.runs: dict[int, TaskRun] = {}
        for task_id, spec in plan.tasks_by_id().items():
            path = log_dir / spec.log_name
            self.runs[task_id] = TaskRun(
                spec=spec,
                session=sessions[spec.host.key],
                log=TaskLog(path),
                log_path=str(path),
            )
        self.state: JobState | None = None
        self.root_cause: TaskExit | None = None
        self.interrupt_signal: int | None = None
        self.interrupts = 0
        self.finishing_since: float | None = None
        self.stop_sent_at: float | None = None
        self.kill_sent_at: float | None = None
        self.lost_hosts: set[str] = set()
        self.started_wall = time.time()
        self.started = clock()
        self.stacks = stacks
        self.stacks_started_at: float | None = None
        self.stacks_reported = False
        self.last_output_at = self.started
        for session in sessions.values():
            session.output = self.on_output

    # ---- the loop --------------------------------------------------------------------------

    def run(self) -> JobResult:
        try:
            while not self.is_done():
                try:
                    event = self.events.get(timeout=POLL_S)
                except queue.Empty:
                    event = None
                if event is not None:
                    self.handle(event)
                self.check_timers()
        finally:
            for run in self.runs.values():
                run.session.output = None
                with run.lock:
                    run.log.close()
        return self.result()

    def is_done(self) -> bool:
        return all(run.exit is not None for run in self.runs.values())

    def handle(self, event: Event | Interrupt) -> None:
        if isinstance(event, Interrupt):
            self.on_interrupt(event.signum)
        elif isinstance(event, LinkClosed):
            self.on_link_closed(event.session)
        elif isinstance(event, AgentEvent):
            self.on_agent_event(event)

    def on_output(self, task: int, kind: int, payload: bytes) -> None:
        """Task output, on the reader thread of its host's session."""
        run = self.runs.get(task)
        if run is not None:
            self.write_output(run, kind == proto.STDERR, payload)

    def write_output(self, run: TaskRun, is_stderr: bool, payload: bytes) -> None:
        with run.lock:
            if run.exit is not None:
                return
            self.last_output_at = self.clock()
            failure = run.log.write(payload)
            if is_stderr:
                run.stderr += payload[-STDERR_TAIL_BYTES:]  # the rest would be cut
                del run.stderr[:-STDERR_TAIL_BYTES]
        if failure is not None:
            self.console.note(
                f"cannot write {run.spec.label}'s log {run.log_path}: {failure}; it stops "
                "here, the job goes on and its output still reaches this console"
            )
        self.console.task_output(run.spec, is_stderr, payload)

    def on_agent_event(self, event: AgentEvent) -> None:
        is_output = event.kind in OUTPUT_KINDS
        if is_output and event.session.budget is not None:
            event.session.budget.give_back(len(event.payload))
        run = self.runs.get(event.task)
        if run is None or run.exit is not None:
            return
        if is_output:
            self.write_output(run, event.kind == proto.STDERR, event.payload)
        elif event.kind == proto.STARTED:
            info = event.json()
            run.pid = info.get(proto.STARTED_PID)
            run.started_at = info.get(proto.EVENT_TIME)
        elif event.kind == proto.EXITED:
            info = event.json()
            self.finish(
                run,
                exit_code=info.get(proto.EXITED_CODE),
                signum=info.get(proto.EXITED_SIGNAL),
                # the agent also stops tasks on its own (it lost the launcher, or was
                # signalled): only a stop dtrain sent makes the exit dtrain's doing
                stopped_by_dtrain=bool(info.get(proto.EXITED_STOPPED_BY_DTRAIN))
                and self.stop_sent_at is not None,
                reason=info.get(proto.EXITED_REASON),
                detail=info.get(proto.EXITED_DETAIL),
            )
        elif event.kind == proto.NOTICE:
            self.console.note(f"{run.spec.host.display}: {event.json().get(proto.NOTICE_MESSAGE)}")

    def finish(
        self,
        run: TaskRun,
        exit_code: int | None,
        signum: int | None,
        stopped_by_dtrain: bool,
        reason: str | None = None,
        detail: str | None = None,
    ) -> None:
        with run.lock:
            tail = tuple(run.stderr.decode("utf-8", "replace").splitlines()[-12:])
            run.exit = TaskExit(
                task=run.spec.name,
                label=run.spec.label,
                host=run.spec.host.display,
                exit_code=exit_code,
                signal=signum,
                started_at=run.started_at,
                finished_at=time.time(),
                stopped_by_dtrain=stopped_by_dtrain,
                log_path=run.log_path,
                stderr_tail=tail,
                reason=reason,
                detail=detail,
                pid=run.pid,
                log_error=run.log.error,
            )
            run.log.close()
        self.console.task_closed(run.spec)
        self.evaluate(run.exit)

    def evaluate(self, exit: TaskExit) -> None:
        # A failure counts until dtrain starts stopping tasks: a server that crashes while the
        # finished workers' servers are lingering is still a failure.
        if exit.failed and self.stop_sent_at is None and self.state in (None, JobState.SUCCEEDED):
            self.state = JobState.FAILED
            self.root_cause = exit
            if exit.reason == proto.REASON_TRACEBACK_HANG:
                self.stop_hung()
            else:
                self.stop_all()
            return
        if self.state is None and self.finish_roles_done():
            self.state = JobState.SUCCEEDED
            self.finishing_since = self.clock()

    def finish_roles_done(self) -> bool:
        finishing = [r for r in self.runs.values() if r.spec.role in self.plan.finish_roles]
        return all(r.exit is not None and not r.exit.failed for r in finishing)

    # ---- hosts and signals -----------------------------------------------------------------

    def on_link_closed(self, session: AgentSession) -> None:
        stderr = session.link.stderr_text().strip()
        why = f"the connection to {session.host.display} closed"
        if stderr:
            why += f" ({stderr.splitlines()[-1]})"
        self.lose_host(session, why)

    def lose_host(self, session: AgentSession, why: str) -> None:
        self.lost_hosts.add(session.host.key)
        for run in self.runs.values():
            if run.session is session and run.exit is None:
                self.finish(
                    run,
                    exit_code=None,
                    signum=None,
                    stopped_by_dtrain=self.stop_sent_at is not None,
                    reason=proto.REASON_LOST,
                    detail=why,
                )

    def on_interrupt(self, signum: int) -> None:
        self.interrupts += 1
        if self.interrupts == 1:
            silent_s = self.clock() - self.last_output_at
            is_hang = silent_s >= self.options.hang_silence_s and self.stop_sent_at is None
            first = "taking every task's stack, then " if is_hang and self.stacks else ""
            self.console.note(
                f"{signal_name(signum)}: {first}stopping every task (SIGTERM, SIGKILL after "
                f"{self.options.grace_s:g}s); press Ctrl-C again to kill now"
            )
            if self.state is None or self.state is JobState.SUCCEEDED:
                self.state = JobState.INTERRUPTED
                self.interrupt_signal = signum
            if is_hang:
                self.stop_hung()
            else:
                self.stop_all()
        else:
            self.console.note("killing every task now")
            self.kill_all()

    def stop_hung(self) -> None:
        """Stop a job that hung, once every task's stack is taken or the budget is spent."""
        is_stopping = self.stop_sent_at is not None
        if self.stacks is None or self.stacks_started_at is not None or is_stopping:
            self.stop_all()
            return
        self.stacks_started_at = self.clock()
        self.stacks.start()

    def check_stacks(self, now: float) -> None:
        """Report the stacks and stop the job when they are in or the budget is spent."""
        if self.stacks is None or self.stacks_started_at is None or self.stacks_reported:
            return
        spent = now - self.stacks_started_at >= self.options.stacks_budget_s
        if not (self.stacks.is_done() or spent or self.kill_sent_at is not None):
            return
        self.stacks_reported = True
        for line in self.stacks.summary():
            self.console.note(line)
        self.stop_all()

    def stop_all(self) -> None:
        if self.stop_sent_at is not None:
            return
        self.stop_sent_at = self.clock()
        for session in self.live_sessions():
            session.stop(self.options.grace_s)

    def kill_all(self) -> None:
        if self.kill_sent_at is None:  # more Ctrl-Cs kill again, but never wait longer
            self.kill_sent_at = self.clock()
        if self.stop_sent_at is None:
            self.stop_sent_at = self.kill_sent_at
        for session in self.live_sessions():
            session.kill()

    def live_sessions(self) -> list[AgentSession]:
        sessions: dict[str, AgentSession] = {}
        for run in self.runs.values():
            if run.exit is None:
                sessions.setdefault(run.spec.host.key, run.session)
        return list(sessions.values())

    def check_timers(self) -> None:
        now = self.clock()
        options = self.options
        if (
            self.state is None
            and options.timeout_s is not None
            and now - self.started >= options.timeout_s
        ):
            self.state = JobState.TIMED_OUT
            running = [r.spec.label for r in self.runs.values() if r.exit is None]
            self.console.note(
                f"the job reached its --timeout of {options.timeout_s:g}s with "
                f"{len(running)} task(s) still running ({', '.join(running[:8])}); stopping them"
            )
            self.stop_hung()
        self.check_stacks(now)
        for session in self.live_sessions():
            silent_s = session.silent_for(now)
            if silent_s > options.host_leases.get(session.host.key, options.lease_s):
                self.lose_host(
                    session,
                    f"no heartbeat from {session.host.display} for {silent_s:.0f}s "
                    "(host down or network partitioned)",
                )
        if (
            self.state is JobState.SUCCEEDED
            and self.stop_sent_at is None
            and self.finishing_since is not None
        ):
            linger = options.linger_s if self.plan.others_exit_by_themselves else 0.0
            if now - self.finishing_since >= linger:
                self.stop_all()
        if self.stop_sent_at is not None:
            if self.kill_sent_at is None and now - self.stop_sent_at > (
                options.grace_s + KILL_AFTER_GRACE_S
            ):
                self.kill_all()
            if self.kill_sent_at is not None and now - self.kill_sent_at > GIVE_UP_AFTER_KILL_S:
                for session in self.live_sessions():
                    self.lose_host(
                        session,
                        f"{session.host.display} did not confirm that its tasks were stopped; "
                        "its agent stops them by itself when the connection drops",
                    )

    def result(self) -> JobResult:
        exits = tuple(run.exit for run in self.runs.values() if run.exit is not None)
        state = self.state or JobState.FAILED
        return JobResult(
            job_id=self.plan.job_id,
            state=state,
            exits=exits,
            root_cause=self.root_cause,
            started_at=self.started_wall,
            ended_at=time.time(),
            log_dir=str(self.log_dir),
            interrupt_signal=self.interrupt_signal,
            timeout_s=self.options.timeout_s,
        )
