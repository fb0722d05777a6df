"""Plans, results and errors as text a person reads, or as one JSON document. Pure."""

from __future__ import annotations

import math
import shlex
from collections.abc import Callable, Mapping, Sequence
from datetime import datetime
from typing import Any

from dtrain.doctor.judge import CheckResult, DoctorReport, Status
from dtrain.errors import Problem, group_hint, group_line
from dtrain.launch.results import JobResult, JobState, TaskExit, signal_name
from dtrain.plan.spec import JobPlan
from dtrain.processes.results import DeadLauncherJob, Fate, HostKill, HostScan, JobProcess
from dtrain.processes.results import duration_text as duration_text  # re-exported for callers
from dtrain.processes.stackgroups import StacksReport, summary_lines

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
    lines += _table(rows)
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
    first = min(outside, key=lambda e: e.finished_at)
    signals = "/".join(sorted({signal_name(e.signal) for e in outside if e.signal is not None}))
    labels = ", ".join(e.label for e in outside[:8]) + (", ..." if len(outside) > 8 else "")
    return [
        f"dtrain: job {result.job_id} failed: its tasks were killed from outside dtrain "
        f"({signals}, {len(outside)} of {len(result.exits)} tasks, from "
        f"{_clock(first.finished_at)}): {labels}",
        KILLED_FROM_OUTSIDE_HINT,
        f"  logs in {result.log_dir}/",
    ]


