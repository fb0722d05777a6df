"""Plans, results and errors as text a person reads, or as one JSON document. Pure.

This package holds what `dtrain launch` prints; `render.processes` (ps, kill, stacks) and
`render.doctor` are their own modules so that a launch does not import what only those
commands need (the doctor's judge alone is ~25 ms of every launch's start).
"""

from __future__ import annotations

import math
import shlex
from collections.abc import Mapping, Sequence
from datetime import datetime
from typing import TYPE_CHECKING, Any

from dtrain.errors import Problem, one_line
from dtrain.plan.spec import JobPlan

if TYPE_CHECKING:  # a job's results load with its supervisor, after the first connection
    from dtrain.launch.results import JobResult, TaskExit

JSON_VERSION = 1
MAX_PARTIAL_LINE = 1 << 16


class LinePrefixer:
    """Shows one task's stream as a terminal would, one prefixed line at a time.

    Complete lines are prefixed as they come. A partial line is shown once its stream has been
    idle `idle_s` (the caller passes the time in and calls `idle`); the rest of that line then
    follows as a line of its own, and a bare newline after it adds nothing. A `\\r` update
    (progress bars) shows what follows the last `\\r`, at most one update per `update_s`.
    """

    def __init__(self, prefix: bytes, idle_s: float = 0.2, update_s: float = 0.25) -> None:
        self.prefix = prefix
        self.separator = b"\n" + prefix
        self.idle_s = idle_s
        self.update_s = update_s
        self.tail = b""  # the current segment's bytes not shown yet (raw, no \r or \n)
        self.held = b""  # the last non-empty segment a \r ended, not shown yet
        self.is_line_shown = False  # part of the current line was shown already
        self.has_update = False  # a \r came since the last update shown
        self.last_byte_at = 0.0
        self.last_update_at = -math.inf

    def feed(self, data: bytes, now: float = 0.0) -> list[bytes | memoryview]:
        """The pieces to write in order (`os.writev`) for `data`, which arrived at `now`.

        Task output runs to hundreds of MB/s: a chunk of plain lines costs a `find` for
        `\\r`, one `replace` and no other copy; only lines holding `\\r` are split.
        """
        self.last_byte_at = now
        if self.tail:
            data = self.tail + data
            self.tail = b""
        out: list[bytes | memoryview] = []
        cut = data.rfind(b"\n")
        if cut >= 0:
            start = 0
            if self.held or self.is_line_shown:
                start = data.find(b"\n") + 1
                out += self._end_line(data[: start - 1])
            if start <= cut:
                body = data[start : cut + 1] if start or cut + 1 < len(data) else data
                if body.find(b"\r") < 0:
                    prefixed = body.replace(b"\n", self.separator)
                    out += [self.prefix, memoryview(prefixed)[: -len(self.prefix)]]
                else:
                    for line in body[:-1].split(b"\n"):
                        out += self._end_line(line)
            self.has_update = False
            data = data[cut + 1 :]
        ret = data.rfind(b"\r")
        if ret >= 0:
            segment = last_segment(data[:ret])
            if segment:
                self.held = segment
            data = data[ret + 1 :]
            self.has_update = True
        self.tail = data
        if (self.tail or self.held) and (
            len(self.tail) >= MAX_PARTIAL_LINE
            or (self.has_update and now - self.last_update_at >= self.update_s)
        ):
            out += self._show(now)
        return out

    def feed_bytes(self, data: bytes, now: float = 0.0) -> bytes:
        return b"".join(self.feed(data, now))

    def due(self) -> float | None:
        """When `idle` will have something to show, if nothing more arrives."""
        if self.tail or self.held:
            return self.last_byte_at + self.idle_s
        return None

    def idle(self, now: float) -> bytes:
        """The partial line or held update, once the stream has been quiet for `idle_s`."""
        if (self.tail or self.held) and now - self.last_byte_at >= self.idle_s:
            return b"".join(self._show(now))
        return b""

    def flush(self) -> bytes:
        """The partial line or held update, terminated, at the end of the stream."""
        return b"".join(self._show(self.last_byte_at))

    def _end_line(self, line: bytes) -> list[bytes | memoryview]:
        segment = last_segment(line) if line.find(b"\r") >= 0 else line
        held, was_shown = self.held, self.is_line_shown
        self.held = b""
        self.is_line_shown = self.has_update = False
        if segment or held:
            return [self.prefix, segment or held, b"\n"]
        return [] if was_shown else [self.prefix, b"\n"]

    def _show(self, now: float) -> list[bytes | memoryview]:
        shown = self.tail or self.held
        self.is_line_shown = self.is_line_shown or bool(shown)
        self.tail = self.held = b""
        self.has_update = False
        self.last_update_at = now
        return [self.prefix, shown, b"\n"] if shown else []


