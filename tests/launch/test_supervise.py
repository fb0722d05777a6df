"""The supervisor's timing rules, driven by a fake clock and scripted agent sessions.

Each test delivers events one by one as `Supervisor.run` would (handle the event, then check
the timers) and moves the clock by hand between them, so the order of things is exactly the
one written in the test. No process, socket or sleep: the same rules with real processes are
in test_launch_local.py.
"""

from __future__ import annotations

import json
import queue
import signal
from collections.abc import Callable, Iterator, Mapping
from pathlib import Path
from typing import Any, cast

import pytest

from dtrain.agents.session import (
    AgentEvent,
    AgentSession,
    Event,
    Interrupt,
    LinkClosed,
    OutputBudget,
)
from dtrain.errors import ExitCode
from dtrain.launch.results import JobResult, JobState, TaskExit
from dtrain.launch.supervise import (
    GIVE_UP_AFTER_KILL_S,
    KILL_AFTER_GRACE_S,
    STDERR_TAIL_BYTES,
    StackTaker,
    Supervisor,
    SupervisorOptions,
)
from dtrain.plan import planner
from dtrain.plan.hosts import local_host, parse_hosts
from dtrain.plan.spec import Framework, JobPlan, TaskSpec
from dtrain.remote import proto

GRACE_S = 5.0
LINGER_S = 5.0
LEASE_S = 15.0
KILL_DUE_S = GRACE_S + KILL_AFTER_GRACE_S  # after the stop
STOP = f"stop(grace_s={GRACE_S:g})"
KILL = "kill()"


def plan_for(framework: Framework = Framework.DMLC) -> JobPlan:
    """Two workers on hosts h1 and h2, planned by the real planner.

    DMLC: scheduler@launcher, server.0@h1, worker.0@h1, worker.1@h2 (servers exit by
    themselves). TF: ps.0@h1, worker.0@h1, worker.1@h2 (the ps never exits by itself).
    """
    hosts = parse_hosts("h1\nh2", "hosts")
    request = planner.JobRequest(
        command=("python", "train.py"),
        local_host=local_host("launcher"),
        framework=framework,
        num_workers=2,
        num_servers=1,
        hosts=hosts,
    )
    needed = planner.ports_needed(request)
    names = [host.name for host in hosts] + ["launcher"]
    facts = planner.Facts(
        job_id="J",
        hosts={
            name: planner.HostFacts(
                address=f"198.18.0.{10 + number}",
                free_ports=tuple(9000 + i for i in range(needed.get(name, 0))),
            )
            for number, name in enumerate(names, start=1)
        },
    )
    return planner.plan_job(request, facts)


class FakeClock:
    """Monotonic seconds that move only when told to (and by `step_s` at each reading)."""

    def __init__(self, step_s: float = 0.0) -> None:
        self.now = 0.0
        self.step_s = step_s

    def __call__(self) -> float:
        now = self.now
        self.now += self.step_s
        return now


class FakeLink:
    def __init__(self) -> None:
        self.stderr = ""

    def stderr_text(self) -> str:
        return self.stderr


class FakeSession:
    """A scripted stand-in for `AgentSession`, for orderings that are hard to produce for real.

    Supervision is tested with real agents and processes end to end; this fake lets a test say
    exactly when a host goes silent, when its link closes, or that it never confirms a stop.
    It has only what the supervisor uses (`host`, `budget`, `output`, `silent_for`,
    `link.stderr_text()`, `stop`, `kill`) and records each stop and kill with the fake time
    it came at. Until `go_silent()`, its agent is heard at every clock reading, as its
    heartbeat would be.
    """

    def __init__(self, host_name: str, clock: FakeClock) -> None:
        self.host = local_host(host_name)
        self.clock = clock
        self.link = FakeLink()
        self.budget: OutputBudget | None = None
        self.output: Callable[[int, int, bytes], None] | None = None  # the supervisor's
        self.silent_since: float | None = None
        self.calls: list[tuple[str, float]] = []

    @property
    def last_heard(self) -> float:
        return self.clock.now if self.silent_since is None else self.silent_since

    def silent_for(self, now: float) -> float:
        return now - self.last_heard

    def go_silent(self) -> None:
        self.silent_since = self.clock.now

    def stop(self, grace_s: float) -> None:
        self.calls.append((f"stop(grace_s={grace_s:g})", self.clock.now))

    def kill(self) -> None:
        self.calls.append((KILL, self.clock.now))


