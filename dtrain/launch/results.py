"""How a job ended: each task's exit with its evidence, and the job's state and exit code. Pure."""

from __future__ import annotations

import signal
from dataclasses import dataclass
from enum import Enum

from dtrain.errors import ExitCode, Problem, signal_exit_code
from dtrain.remote import proto


class JobState(str, Enum):
    SUCCEEDED = "succeeded"
    FAILED = "failed"
    INTERRUPTED = "interrupted"
    TIMED_OUT = "timed_out"


@dataclass(frozen=True)
class TaskExit:
    """How one task ended, with the evidence a person needs to act on it."""

    task: str
    label: str
    host: str
    exit_code: int | None
    signal: int | None
    started_at: float | None
    finished_at: float
    stopped_by_dtrain: bool
    log_path: str
    stderr_tail: tuple[str, ...] = ()
    reason: str | None = None
    detail: str | None = None
    pid: int | None = None
    log_error: str | None = None  # why the log stopped being written (a full disk)

    @property
    def failed(self) -> bool:
        if self.stopped_by_dtrain:
            return False
        return self.reason is not None or self.signal is not None or self.exit_code != 0

    @property
    def status_code(self) -> int:
        """The exit code dtrain reports when this task is the root cause."""
        if self.reason == proto.REASON_LOST:
            return ExitCode.HOST_LOST
        if self.reason == proto.REASON_TRACEBACK_HANG:
            return 1
        if self.signal is not None:
            return signal_exit_code(self.signal)
        return self.exit_code if self.exit_code is not None else ExitCode.JOB_FAILED

    def describe(self) -> str:
        if self.reason == proto.REASON_LOST:
            return f"was lost: {self.detail}"
        if self.reason == proto.REASON_SPAWN_FAILED:
            return f"could not start: {self.detail}"
        if self.reason == proto.REASON_TRACEBACK_HANG:
            return (
                "printed an unhandled Python traceback and then hung instead of exiting "
                f"({self.detail}); dtrain stopped it"
            )
        if self.signal is not None:
            name = signal_name(self.signal)
            if self.stopped_by_dtrain:
                return f"was stopped by dtrain ({name})"
            if self.is_killed_from_outside:
                return f"was killed by {name} from outside dtrain"
            return f"died of {name}"
        return f"exited with code {self.exit_code}"

    @property
    def is_killed_from_outside(self) -> bool:
        """Ended by SIGTERM/SIGKILL that dtrain did not send: `dtrain kill`, a person, the OOM
        killer."""
        return (
            not self.stopped_by_dtrain
            and self.reason is None
            and self.signal in (signal.SIGTERM, signal.SIGKILL)
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "task": self.task,
            "label": self.label,
            "host": self.host,
            "pid": self.pid,
            "exit_code": self.exit_code,
            "signal": self.signal,
            "started_at": self.started_at,
            "finished_at": self.finished_at,
            "stopped_by_dtrain": self.stopped_by_dtrain,
            "failed": self.failed,
            "reason": self.reason,
            "detail": self.detail,
            "log": self.log_path,
            "log_error": self.log_error,
        }


def signal_name(signum: int) -> str:
    try:
        return signal.Signals(signum).name
    except ValueError:
        return f"signal {signum}"


@dataclass(frozen=True)
class JobResult:
    job_id: str
    state: JobState
    exits: tuple[TaskExit, ...]
    root_cause: TaskExit | None
    started_at: float
    ended_at: float
    log_dir: str
    interrupt_signal: int | None = None
    timeout_s: float | None = None

    @property
    def exit_code(self) -> int:
        if self.state is JobState.SUCCEEDED:
            return ExitCode.OK
        if self.state is JobState.TIMED_OUT:
            return ExitCode.TIMEOUT
        if self.state is JobState.INTERRUPTED and self.interrupt_signal is not None:
            return signal_exit_code(self.interrupt_signal)
        if self.root_cause is not None:
            return self.root_cause.status_code
        return ExitCode.JOB_FAILED

    @property
    def stopped_count(self) -> int:
        return sum(1 for e in self.exits if e.stopped_by_dtrain)

    def problems(self) -> list[Problem]:
        """The job's root cause as `--json` reports it: the first failure and its log."""
        cause = self.root_cause
        if cause is None:
            return []
        return [
            Problem(
                f"{cause.label} {cause.describe()}",
                host=cause.host,
                code="task_failed",
                hint=f"full log: {cause.log_path}",
            )
        ]

    def to_dict(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "state": self.state.value,
            "exit_code": self.exit_code,
            "started_at": self.started_at,
            "ended_at": self.ended_at,
            "log_dir": self.log_dir,
            "root_cause": self.root_cause.to_dict() if self.root_cause else None,
            "interrupt_signal": self.interrupt_signal,
            "tasks": [e.to_dict() for e in self.exits],
        }
