"""What `dtrain ps`, `dtrain kill` and `dtrain stacks` print, as text or JSON data. Pure."""

from __future__ import annotations

from collections.abc import Callable, Mapping, Sequence
from typing import Any

from dtrain.errors import one_line
from dtrain.processes.launcher import DeadLauncherJob
from dtrain.processes.results import Fate, HostKill, HostScan, JobProcess
from dtrain.processes.results import duration_text as duration_text  # re-exported for callers
from dtrain.processes.stackgroups import StacksReport, files_line, summary_lines
from dtrain.render import clock, table

MAX_COMMAND_CHARS = 160
MAX_QUIET_DEAD_SHOWN = 5  # jobs whose launcher died and that left nothing, newest first
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


def ps_text(
    scans: Sequence[HostScan],
    dead: Sequence[DeadLauncherJob] = (),
    restarts: Mapping[str, Mapping[str, Any]] | None = None,
) -> str:
    """What `dtrain ps` prints: per host, each job's processes with pid, task, age, CPU, RSS;
    which attempt of a job that may restart runs; then the jobs whose launcher died."""
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
    lines += restart_lines(restarts or {})
    lines += dead_launcher_lines(dead, scans)
    return "\n".join(lines) + "\n"


def _left(job: DeadLauncherJob, scans: Sequence[HostScan]) -> int:
    return sum(1 for scan in scans for proc in scan.processes if proc.job_id == job.job_id)


def dead_launcher_lines(dead: Sequence[DeadLauncherJob], scans: Sequence[HostScan]) -> list[str]:
    """One line per job whose launcher died: which launcher, and whether anything is left.

    Every one that left processes, and the newest `MAX_QUIET_DEAD_SHOWN` that left none; the
    older quiet ones as a count (`--json` lists them all): a log directory keeps every job
    ever killed, and `ps` is for what needs doing now."""
    if not dead:
        return []
    quiet = [job for job in dead if not _left(job, scans)]
    hidden = {job.job_id for job in quiet[: max(0, len(quiet) - MAX_QUIET_DEAD_SHOWN)]}
    lines = [f"{_count(len(dead), 'job')} whose launcher died (job.json says launcher_died):"]
    for job in dead:
        if job.job_id in hidden:
            continue
        launcher = job.launcher
        started = f", started {clock(job.started_at)}" if job.started_at else ""
        left = _left(job, scans)
        tail = (
            f"{_count(left, 'process')} left: dtrain kill --job {job.job_id}"
            if left
            else "no process left"
        )
        lines.append(
            one_line(
                f"  job {job.job_id}: launcher died (pid {launcher.pid} on {launcher.host}"
                f"{started}); {tail}; logs in {job.log_dir}/"
            )
        )
    if hidden:
        lines.append(
            f"  and {_count(len(hidden), 'older job')} with no process left "
            "(dtrain ps --json lists every one)"
        )
    return lines


def restart_lines(states: Mapping[str, Mapping[str, Any]]) -> list[str]:
    """One line per running job that may restart: its attempt, or when the next starts."""
    lines = []
    for job, state in states.items():
        attempt, most = state.get("attempt"), state.get("max_restarts")
        total = most + 1 if isinstance(most, int) else "?"
        next_at = state.get("next_attempt_at")
        if isinstance(next_at, int | float) and isinstance(attempt, int):
            lines.append(
                f"job {job}: attempt {attempt} of {total} failed; attempt {attempt + 1} "
                f"starts at {clock(next_at)} (dtrain kill --job {job} ends it)"
            )
        else:
            lines.append(f"job {job}: attempt {attempt} of {total} running")
    return lines


def ps_data(
    scans: Sequence[HostScan],
    job: str | None,
    dead: Sequence[DeadLauncherJob] = (),
    restarts: Mapping[str, Mapping[str, Any]] | None = None,
) -> dict[str, object]:
    """The `data` of `dtrain ps --json`."""
    return {
        "restarts": dict(restarts or {}),
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
            lines.append(f"  job {one_line(job)}")
        header_line, *rows = table([header, *(row(p) for p in processes)])
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


# ---- stacks -----------------------------------------------------------------------------------


def stacks_text(report: StacksReport) -> str:
    """What `dtrain stacks` prints: the grouped summary, odd ones out first, then where the
    per-task files are."""
    lines = summary_lines(report)
    if where := files_line(report):
        lines.append(where)
    for note in report.notes:
        lines.append(note)
    return "\n".join(lines) + "\n"


def stacks_data(report: StacksReport) -> dict[str, object]:
    """The `data` of `dtrain stacks --json`: the groups and every task."""
    return report.to_dict()