def as_session(fake: FakeSession) -> AgentSession:
    return cast(AgentSession, fake)


class RecordingConsole:
    def __init__(self) -> None:
        self.output: list[tuple[str, bool, bytes]] = []
        self.closed: list[str] = []
        self.notes: list[str] = []

    def task_output(self, task: TaskSpec, is_stderr: bool, data: bytes) -> None:
        self.output.append((task.label, is_stderr, data))

    def task_closed(self, task: TaskSpec) -> None:
        self.closed.append(task.label)

    def note(self, message: str) -> None:
        self.notes.append(message)

    def setup_output(self, host: str, data: bytes) -> None:
        self.output.append((f"setup@{host}", True, data))


class Job:
    """A supervisor over one fake session per host of its plan, driven by hand."""

    def __init__(
        self,
        plan: JobPlan,
        log_dir: Path,
        clock: FakeClock,
        timeout_s: float | None = None,
        stacks: StackTaker | None = None,
        host_leases: Mapping[str, float] | None = None,
    ) -> None:
        self.plan = plan
        self.clock = clock
        self.console = RecordingConsole()
        self.sessions = {host.name: FakeSession(host.name, clock) for host in plan.hosts}
        self.events: queue.SimpleQueue[Event | Interrupt] = queue.SimpleQueue()
        self.supervisor = Supervisor(
            plan,
            {name: as_session(fake) for name, fake in self.sessions.items()},
            self.events,
            log_dir,
            self.console,
            SupervisorOptions(
                grace_s=GRACE_S,
                timeout_s=timeout_s,
                lease_s=LEASE_S,
                host_leases=host_leases or {},
                linger_s=LINGER_S,
            ),
            clock=clock,
            stacks=stacks,
        )
        self.task_ids = {spec.name: task_id for task_id, spec in enumerate(plan.tasks)}

    # ---- events, as agents send them ----------------------------------------------------

    def event(self, task: str, kind: int, payload: bytes) -> AgentEvent:
        session = self.sessions[self.plan.task(task).host.name]
        return AgentEvent(as_session(session), kind, self.task_ids[task], payload)

    def started(self, task: str, pid: int) -> AgentEvent:
        info = {"pid": pid, "pgid": pid, proto.EVENT_TIME: 1700000000.0}
        return self.event(task, proto.STARTED, json.dumps(info).encode())

    def output(self, task: str, data: bytes, is_stderr: bool = False) -> AgentEvent:
        return self.event(task, proto.STDERR if is_stderr else proto.STDOUT, data)

    def exited(
        self,
        task: str,
        code: int | None = 0,
        signum: int | None = None,
        stopped_by_dtrain: bool = False,
        reason: str | None = None,
        detail: str | None = None,
    ) -> AgentEvent:
        info: dict[str, Any] = {
            proto.EXITED_CODE: code,
            proto.EXITED_SIGNAL: signum,
            proto.EXITED_STOPPED_BY_DTRAIN: stopped_by_dtrain,
            proto.EXITED_REASON: reason,
            proto.EXITED_DETAIL: detail,
            proto.EVENT_TIME: 1700000000.0,
        }
        return self.event(task, proto.EXITED, json.dumps(info).encode())

    def stopped(self, task: str, signum: int = signal.SIGTERM) -> AgentEvent:
        """The EXITED an agent sends for a task it signalled after dtrain's stop or kill."""
        return self.exited(task, code=None, signum=signum, stopped_by_dtrain=True)

    def link_closed(self, host: str) -> LinkClosed:
        return LinkClosed(as_session(self.sessions[host]))

    # ---- the loop, one turn at a time -----------------------------------------------------

    def deliver(self, *events: Event | Interrupt) -> None:
        """What `run` does for each event: handle it, then check the timers."""
        for event in events:
            self.supervisor.handle(event)
            self.supervisor.check_timers()

    def advance_to(self, now: float) -> None:
        """Time passes without events until `now`; the loop checks its timers then."""
        assert now >= self.clock.now
        self.clock.now = now
        self.supervisor.check_timers()

    def start_all(self) -> None:
        self.deliver(*(self.started(spec.name, 100 + i) for i, spec in enumerate(self.plan.tasks)))

    def calls(self) -> dict[str, list[tuple[str, float]]]:
        return {name: fake.calls for name, fake in self.sessions.items()}

    def exit_of(self, task: str) -> TaskExit | None:
        return self.supervisor.runs[self.task_ids[task]].exit

    def result(self) -> JobResult:
        assert self.supervisor.is_done()
        return self.supervisor.result()


