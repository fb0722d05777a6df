"""Whether a failed attempt of a job is started again, after how long, and on which hosts. Pure.

A restart is of the whole job: every task of the attempt is stopped and gone before the next
attempt starts every role on every host again. What can never succeed by itself is never
restarted: a person's stop (Ctrl-C, SIGTERM, `dtrain kill`), the deadline, a command that
cannot run (126, 127), a failure at start-up (a task could not start, or failed within the
restart window of the attempt's start), and the exit codes the user names. The caller passes
every fact in (the attempt's result, the clock's readings, the random draw for the jitter).
"""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dtrain.errors import UsageError
from dtrain.launch.results import JobResult, JobState, TaskExit
from dtrain.plan.hosts import Host
from dtrain.remote import proto

NEVER_RESTART_CODES = frozenset({126, 127})  # the shell's "cannot execute" and "not found"
JITTER = 0.2  # each delay is drawn from +-20% of the doubled one (never past the cap)
MAX_DOUBLINGS = 62  # 2**62 times any delay is past any cap: no float overflow


@dataclass(frozen=True, slots=True)
class RestartPolicy:
    """The restart flags: --max-restarts, --restart-delay, --max-restart-delay,
    --restart-window, --no-restart-on, --min-hosts, --host-cooldown."""

    max_restarts: int = 0
    delay_s: float = 10.0
    max_delay_s: float = 300.0
    window_s: float = 5.0
    no_restart_on: frozenset[int] = frozenset()
    min_hosts: int | None = None
    host_cooldown_s: float = 300.0

    @property
    def restarts(self) -> bool:
        return self.max_restarts > 0


@dataclass(frozen=True, slots=True)
class Verdict:
    """Whether to start the job again, and why (the cause, or why it must not be restarted)."""

    restart: bool
    why: str


@dataclass(frozen=True, slots=True)
class DroppedHost:
    """A host left out of the next attempts: which, why, and when (the caller's clock)."""

    key: str
    display: str
    why: str
    dropped_at: float

    def to_dict(self) -> dict[str, object]:
        return {"host": self.display, "why": self.why, "dropped_at": self.dropped_at}


def parse_codes(text: str, flag: str = "--no-restart-on") -> frozenset[int]:
    """`1,3,137` -> the exit codes; anything else is one line naming the flag."""
    codes = set()
    for word in text.split(","):
        word = word.strip()
        if not word.isdigit() or not 1 <= int(word) <= 255:
            raise UsageError(
                f"{flag} {text!r}: {word!r} is not an exit code (1-255)",
                hint=f"give exit codes separated by commas, e.g. {flag} 3,137",
            )
        codes.add(int(word))
    return frozenset(codes)


def validate(policy: RestartPolicy, host_count: int | None, allocating: bool = False) -> None:
    """The flags that cannot work together, before anything connects (exit 2)."""
    if policy.min_hosts is not None and not policy.restarts:
        raise UsageError(
            "--min-hosts only matters when the job is restarted",
            hint="add --max-restarts N, or drop --min-hosts",
        )
    if policy.min_hosts is not None and host_count is not None and policy.min_hosts > host_count:
        raise UsageError(
            f"--min-hosts {policy.min_hosts}: the job has only {host_count} host(s)",
            hint=f"pass --min-hosts {host_count} or fewer",
        )
    if allocating and policy.restarts:
        raise UsageError(
            "--max-restarts with --nodes: a restart would need a new allocation",
            hint="run dtrain inside salloc or sbatch: its restarts reuse that allocation",
        )


