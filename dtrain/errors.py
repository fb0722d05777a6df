"""Errors a person can act on, and the exit codes dtrain returns.

Every error answers three questions: what failed, where, and what to do. Pure: imports only the
standard library.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass
from enum import IntEnum


class ExitCode(IntEnum):
    """dtrain's own exit codes; a failed job exits with its root-cause task's code instead."""

    OK = 0
    JOB_FAILED = 1
    USAGE = 2
    ENVIRONMENT = 3
    TIMEOUT = 124
    HOST_LOST = 255


def signal_exit_code(signum: int) -> int:
    """The shell's convention: death by signal N reads as exit code 128+N."""
    return 128 + signum


@dataclass(frozen=True)
class Problem:
    """One thing wrong on one host (or with one input), as it appears in text and JSON."""

    message: str
    host: str | None = None
    hint: str | None = None
    code: str = "error"

    def to_dict(self) -> dict[str, str | None]:
        return {"code": self.code, "host": self.host, "message": self.message, "hint": self.hint}


class DtrainError(Exception):
    """Base of every error dtrain reports without a traceback."""

    exit_code: int = ExitCode.ENVIRONMENT
    code: str = "error"

    def __init__(
        self,
        what: str,
        *,
        location: str | None = None,
        hint: str | None = None,
        problems: Sequence[Problem] = (),
        exit_code: int | None = None,
        host: str | None = None,
    ) -> None:
        super().__init__(what)
        self.what = what
        self.host = host
        self.location = location
        self.hint = hint
        self.problems = tuple(problems)
        if exit_code is not None:
            self.exit_code = exit_code

    def __str__(self) -> str:
        what = f"{self.host}: {self.what}" if self.host else self.what
        head = f"{self.location}: {what}" if self.location else f"dtrain: {what}"
        lines = [head]
        for problem in self.problems:
            named = not problem.host or problem.message.startswith(problem.host)
            where = "" if named else f"{problem.host}: "
            lines.append(f"  {where}{problem.message}")
            if problem.hint:
                lines.append(f"    hint: {problem.hint}")
        if self.hint:
            lines.append(f"  hint: {self.hint}")
        return "\n".join(lines)

    def to_problems(self) -> list[Problem]:
        """The error as JSON-able problems: its own per-host problems, or itself as one."""
        if self.problems:
            return list(self.problems)
        message = f"{self.location}: {self.what}" if self.location else self.what
        return [Problem(message=message, host=self.host, hint=self.hint, code=self.code)]


class UsageError(DtrainError):
    """Bad flags or input files: nothing was started."""

    exit_code = ExitCode.USAGE
    code = "usage"


class HostsFileError(UsageError):
    code = "hosts_file"


class ConnectError(DtrainError):
    """A host could not be reached or would not let us in; nothing was started anywhere."""

    code = "connect"


class RemoteError(DtrainError):
    """A host answered, but could not do what was asked (no python3, no workdir, sync failed)."""

    code = "remote"


class PreflightFailed(DtrainError):
    code = "preflight"