@pytest.fixture
def job(tmp_path: Path) -> Iterator[Job]:
    """A DMLC job (scheduler@launcher, server.0@h1, worker.0@h1, worker.1@h2), all started."""
    job = Job(plan_for(), tmp_path, FakeClock())
    job.start_all()
    yield job
    for run in job.supervisor.runs.values():
        run.log.close()


# ---- success --------------------------------------------------------------------------------


def test_servers_linger_after_every_worker_succeeds_then_are_stopped(job: Job) -> None:
    job.advance_to(1.0)
    job.deliver(job.exited("worker.0"))
    job.advance_to(3.0)
    job.deliver(job.exited("worker.1"))
    job.advance_to(3.0 + LINGER_S - 0.5)
    assert job.calls() == {"launcher": [], "h1": [], "h2": []}

    job.advance_to(3.0 + LINGER_S)
    assert job.calls() == {"launcher": [(STOP, 8.0)], "h1": [(STOP, 8.0)], "h2": []}

    job.deliver(job.stopped("scheduler"), job.stopped("server.0"))
    result = job.result()
    assert result.state is JobState.SUCCEEDED
    assert result.exit_code == ExitCode.OK
    assert result.root_cause is None
    assert result.stopped_count == 2
    assert job.console.closed == [
        "worker.0@h1",
        "worker.1@h2",
        "scheduler@launcher",
        "server.0@h1",
    ]


def test_servers_that_exit_by_themselves_during_the_linger_are_never_stopped(job: Job) -> None:
    job.advance_to(1.0)
    job.deliver(job.exited("worker.0"), job.exited("worker.1"))
    job.advance_to(4.0)
    job.deliver(job.exited("scheduler"), job.exited("server.0"))
    job.advance_to(100.0)

    assert job.calls() == {"launcher": [], "h1": [], "h2": []}
    result = job.result()
    assert (result.state, result.exit_code, result.stopped_count) == (JobState.SUCCEEDED, 0, 0)


def test_tasks_that_never_exit_by_themselves_are_stopped_as_soon_as_the_workers_succeed(
    tmp_path: Path,
) -> None:
    plan = plan_for(Framework.TF)
    assert not plan.others_exit_by_themselves
    job = Job(plan, tmp_path, FakeClock())
    job.start_all()
    job.advance_to(2.0)
    job.deliver(job.exited("worker.0"), job.exited("worker.1"))

    assert job.calls() == {"h1": [(STOP, 2.0)], "h2": []}
    job.deliver(job.stopped("ps.0"))
    result = job.result()
    assert (result.state, result.exit_code, result.stopped_count) == (JobState.SUCCEEDED, 0, 1)


# ---- failure, stop, kill, give up -------------------------------------------------------------


def test_a_failing_worker_is_the_root_cause_and_each_live_host_is_stopped_once(job: Job) -> None:
    job.deliver(job.output("worker.1", b"Traceback (most recent call last):\n", is_stderr=True))
    job.deliver(job.output("worker.1", b"ValueError: bad batch\n", is_stderr=True))
    job.advance_to(2.0)
    job.deliver(job.exited("worker.1", code=3))
    assert job.calls() == {"launcher": [(STOP, 2.0)], "h1": [(STOP, 2.0)], "h2": []}

    job.advance_to(2.0 + GRACE_S)
    job.deliver(job.stopped("scheduler"), job.stopped("server.0"), job.stopped("worker.0"))
    assert job.calls() == {"launcher": [(STOP, 2.0)], "h1": [(STOP, 2.0)], "h2": []}

    result = job.result()
    assert result.state is JobState.FAILED
    assert result.exit_code == 3
    assert result.stopped_count == 3
    root = result.root_cause
    assert root is not None
    assert (root.label, root.host, root.exit_code, root.pid) == ("worker.1@h2", "h2", 3, 103)
    assert root.stderr_tail == ("Traceback (most recent call last):", "ValueError: bad batch")
    assert root.describe() == "exited with code 3"