def verdict(
    policy: RestartPolicy, restarts_done: int, result: JobResult, tasks_started_at: float | None
) -> Verdict:
    """Whether the attempt that ended with `result` is followed by another one.

    `tasks_started_at`: when every task of the attempt had started (wall clock), None if they
    never all did."""
    if result.state is JobState.SUCCEEDED:
        return Verdict(False, "the job succeeded")
    if result.state is JobState.INTERRUPTED:
        return Verdict(
            False, "it was stopped on purpose (a signal or dtrain kill): never restarted"
        )
    if result.state is JobState.TIMED_OUT:
        return Verdict(False, "it reached --timeout: never restarted")
    cause = result.root_cause
    if cause is None:
        return Verdict(False, "no task failed on its own")
    never = _never_restarted(policy, cause, tasks_started_at)
    if never is not None:
        return Verdict(False, never)
    if restarts_done >= policy.max_restarts:
        return Verdict(False, f"no restarts left (--max-restarts {policy.max_restarts})")
    return Verdict(True, f"{cause.label} {cause.describe()}")


def _never_restarted(
    policy: RestartPolicy, cause: TaskExit, tasks_started_at: float | None
) -> str | None:
    """Why this root cause can never be fixed by starting again, or None."""
    if cause.reason == proto.REASON_SPAWN_FAILED or tasks_started_at is None:
        return "a task could not start (a start-up failure): never restarted"
    if cause.reason is None and cause.signal is None and cause.exit_code in NEVER_RESTART_CODES:
        return f"exit code {cause.exit_code} means the command cannot run: never restarted"
    if cause.status_code in policy.no_restart_on:
        return f"exit code {cause.status_code} is in --no-restart-on: never restarted"
    after_s = cause.finished_at - tasks_started_at
    if cause.reason != proto.REASON_LOST and after_s < policy.window_s:
        return (
            f"it failed {max(after_s, 0.0):.1f}s after the start, within --restart-window "
            f"{policy.window_s:g}s (a start-up failure): never restarted"
        )
    return None


def backoff_s(policy: RestartPolicy, restart: int, draw: float) -> float:
    """The wait before restart number `restart` (1 for the first): --restart-delay doubled
    each time up to --max-restart-delay, times a jitter from `draw` in [0, 1)."""
    doubled = policy.delay_s * 2.0 ** min(max(restart - 1, 0), MAX_DOUBLINGS)
    base = min(policy.max_delay_s, doubled)
    jittered = base * (1.0 + JITTER * (2.0 * min(max(draw, 0.0), 1.0) - 1.0))
    return min(policy.max_delay_s, max(0.0, jittered))


def hosts_to_try(
    hosts: Sequence[Host], dropped: Mapping[str, DroppedHost], now: float, cooldown_s: float
) -> tuple[Host, ...]:
    """The hosts the next attempt asks for: all but those dropped less than a cool-down ago."""
    return tuple(
        h for h in hosts if h.key not in dropped or now - dropped[h.key].dropped_at >= cooldown_s
    )


def lost_hosts(result: JobResult) -> dict[str, str]:
    """The hosts an attempt lost (by display name), with why: the tasks that were lost say."""
    lost: dict[str, str] = {}
    for exit in result.exits:
        if exit.reason == proto.REASON_LOST:
            lost.setdefault(exit.host, exit.detail or "lost")
    return lost


def enough_hosts(policy: RestartPolicy, answering: int) -> bool:
    """Whether the job may go on with `answering` hosts (only with --min-hosts)."""
    return policy.min_hosts is not None and answering >= max(policy.min_hosts, 1)


def attempt_record(
    attempt: int,
    started_at: float,
    hosts: Sequence[str],
    dropped: Sequence[DroppedHost],
    log_dir: str,
    result: JobResult | None = None,
    error: str | None = None,
    error_code: int | None = None,
) -> dict[str, object]:
    """One attempt as job.json lists it: when, where, what ended it, and its exit code."""
    cause = result.root_cause if result is not None else None
    return {
        "attempt": attempt,
        "restart_count": attempt - 1,
        "started_at": started_at,
        "ended_at": result.ended_at if result is not None else None,
        "hosts": list(hosts),
        "dropped_hosts": [d.to_dict() for d in dropped],
        "state": result.state.value if result is not None else "failed",
        "exit_code": result.exit_code if result is not None else error_code,
        "root_cause": cause.to_dict() if cause is not None else None,
        "error": error,
        "log_dir": log_dir,
    }
