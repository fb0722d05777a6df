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


MAX_NAMED = 3  # hosts named in a grouped line before "and N more"

# C0 and C1 control characters, DEL too, as Python escapes them: \n, \t, \x1b, \x85.
CONTROL_ESCAPES = {code: repr(chr(code))[1:-1] for code in (*range(0x20), *range(0x7F, 0xA0))}


def one_line(text: str) -> str:
    """`text` with its control characters escaped: a job id or a command line someone else
    chose (any process's argv, any DTRAIN_JOB_ID) stays one line, and cannot move the cursor."""
    return text.translate(CONTROL_ESCAPES)


@dataclass(frozen=True)
class Problem:
    """One thing wrong on one host (or with one input), as it appears in text and JSON.

    Problems with the same `code` and `reason` (the message without the host) print as one
    line naming their hosts (`subject`, else `host`), with `group_hint` when their hints differ.
    """

    message: str
    host: str | None = None
    hint: str | None = None
    code: str = "error"
    reason: str | None = None
    subject: str | None = None
    group_hint: str | None = None

    def to_dict(self) -> dict[str, str | None]:
        return {"code": self.code, "host": self.host, "message": self.message, "hint": self.hint}


def group_problems(problems: Sequence[Problem]) -> list[list[Problem]]:
    """Problems with one code and reason together, in order of first appearance; a problem
    without a reason stands alone."""
    groups: dict[object, list[Problem]] = {}
    for index, problem in enumerate(problems):
        key = (problem.code, problem.reason) if problem.reason is not None else index
        groups.setdefault(key, []).append(problem)
    return list(groups.values())


def named_list(names: Sequence[str], limit: int = MAX_NAMED) -> str:
    """`a, b, c and 1997 more`, or `a and b`."""
    if len(names) <= limit:
        return names[0] if len(names) == 1 else f"{', '.join(names[:-1])} and {names[-1]}"
    return f"{', '.join(names[:limit])} and {len(names) - limit} more"


def group_line(group: Sequence[Problem]) -> str:
    """`2000 hosts: connection refused: a, b, c and 1997 more`."""
    names = named_list([p.subject or p.host or "?" for p in group])
    return f"{len(group)} hosts: {group[0].reason}: {names}"


def group_hint(group: Sequence[Problem]) -> str | None:
    """The hint every problem of the group shares, else the group's own."""
    return group[0].hint if len({p.hint for p in group}) == 1 else group[0].group_hint


def problem_lines(problems: Sequence[Problem]) -> list[str]:
    """Indented text for per-host problems: one line (and hint) per distinct reason."""
    lines = []
    for group in group_problems(problems):
        first = group[0]
        if len(group) == 1:
            named = not first.host or first.message.lstrip("[").startswith(first.host)
            where = "" if named else f"{first.host}: "
            lines.append(f"  {where}{first.message}")
            hint = first.hint
        else:
            lines.append(f"  {group_line(group)}")
            hint = group_hint(group)
        if hint:
            lines.append(f"    hint: {hint}")
    return lines


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
        lines = [head, *problem_lines(self.problems)]
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