def test_tasks_still_running_after_the_grace_are_killed(job: Job) -> None:
    job.advance_to(2.0)
    job.deliver(job.exited("worker.1", code=3))
    job.advance_to(2.0 + KILL_DUE_S)
    assert job.calls() == {"launcher": [(STOP, 2.0)], "h1": [(STOP, 2.0)], "h2": []}

    job.advance_to(2.0 + KILL_DUE_S + 0.5)
    kill_at = 2.0 + KILL_DUE_S + 0.5
    assert job.calls() == {
        "launcher": [(STOP, 2.0), (KILL, kill_at)],
        "h1": [(STOP, 2.0), (KILL, kill_at)],
        "h2": [],
    }
    job.deliver(*(job.stopped(t, signal.SIGKILL) for t in ("scheduler", "server.0", "worker.0")))
    result = job.result()
    assert (result.exit_code, result.stopped_count) == (3, 3)


def test_gives_up_on_a_host_that_never_confirms_its_tasks_stopped(job: Job) -> None:
    job.advance_to(2.0)
    job.deliver(job.exited("worker.1", code=3))
    job.advance_to(3.0)
    job.deliver(job.stopped("scheduler"))
    kill_at = 2.0 + KILL_DUE_S + 0.5
    job.advance_to(kill_at)
    job.advance_to(kill_at + GIVE_UP_AFTER_KILL_S)
    assert job.exit_of("server.0") is None
    assert job.exit_of("worker.0") is None

    job.advance_to(kill_at + GIVE_UP_AFTER_KILL_S + 0.5)
    assert job.calls() == {
        "launcher": [(STOP, 2.0)],
        "h1": [(STOP, 2.0), (KILL, kill_at)],
        "h2": [],
    }
    given_up = (
        "h1 did not confirm that its tasks were stopped; "
        "its agent stops them by itself when the connection drops"
    )
    for task in ("server.0", "worker.0"):
        exit = job.exit_of(task)
        assert exit is not None
        assert (exit.reason, exit.stopped_by_dtrain, exit.detail) == ("lost", True, given_up)
        assert not exit.failed
    result = job.result()
    assert result.root_cause is not None
    assert result.root_cause.label == "worker.1@h2"
    assert (result.exit_code, result.stopped_count) == (3, 3)


def test_a_failure_after_the_job_started_stopping_is_not_the_root_cause(job: Job) -> None:
    job.advance_to(2.0)
    job.deliver(job.exited("worker.1", code=3))
    job.advance_to(3.0)
    job.deliver(job.exited("server.0", code=1), job.exited("worker.0", signum=signal.SIGSEGV))
    job.deliver(job.stopped("scheduler"))

    result = job.result()
    assert result.state is JobState.FAILED
    assert result.root_cause is not None
    assert result.root_cause.label == "worker.1@h2"
    assert result.exit_code == 3
    assert job.calls()["h1"] == [(STOP, 2.0)]


def test_a_server_failing_as_it_is_stopped_after_success_keeps_the_job_succeeded(
    job: Job,
) -> None:
    job.advance_to(1.0)
    job.deliver(job.exited("worker.0"), job.exited("worker.1"))
    job.advance_to(1.0 + LINGER_S)
    job.deliver(job.exited("server.0", code=1), job.stopped("scheduler"))

    result = job.result()
    assert (result.state, result.exit_code, result.root_cause) == (JobState.SUCCEEDED, 0, None)


def test_a_server_crashing_during_the_linger_fails_the_job(job: Job) -> None:
    job.advance_to(1.0)
    job.deliver(job.exited("worker.0"), job.exited("worker.1"))
    job.advance_to(2.0)
    job.deliver(job.exited("server.0", code=1))

    assert job.calls() == {"launcher": [(STOP, 2.0)], "h1": [], "h2": []}
    job.deliver(job.stopped("scheduler"))
    result = job.result()
    assert result.state is JobState.FAILED
    assert result.root_cause is not None
    assert result.root_cause.label == "server.0@h1"
    assert (result.exit_code, result.stopped_count) == (1, 1)