def last_segment(line: bytes) -> bytes:
    """What a terminal shows last of a line holding `\\r`: its last non-empty segment."""
    line = line.rstrip(b"\r")
    return line[line.rfind(b"\r") + 1 :]


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


# A value this long that an earlier task already showed prints as `KEY=<as worker.0>`: every
# Paddle trainer carries every endpoint, and 10000 copies of that list are no plan to read.
LONG_ENV_VALUE = 200


def quote_env(env: Mapping[str, str]) -> str:
    return " ".join(f"{key}={shlex.quote(value)}" for key, value in env.items())


def plan_text(plan: JobPlan, note: str | None = None) -> str:
    """What `launch --dry-run` prints: one row per task, then each task's environment."""
    lines = [f"job {plan.job_id}  framework {plan.framework.value}  workdir {plan.workdir}"]
    if plan.rendezvous is not None:
        lines.append(f"rendezvous {plan.rendezvous}")
    if note:
        lines.append(note)
    lines += [f"note: {message}" for message in plan.notes]
    rows = [("TASK", "HOST", "ADDRESS", "ENDPOINT", "COMMAND")]
    for task in plan.tasks:
        host = f"{task.host.display} (this machine)" if task.host.is_local else task.host.display
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
    lines += table(rows)
    lines.append("")
    lines.append("environment added to each task (on top of its host's login environment):")
    first_shown: dict[tuple[str, str], str] = {}  # a long value -> the task that showed it
    for task in plan.tasks:
        words = []
        for key, value in task.env.items():
            if len(value) <= LONG_ENV_VALUE:
                words.append(f"{key}={shlex.quote(value)}")
            elif (shown := first_shown.setdefault((key, value), task.name)) != task.name:
                words.append(f"{key}=<as {shown}>")
            else:
                words.append(f"{key}={shlex.quote(value)}")
        lines.append(f"  {task.name}: {' '.join(words)}")
    return "\n".join(lines) + "\n"


def table(rows: Sequence[Sequence[str]]) -> list[str]:
    """Rows as aligned columns, each cell one line; the last column is left ragged."""
    rows = [[one_line(cell) for cell in row] for row in rows]
    widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
    out = []
    for row in rows:
        cells = [cell.ljust(width) for cell, width in zip(row[:-1], widths, strict=False)]
        out.append("  ".join([*cells, row[-1]]).rstrip())
    return out


def clock(timestamp: float) -> str:
    """A local wall-clock time, to the second."""
    return datetime.fromtimestamp(timestamp).strftime("%H:%M:%S")


def result_text(result: JobResult) -> str:
    """The closing summary: root cause first, with its evidence and what was stopped."""
    from dtrain.launch.results import JobState

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
    outside = [e for e in result.exits if e.is_killed_from_outside]
    if cause is not None and cause.is_killed_from_outside and len(outside) > 1:
        lines += killed_from_outside_lines(result, outside)
        others = [e for e in result.exits if e.failed and not e.is_killed_from_outside]
    else:
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


KILLED_FROM_OUTSIDE_HINT = (
    "  sent by `dtrain kill`, by hand, or (SIGKILL) by the OOM killer: see `dmesg` on the host"
)


def killed_from_outside_lines(result: JobResult, outside: Sequence[TaskExit]) -> list[str]:
    """Several tasks killed by signals dtrain did not send: someone stopped the job."""
    from dtrain.launch.results import signal_name

    first = min(outside, key=lambda e: e.finished_at)
    signals = "/".join(sorted({signal_name(e.signal) for e in outside if e.signal is not None}))
    labels = ", ".join(e.label for e in outside[:8]) + (", ..." if len(outside) > 8 else "")
    return [
        f"dtrain: job {result.job_id} failed: its tasks were killed from outside dtrain "
        f"({signals}, {len(outside)} of {len(result.exits)} tasks, from "
        f"{clock(first.finished_at)}): {labels}",
        KILLED_FROM_OUTSIDE_HINT,
        f"  logs in {result.log_dir}/",
    ]


def root_cause_lines(job_id: str, cause: TaskExit) -> list[str]:
    lines = [
        f"dtrain: job {job_id} failed: {cause.label} {cause.describe()} at "
        f"{clock(cause.finished_at)} (first failure)"
    ]
    if cause.is_killed_from_outside:
        lines.append(KILLED_FROM_OUTSIDE_HINT)
    if cause.stderr_tail:
        lines.append("  last stderr lines:")
        lines += [f"    | {line}" for line in cause.stderr_tail]
    if cause.log_error is None:
        lines.append(f"  full log: {cause.log_path}")
    else:
        lines.append(f"  log: {cause.log_path} (incomplete: {cause.log_error})")
    return lines
