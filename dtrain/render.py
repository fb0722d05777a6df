"""Plans, results and errors as text a person reads, or as one JSON document. Pure."""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import Any

from dtrain.errors import Problem
from dtrain.plan import JobPlan
from dtrain.results import JobResult, JobState, TaskExit

JSON_VERSION = 1
MAX_PARTIAL_LINE = 1 << 16


class LinePrefixer:
    """Prefixes every line of one task's stream, holding back a partial last line."""

    def __init__(self, prefix: bytes) -> None:
        self.prefix = prefix
        self.partial = b""

    def feed(self, data: bytes) -> bytes:
        data = self.partial + data
        cut = data.rfind(b"\n")
        if cut < 0:
            if len(data) < MAX_PARTIAL_LINE:
                self.partial = data
                return b""
            cut = len(data) - 1
            data += b"\n"
        complete, self.partial = data[: cut + 1], data[cut + 1 :]
        body = complete[:-1].replace(b"\n", b"\n" + self.prefix)
        return self.prefix + body + b"\n"

    def flush(self) -> bytes:
        """The held-back partial line, terminated, at the end of the stream."""
        if not self.partial:
            return b""
        out = self.prefix + self.partial + b"\n"
        self.partial = b""
        return out


def envelope(
    command: str,
    exit_code: int,
    data: object,
    problems: Sequence[Problem] = (),
    status: str | None = None,
) -> dict[str, Any]:
    """The one JSON document every `--json` command prints."""
    if status is None:
        status = "ok" if exit_code == 0 else "failed"
    return {
        "dtrain_json": JSON_VERSION,
        "command": command,
        "status": status,
        "exit_code": exit_code,
        "data": data,
        "errors": [p.to_dict() for p in problems],
    }


def quote_env(env: Mapping[str, str]) -> str:
    return " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())


def plan_text(plan: JobPlan, note: str | None = None) -> str:
    """What `launch --dry-run` prints: one row per task, then each task's environment."""
    lines = [f"job {plan.job_id}  framework {plan.framework.value}  workdir {plan.workdir}"]
    if plan.rendezvous is not None:
        lines.append(f"rendezvous {plan.rendezvous}")
    if note:
        lines.append(note)
    rows = [("TASK", "HOST", "ADDRESS", "ENDPOINT", "COMMAND")]
    for task in plan.tasks:
        host = f"{task.host.name} (this machine)" if task.host.is_local else task.host.name
        rows.append(
            (
                task.name,
                host,
                task.address,
                str(task.endpoint) if task.endpoint else "-",
                shlex.join(task.argv),
            )
        )
    lines.append("")
    lines += _table(rows)
    lines.append("")
    lines.append("environment added to each task (on top of its host's login environment):")
    for task in plan.tasks:
        lines.append(f"  {task.name}: {quote_env(task.env)}")
    return "\n".join(lines) + "\n"


def _table(rows: Sequence[Sequence[str]]) -> list[str]:
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=False)]
        out.append("  ".join([*cells, row[-1]]).rstrip())
    return out


def _clock(timestamp: float) -> str:
    return datetime.fromtimestamp(timestamp).strftime("%H:%M:%S")


def result_text(result: JobResult) -> str:
    """The closing summary: root cause first, with its evidence and what was stopped."""
    seconds = result.ended_at - result.started_at
    count = len(result.exits)
    if result.state is JobState.SUCCEEDED:
        return (
            f"dtrain: job {result.job_id} succeeded: {count} task{'s' if count != 1 else ''} "
            f"in {seconds:.1f}s; logs in {result.log_dir}/\n"
        )
    stopped = result.stopped_count
    if result.state is JobState.INTERRUPTED:
        return (
            f"dtrain: job {result.job_id} interrupted by signal {result.interrupt_signal}: "
            f"stopped {stopped} task{'s' if stopped != 1 else ''}; logs in {result.log_dir}/\n"
        )
    if result.state is JobState.TIMED_OUT:
        return (
            f"dtrain: job {result.job_id} timed out after {result.timeout_s:g}s (--timeout): "
            f"stopped {stopped} task{'s' if stopped != 1 else ''}; logs in {result.log_dir}/\n"
        )
    lines = []
    cause = result.root_cause
    if cause is None:
        lines.append(f"dtrain: job {result.job_id} failed")
    else:
        lines += root_cause_lines(result.job_id, cause)
    others = [e for e in result.exits if e.failed and e is not cause]
    if others:
        lines.append(
            f"  then {len(others)} more task{'s' if len(others) != 1 else ''} failed: "
            + ", ".join(f"{e.label} ({e.describe()})" for e in others[:5])
        )
    if stopped:
        lines.append(
            f"  {stopped} other task{'s were' if stopped != 1 else ' was'} stopped by dtrain "
            "after this failure"
        )
    return "\n".join(lines) + "\n"


def root_cause_lines(job_id: str, cause: TaskExit) -> list[str]:
    lines = [
        f"dtrain: job {job_id} failed: {cause.label} {cause.describe()} at "
        f"{_clock(cause.finished_at)} (first failure)"
    ]
    if cause.stderr_tail:
        lines.append("  last stderr lines:")
        lines += [f"    | {line}" for line in cause.stderr_tail]
    lines.append(f"  full log: {cause.log_path}")
    return lines