@pytest.mark.parametrize(
    ("exited", "exit_code", "described"),
    [
        ({"code": 7}, 7, "exited with code 7"),
        ({"code": None, "signum": signal.SIGSEGV}, 139, "died of SIGSEGV"),
        (
            {"code": None, "signum": signal.SIGKILL},
            137,
            "was killed by SIGKILL from outside dtrain",
        ),
        (
            {"code": 127, "reason": "spawn-failed", "detail": "cannot run python: not found"},
            127,
            "could not start: cannot run python: not found",
        ),
        (
            {"code": None, "signum": signal.SIGTERM, "reason": "traceback-hang", "detail": "E"},
            1,
            "printed an unhandled Python traceback and then hung instead of exiting (E); "
            "dtrain stopped it",
        ),
    ],
)
def test_the_root_cause_decides_the_exit_code(
    job: Job, exited: dict[str, Any], exit_code: int, described: str
) -> None:
    job.deliver(job.exited("worker.0", **exited))
    job.deliver(*(job.stopped(t) for t in ("scheduler", "server.0", "worker.1")))

    result = job.result()
    assert result.root_cause is not None
    assert result.root_cause.label == "worker.0@h1"
    assert result.root_cause.describe() == described
    assert result.exit_code == exit_code


# ---- lost hosts ------------------------------------------------------------------------------


def test_a_host_silent_for_longer_than_the_lease_is_lost_with_exit_code_255(job: Job) -> None:
    job.advance_to(1.0)
    job.sessions["h2"].go_silent()
    job.advance_to(1.0 + LEASE_S)
    assert job.exit_of("worker.1") is None

    job.advance_to(17.0)
    lost = job.exit_of("worker.1")
    assert lost is not None
    assert lost.reason == "lost"
    assert lost.detail == "no heartbeat from h2 for 16s (host down or network partitioned)"
    assert not lost.stopped_by_dtrain
    assert job.calls() == {"launcher": [(STOP, 17.0)], "h1": [(STOP, 17.0)], "h2": []}

    job.deliver(*(job.stopped(t) for t in ("scheduler", "server.0", "worker.0")))
    result = job.result()
    assert result.state is JobState.FAILED
    assert result.exit_code == 255  # ExitCode.HOST_LOST
    assert result.root_cause == lost
    assert lost.describe() == (
        "was lost: no heartbeat from h2 for 16s (host down or network partitioned)"
    )


def test_a_host_with_its_own_lease_is_lost_after_that_lease_and_the_others_keep_theirs(
    tmp_path: Path,
) -> None:
    job = Job(plan_for(), tmp_path, FakeClock(), host_leases={"h2": 4.0})
    job.start_all()
    job.advance_to(1.0)
    job.sessions["h1"].go_silent()
    job.sessions["h2"].go_silent()
    job.advance_to(4.9)
    assert job.exit_of("worker.1") is None
    job.advance_to(5.2)
    lost = job.exit_of("worker.1")
    assert lost is not None and lost.reason == "lost"
    assert lost.detail == "no heartbeat from h2 for 4s (host down or network partitioned)"
    assert job.exit_of("worker.0") is None  # h1 keeps the common lease
    for run in job.supervisor.runs.values():
        run.log.close()


@pytest.mark.parametrize(
    ("agent_stderr", "detail"),
    [
        (
            "Warning: Permanently added 'h2' to the list of known hosts.\n"
            "bash: line 1: python3: command not found\n",
            "the connection to h2 closed (bash: line 1: python3: command not found)",
        ),
        ("", "the connection to h2 closed"),
    ],
)
def test_a_closed_link_loses_the_hosts_tasks_with_the_agents_last_stderr_line(
    job: Job, agent_stderr: str, detail: str
) -> None:
    job.sessions["h2"].link.stderr = agent_stderr
    job.advance_to(4.0)
    job.deliver(job.link_closed("h2"))

    assert job.calls() == {"launcher": [(STOP, 4.0)], "h1": [(STOP, 4.0)], "h2": []}
    job.deliver(*(job.stopped(t) for t in ("scheduler", "server.0", "worker.0")))
    result = job.result()
    assert result.root_cause is not None
    assert (result.root_cause.label, result.root_cause.reason) == ("worker.1@h2", "lost")
    assert result.root_cause.detail == detail
    assert result.exit_code == 255