def root_cause_lines(job_id: str, cause: TaskExit) -> list[str]:
    lines = [
        f"dtrain: job {job_id} failed: {cause.label} {cause.describe()} at "
        f"{_clock(cause.finished_at)} (first failure)"
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


# ---- dtrain ps / dtrain kill ------------------------------------------------------------------

MAX_COMMAND_CHARS = 160
FATE_TEXT = {
    Fate.LISTED: "-",
    Fate.TERM: "SIGTERM",
    Fate.KILL: "SIGKILL",
    Fate.SURVIVED: "SURVIVED",
    Fate.GONE: "already gone",
}


PS_HEADER = ("PID", "TASK", "STATE", "AGE", "CPU", "CPU%", "RSS", "OUTPUT", "COMMAND")
LISTED_HEADER = ("PID", "TASK", "AGE", "CPU", "RSS", "COMMAND")  # kill --dry-run
KILL_HEADER = ("PID", "TASK", "RESULT", "COMMAND")


def ps_text(scans: Sequence[HostScan], dead: Sequence[DeadLauncherJob] = ()) -> str:
    """What `dtrain ps` prints: per host, each job's processes with pid, task, age, CPU, RSS;
    then the jobs in the log directory whose launcher died."""
    lines = []
    for scan in scans:
        name = _host_name(scan)
        if scan.error is not None:
            lines.append(f"{name}: not scanned (see the error below)")
        elif not scan.processes:
            lines.append(f"{name}: no job processes")
        else:
            lines.append(f"{name}: {_count(len(scan.processes), 'job process')}")
            lines += _job_tables(scan, PS_HEADER, _ps_row)
    lines += dead_launcher_lines(dead, scans)
    return "\n".join(lines) + "\n"


def _left(job: DeadLauncherJob, scans: Sequence[HostScan]) -> int:
    return sum(1 for scan in scans for proc in scan.processes if proc.job_id == job.job_id)


def dead_launcher_lines(dead: Sequence[DeadLauncherJob], scans: Sequence[HostScan]) -> list[str]:
    """One line per job whose launcher died: which launcher, and whether anything is left."""
    if not dead:
        return []
    lines = [f"{_count(len(dead), 'job')} whose launcher died (job.json says launcher_died):"]
    for job in dead:
        launcher = job.launcher
        started = f", started {_clock(job.started_at)}" if job.started_at else ""
        left = _left(job, scans)
        tail = (
            f"{_count(left, 'process')} left: dtrain kill --job {job.job_id}"
            if left
            else "no process left"
        )
        lines.append(
            f"  job {job.job_id}: launcher died (pid {launcher.pid} on {launcher.host}"
            f"{started}); {tail}; logs in {job.log_dir}/"
        )
    return lines


def ps_data(
    scans: Sequence[HostScan], job: str | None, dead: Sequence[DeadLauncherJob] = ()
) -> dict[str, object]:
    """The `data` of `dtrain ps --json`."""
    return {
        "job": job,
        "hosts": [scan.to_dict() for scan in scans],
        "launcher_died": [d.to_dict(_left(d, scans)) for d in dead],
    }


def kill_text(kills: Sequence[HostKill]) -> str:
    """What `dtrain kill` prints: per host, what went on SIGTERM, on SIGKILL, and what survived."""
    lines = []
    for kill in kills:
        name = _host_name(kill.scan)
        found = kill.scan.processes
        if kill.error is not None:
            lines.append(f"{name}: not reached (see the error below)")
        elif not found:
            lines.append(f"{name}: nothing to stop")
        elif kill.dry_run:
            lines.append(f"{name}: would stop {_count(len(found), 'process')}")
            lines += _job_tables(kill.scan, LISTED_HEADER, _listed_row)
        else:
            lines.append(f"{name}: {_kill_summary(kill)}")
            lines += _job_tables(kill.scan, KILL_HEADER, _kill_row(kill), _survivor_reason(kill))
    lines.append(_kill_total(kills))
    return "\n".join(lines) + "\n"


def kill_data(
    kills: Sequence[HostKill], job: str | None, grace_s: float, dry_run: bool
) -> dict[str, object]:
    """The `data` of `dtrain kill --json`: every process found, each with its fate."""
    return {
        "job": job,
        "grace_s": grace_s,
        "dry_run": dry_run,
        "hosts": [kill.to_dict() for kill in kills],
    }


def _host_name(scan: HostScan) -> str:
    return f"{scan.host} (this machine)" if scan.is_local else scan.host


def _count(n: int, noun: str) -> str:
    plural = noun + ("es" if noun.endswith("s") else "s")
    return f"{n} {noun if n == 1 else plural}"


def _job_tables(
    scan: HostScan,
    header: tuple[str, ...],
    row: Callable[[JobProcess], tuple[str, ...]],
    note: Callable[[JobProcess], str | None] = lambda proc: None,
) -> list[str]:
    """One table per job; `note` adds an indented line under a process's row."""
    lines = []
    for job, processes in scan.jobs().items():
        if job is None:
            lines.append("  no dtrain job id (DMLC_ROLE set: started by hand, launch.py or BytePS)")
        else:
            lines.append(f"  job {job}")
        header_line, *rows = _table([header, *(row(p) for p in processes)])
        lines.append(f"    {header_line}")
        for proc, text in zip(processes, rows, strict=True):
            lines.append(f"    {text}")
            extra = note(proc)
            if extra:
                lines.append(f"      {extra}")
    return lines


def _kill_row(kill: HostKill) -> Callable[[JobProcess], tuple[str, ...]]:
    def row(proc: JobProcess) -> tuple[str, ...]:
        return (str(proc.pid), _task(proc), FATE_TEXT[kill.fate(proc.pid)], _command(proc))

    return row


def _survivor_reason(kill: HostKill) -> Callable[[JobProcess], str | None]:
    reasons = {s.pid: s.reason for s in kill.survivors}

    def note(proc: JobProcess) -> str | None:
        reason = reasons.get(proc.pid)
        return f"why: {reason}" if reason else None

    return note


def _ps_row(proc: JobProcess) -> tuple[str, ...]:
    cpu_percent = "-" if proc.cpu_percent is None else f"{proc.cpu_percent:.0f}"
    output = proc.last_output_age_s
    return (
        str(proc.pid),
        _task(proc),
        STATE_TEXT.get(proc.state, proc.state),
        duration_text(proc.age_s),
        cpu_text(proc.cpu_s),
        cpu_percent,
        size_text(proc.rss_bytes),
        "-" if output is None else f"{duration_text(output)} ago",
        _command(proc),
    )


STATE_TEXT = {"R": "running", "S": "sleeping", "D": "disk-wait", "T": "stopped", "t": "traced"}


def _listed_row(proc: JobProcess) -> tuple[str, ...]:
    return (
        str(proc.pid),
        _task(proc),
        duration_text(proc.age_s),
        cpu_text(proc.cpu_s),
        size_text(proc.rss_bytes),
        _command(proc),
    )


def _task(proc: JobProcess) -> str:
    if proc.inherited_from is not None:
        return f"{proc.label} (child of {proc.inherited_from})"
    return proc.label


def _command(proc: JobProcess) -> str:
    text = " ".join(proc.command)  # as ps shows it: for reading, not for pasting
    text = "".join(c if c.isprintable() else repr(c)[1:-1] for c in text)  # one line per row
    if len(text) > MAX_COMMAND_CHARS:
        text = text[: MAX_COMMAND_CHARS - 3] + "..."
    return text


def _kill_summary(kill: HostKill) -> str:
    found = len(kill.scan.processes)
    parts = []
    if kill.by_term:
        parts.append(f"{len(kill.by_term)} on SIGTERM")
    if kill.by_kill:
        parts.append(f"{len(kill.by_kill)} on SIGKILL after the {kill.grace_s:g}s grace")
    if kill.survivors:
        parts.append(f"{len(kill.survivors)} survived")
    if kill.already_gone:
        parts.append(f"{len(kill.already_gone)} had already exited (not signalled)")
    stopped = len(kill.by_term) + len(kill.by_kill)
    return f"stopped {stopped} of {_count(found, 'process')}: " + ", ".join(parts)


def _kill_total(kills: Sequence[HostKill]) -> str:
    reached = [k for k in kills if k.error is None]
    hosts = f"{len(kills)} host{'s' if len(kills) != 1 else ''}"
    if len(reached) < len(kills):
        hosts = f"{len(reached)} of {hosts}"
    if any(k.dry_run for k in kills):
        found = sum(len(k.scan.processes) for k in reached)
        return f"dry run: would stop {_count(found, 'process')} on {hosts}; nothing was signalled"
    stopped = sum(len(k.by_term) + len(k.by_kill) for k in reached)
    left = sum(len(k.survivors) for k in reached)
    tail = "nothing is left" if not left else f"{left} left running"
    if len(reached) < len(kills):
        tail += " on those"
    return f"stopped {_count(stopped, 'process')} on {hosts}; {tail}"


def cpu_text(seconds: float) -> str:
    """CPU time as ps prints it: M:SS, or H:MM:SS."""
    total = int(seconds)
    minutes, secs = divmod(total, 60)
    hours, minutes = divmod(minutes, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}" if hours else f"{minutes}:{secs:02d}"


def size_text(size: int) -> str:
    """Resident memory in binary units: 512K, 12M, 1.5G."""
    if size < 1 << 20:
        return f"{size >> 10}K"
    if size < 1 << 30:
        return f"{size / (1 << 20):.0f}M"
    return f"{size / (1 << 30):.1f}G"


# ---- dtrain doctor --------------------------------------------------------------------------

CELL_TEXT = {Status.PASS: "PASS", Status.WARN: "WARN", Status.FAIL: "FAIL", Status.SKIP: "-"}


def doctor_text(report: DoctorReport) -> str:
    """Hosts x checks at a glance, then each FAIL and WARN with its evidence and fix."""
    header = ("HOST", *report.checks)
    rows: list[tuple[str, ...]] = [header]
    found = {(r.check, r.host): r for r in report.results}  # one pass: thousands of hosts
    for host in report.hosts:
        cells = []
        for check in report.checks:
            result = found.get((check, host.name))
            cells.append(CELL_TEXT[result.status] if result else "-")
        rows.append((f"{host.name} (here)" if host.is_local else host.name, *cells))
    lines = _table([(*row, "") for row in rows])
    findings = [*report.failures, *report.warnings]
    if findings:
        lines.append("")
    for group in _same_failures(sorted(findings, key=_finding_order(report))):
        lines += doctor_finding_lines(group[0]) if len(group) == 1 else _finding_group_lines(group)
    lines.append("")
    lines.append(doctor_summary(report))
    return "\n".join(lines) + "\n"


def _finding_order(report: DoctorReport) -> Callable[[CheckResult], tuple[int, int, int]]:
    hosts = {h.name: index for index, h in enumerate(report.hosts)}
    checks = {check: index for index, check in enumerate(report.checks)}

    def key(result: CheckResult) -> tuple[int, int, int]:
        return (
            result.status is not Status.FAIL,
            hosts.get(result.host, len(hosts)),
            checks.get(result.check, 0),
        )

    return key


def _same_failures(results: Sequence[CheckResult]) -> list[list[CheckResult]]:
    """Findings of one check failing for one reason on several hosts, together, in order."""
    groups: dict[object, list[CheckResult]] = {}
    for index, result in enumerate(results):
        problem = result.problem
        key: object = index
        if problem is not None and problem.reason is not None:
            key = (result.status, result.check, problem.code, problem.reason)
        groups.setdefault(key, []).append(result)
    return list(groups.values())


def _finding_group_lines(group: Sequence[CheckResult]) -> list[str]:
    problems = [r.problem for r in group if r.problem is not None]
    first = group[0]
    lines = [f"{CELL_TEXT[first.status]} {first.check}: {group_line(problems)}"]
    hint = group_hint(problems)
    if hint:
        lines.append(f"  hint: {hint}")
    return lines


def doctor_finding_lines(result: CheckResult) -> list[str]:
    lines = [f"{CELL_TEXT[result.status]} {result.host} {result.check}: {result.detail}"]
    if result.hint:
        lines.append(f"  hint: {result.hint}")
    return lines


def doctor_summary(report: DoctorReport) -> str:
    remote = sum(1 for h in report.hosts if not h.is_local)
    where = "this machine"
    if remote:
        where = f"{remote} host{'s' if remote != 1 else ''} and this machine"
    failed, warned = len(report.failures), len(report.warnings)
    if not failed and not warned:
        verdict = "every check passed"
    else:
        parts = [f"{failed} failed"] if failed else []
        parts += [f"{warned} warning{'s' if warned != 1 else ''}"] if warned else []
        verdict = ", ".join(parts)
    return f"doctor: {where}, {len(report.checks)} checks in {report.elapsed_s:.1f}s: {verdict}"


# ---- stacks -----------------------------------------------------------------------------------


def stacks_text(report: StacksReport) -> str:
    """What `dtrain stacks` prints: the grouped summary, odd ones out first, then where the
    per-task files are."""
    lines = summary_lines(report)
    if report.files_dir:
        lines.append(f"every task's full stack: {report.files_dir}/")
    for note in report.notes:
        lines.append(note)
    return "\n".join(lines) + "\n"


def stacks_data(report: StacksReport) -> dict[str, object]:
    """The `data` of `dtrain stacks --json`: the groups and every task."""
    return report.to_dict()