def test_a_link_that_closes_while_the_job_stops_counts_as_stopped_not_failed(job: Job) -> None:
    job.advance_to(2.0)
    job.deliver(job.exited("worker.1", code=3))
    job.advance_to(3.0)
    job.deliver(job.link_closed("h1"), job.stopped("scheduler"))

    server = job.exit_of("server.0")
    assert server is not None
    assert (server.reason, server.stopped_by_dtrain, server.failed) == ("lost", True, False)
    result = job.result()
    assert result.root_cause is not None
    assert result.root_cause.label == "worker.1@h2"
    assert (result.exit_code, result.stopped_count) == (3, 3)


# ---- timeout and interrupts ------------------------------------------------------------------


def test_the_timeout_stops_the_job_with_exit_124_and_names_the_running_tasks(
    tmp_path: Path,
) -> None:
    job = Job(plan_for(), tmp_path, FakeClock(), timeout_s=60.0)
    job.start_all()
    job.advance_to(10.0)
    job.deliver(job.exited("worker.0"))
    job.advance_to(59.5)
    assert job.console.notes == []
    assert job.calls() == {"launcher": [], "h1": [], "h2": []}

    job.advance_to(60.0)
    assert job.console.notes == [
        "the job reached its --timeout of 60s with 3 task(s) still running "
        "(scheduler@launcher, server.0@h1, worker.1@h2); stopping them"
    ]
    assert job.calls() == {"launcher": [(STOP, 60.0)], "h1": [(STOP, 60.0)], "h2": [(STOP, 60.0)]}

    job.deliver(*(job.stopped(t) for t in ("scheduler", "server.0", "worker.1")))
    result = job.result()
    assert result.state is JobState.TIMED_OUT
    assert result.exit_code == 124  # ExitCode.TIMEOUT
    assert result.root_cause is None
    assert result.stopped_count == 3


@pytest.mark.parametrize(("signum", "exit_code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_first_interrupt_stops_every_task_and_the_second_kills_at_once(
    job: Job, signum: int, exit_code: int
) -> None:
    job.advance_to(1.0)
    job.deliver(Interrupt(signum))
    everywhere = {"launcher": [(STOP, 1.0)], "h1": [(STOP, 1.0)], "h2": [(STOP, 1.0)]}
    assert job.calls() == everywhere

    job.advance_to(1.5)
    job.deliver(Interrupt(signum))
    assert job.calls() == {host: [*calls, (KILL, 1.5)] for host, calls in everywhere.items()}
    assert job.console.notes == [
        f"{signal.Signals(signum).name}: stopping every task (SIGTERM, SIGKILL after 5s); "
        "press Ctrl-C again to kill now",
        "killing every task now",
    ]

    job.deliver(job.exited("worker.0", code=1))  # a failure while stopping is not the cause
    job.deliver(*(job.stopped(t, signal.SIGKILL) for t in ("scheduler", "server.0", "worker.1")))
    result = job.result()
    assert result.state is JobState.INTERRUPTED
    assert result.exit_code == exit_code
    assert result.root_cause is None
    assert result.stopped_count == 3


def test_workers_an_agent_stopped_on_its_own_fail_the_job(job: Job) -> None:
    job.advance_to(20.0)  # dtrain sent no stop: the agent lost the launcher, or was signalled
    job.deliver(job.stopped("worker.0"), job.stopped("worker.1"))
    worker = job.exit_of("worker.0")
    assert worker is not None and worker.failed and not worker.stopped_by_dtrain
    job.deliver(*(job.stopped(t) for t in ("scheduler", "server.0")))
    result = job.result()
    assert result.state is JobState.FAILED
    assert result.root_cause is not None and result.root_cause.task == "worker.0"
    assert result.exit_code == 128 + signal.SIGTERM


def test_more_interrupts_kill_again_but_never_push_the_give_up_back(job: Job) -> None:
    job.deliver(Interrupt(signal.SIGINT))
    for now in (2.0, 3.0, 4.0):
        job.advance_to(now)
        job.deliver(Interrupt(signal.SIGINT))
    assert job.calls()["h2"] == [(STOP, 0.0), *((KILL, t) for t in (2.0, 3.0, 4.0))]
    job.advance_to(2.0 + GIVE_UP_AFTER_KILL_S + 0.1)  # counted from the first kill
    assert job.supervisor.is_done()


# ---- output -----------------------------------------------------------------------------------


def test_the_stderr_tail_keeps_its_byte_bound_and_the_log_keeps_everything(job: Job) -> None:
    data = b"".join(b"line %05d\n" % i for i in range(4000))  # 44000 bytes
    chunks = [data[:1000], data[1000:21000], data[21000:]]  # the middle one alone is too big
    job.deliver(*(job.output("worker.0", chunk, is_stderr=True) for chunk in chunks))

    assert bytes(job.supervisor.runs[job.task_ids["worker.0"]].stderr) == data[-STDERR_TAIL_BYTES:]
    assert job.console.output == [("worker.0@h1", True, chunk) for chunk in chunks]

    job.deliver(job.exited("worker.0", code=1))
    exit = job.exit_of("worker.0")
    assert exit is not None
    assert exit.stderr_tail == tuple(f"line {i:05d}" for i in range(3988, 4000))
    assert Path(exit.log_path).read_bytes() == data


def test_output_gives_its_budget_back_even_when_its_task_already_exited(job: Job) -> None:
    budget = OutputBudget()
    job.sessions["h1"].budget = budget
    budget.pending = 30  # what the session's reader took for the two frames below
    job.deliver(job.output("server.0", b"x" * 10))
    job.deliver(job.exited("worker.0"))
    job.deliver(job.output("worker.0", b"y" * 20))

    assert budget.pending == 0
    assert job.console.output == [("server.0@h1", False, b"x" * 10)]


def test_output_from_a_sessions_reader_is_written_there_and_dropped_after_its_exit(
    job: Job,
) -> None:
    """The supervisor takes each session's output on the session's reader thread (no queue):
    the log and console get it at once; an exit handled before it wins, as for queued frames."""
    ids = job.task_ids
    handler = job.sessions["h1"].output
    assert handler is not None
    job.start_all()
    handler(ids["worker.0"], proto.STDOUT, b"step 1\n")
    handler(ids["worker.0"], proto.STDERR, b"warning\n")
    job.deliver(job.exited("worker.0", code=3))
    handler(ids["worker.0"], proto.STDOUT, b"too late\n")

    assert job.console.output == [
        ("worker.0@h1", False, b"step 1\n"),
        ("worker.0@h1", True, b"warning\n"),
    ]
    exit = job.exit_of("worker.0")
    assert exit is not None and exit.stderr_tail == ("warning",)
    assert Path(exit.log_path).read_bytes() == b"step 1\nwarning\n"


def test_run_reads_the_queue_until_every_task_exited(tmp_path: Path) -> None:
    # Each clock reading moves 1s, and the timeout bounds the loop should the queue run dry.
    job = Job(plan_for(), tmp_path, FakeClock(step_s=1.0), timeout_s=30.0)
    events: list[Event] = [
        *(job.started(spec.name, 100 + i) for i, spec in enumerate(job.plan.tasks)),
        job.output("worker.0", b"step 1\n"),
        job.exited("worker.0"),
        job.exited("worker.1"),
        job.exited("server.0"),
        job.exited("scheduler"),
    ]
    for event in events:
        job.events.put(event)

    result = job.supervisor.run()

    assert result.state is JobState.SUCCEEDED
    assert result.exit_code == 0
    assert [(e.label, e.pid) for e in result.exits] == [
        ("scheduler@launcher", 100),
        ("server.0@h1", 101),
        ("worker.0@h1", 102),
        ("worker.1@h2", 103),
    ]
    assert job.calls() == {"launcher": [], "h1": [], "h2": []}
    assert (tmp_path / "worker.0.log").read_bytes() == b"step 1\n"
    assert job.console.output == [("worker.0@h1", False, b"step 1\n")]


# ---- stacks of a hung job -------------------------------------------------------------------

BUDGET_S = SupervisorOptions.stacks_budget_s
SILENCE_S = SupervisorOptions.hang_silence_s


class FakeStacks:
    """Stands in for the thread that takes every task's stack: the test says when it is done."""

    def __init__(self, clock: FakeClock) -> None:
        self.clock = clock
        self.started_at: list[float] = []
        self.done = False

    def start(self) -> None:
        self.started_at.append(self.clock.now)

    def is_done(self) -> bool:
        return self.done

    def summary(self) -> list[str]:
        return ["stacks: 1 task (worker.1@h2): in wait"] if self.done else ["stacks: none yet"]


def stacks_job(tmp_path: Path, timeout_s: float | None = None) -> tuple[Job, FakeStacks]:
    clock = FakeClock()
    stacks = FakeStacks(clock)
    job = Job(plan_for(), tmp_path, clock, timeout_s=timeout_s, stacks=stacks)
    job.start_all()
    return job, stacks


def test_a_timed_out_job_is_stopped_as_soon_as_its_stacks_are_in(tmp_path: Path) -> None:
    job, stacks = stacks_job(tmp_path, timeout_s=60.0)
    job.advance_to(60.0)
    assert stacks.started_at == [60.0]
    assert job.calls() == {"launcher": [], "h1": [], "h2": []}  # the stop waits for the stacks
    job.advance_to(61.0)
    stacks.done = True
    job.advance_to(61.2)
    assert job.calls()["h2"] == [(STOP, 61.2)]
    assert job.console.notes[-1] == "stacks: 1 task (worker.1@h2): in wait"
    job.deliver(*(job.stopped(t) for t in ("scheduler", "server.0", "worker.0", "worker.1")))
    assert job.result().state is JobState.TIMED_OUT


def test_stacks_that_do_not_come_hold_the_stop_back_only_for_the_budget(tmp_path: Path) -> None:
    job, stacks = stacks_job(tmp_path, timeout_s=60.0)
    job.advance_to(60.0)
    job.advance_to(60.0 + BUDGET_S - 0.1)
    assert job.calls()["h1"] == []
    job.advance_to(60.0 + BUDGET_S)
    assert job.calls()["h1"] == [(STOP, 60.0 + BUDGET_S)]
    assert job.console.notes[-1] == "stacks: none yet"
    assert stacks.started_at == [60.0]


def test_a_second_ctrl_c_kills_at_once_while_stacks_are_being_taken(tmp_path: Path) -> None:
    job, stacks = stacks_job(tmp_path)
    job.advance_to(SILENCE_S + 5.0)  # no output for longer than the silence: a hang
    job.deliver(Interrupt(signal.SIGINT))
    assert stacks.started_at == [SILENCE_S + 5.0]
    assert job.calls()["h2"] == []
    assert job.console.notes[0].startswith("SIGINT: taking every task's stack, then stopping")
    job.advance_to(SILENCE_S + 5.5)
    job.deliver(Interrupt(signal.SIGINT))
    assert job.calls()["h2"] == [(KILL, SILENCE_S + 5.5)]
    job.advance_to(SILENCE_S + 30.0)
    assert job.calls()["h2"] == [(KILL, SILENCE_S + 5.5)]  # no stop after the kill
    assert stacks.started_at == [SILENCE_S + 5.0]


def test_a_ctrl_c_on_a_job_that_just_printed_stops_it_without_stacks(tmp_path: Path) -> None:
    job, stacks = stacks_job(tmp_path)
    job.advance_to(SILENCE_S + 5.0)
    job.deliver(job.output("worker.0", b"step 10\n"))
    job.advance_to(SILENCE_S + 6.0)
    job.deliver(Interrupt(signal.SIGINT))
    assert stacks.started_at == []
    assert job.calls()["h2"] == [(STOP, SILENCE_S + 6.0)]


def test_a_task_hung_after_its_traceback_has_the_others_stacks_taken(tmp_path: Path) -> None:
    job, stacks = stacks_job(tmp_path)
    job.advance_to(30.0)
    job.deliver(job.exited("worker.0", code=None, signum=15, reason=proto.REASON_TRACEBACK_HANG))
    assert stacks.started_at == [30.0]
    assert job.calls()["h2"] == []
    stacks.done = True
    job.advance_to(30.5)
    assert job.calls()["h2"] == [(STOP, 30.5)]
    job.deliver(*(job.stopped(t) for t in ("scheduler", "server.0", "worker.1")))
    result = job.result()
    assert result.state is JobState.FAILED
    assert result.root_cause is not None and result.root_cause.task == "worker.0"


def test_an_ordinary_failure_stops_the_job_at_once_without_stacks(tmp_path: Path) -> None:
    job, stacks = stacks_job(tmp_path)
    job.advance_to(30.0)
    job.deliver(job.exited("worker.0", code=1))
    assert stacks.started_at == []
    assert job.calls()["h2"] == [(STOP, 30.0)]
