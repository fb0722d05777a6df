"""What `dtrain ps`, `dtrain kill` and doctor's stale-process check found on each host. Pure.

Job processes as each host's agent reported them, what a kill did to each, and what the whole
sweep adds up to (exit code, problems). `cleanup` fills these in; `render` prints them.
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from dtrain.errors import ExitCode, Problem
from dtrain.remote.proto import JOB_ID_VAR, ROLE_VAR, SCAN_CPU_PERCENT, TASK_VAR


class Fate(str, Enum):
    """What became of one process in a sweep."""

    LISTED = "listed"  # ps, or kill --dry-run: left alone
    TERM = "term"  # gone within the grace after SIGTERM
    KILL = "kill"  # still there after the grace: gone after SIGKILL
    SURVIVED = "survived"  # still there after SIGKILL
    GONE = "gone"  # gone before it was signalled: its own launcher stopped it, or it exited


@dataclass(frozen=True, slots=True)
class JobProcess:
    """One job process on one host. Times are the host's clock; `age_s` is measured there."""

    pid: int
    ppid: int
    pgid: int
    uid: int
    state: str
    started_at: float
    age_s: float
    cpu_s: float
    rss_bytes: int
    argv: tuple[str, ...]
    comm: str
    job_id: str | None
    task: str | None
    role: str | None
    inherited_from: int | None = None
    orphaned: bool = False
    cpu_percent: float | None = None  # over the last seconds, when ps measured it
    last_output_age_s: float | None = None  # since its last output, when its launcher runs here

    @property
    def label(self) -> str:
        """The task (`worker.1`) or, for processes dtrain did not start, the DMLC role."""
        return self.task or self.role or "-"

    @property
    def command(self) -> tuple[str, ...]:
        return self.argv or (f"[{self.comm}]",)

    @classmethod
    def from_agent(cls, entry: Mapping[str, Any], now: float) -> JobProcess:
        """From one entry of an agent's scan or kill reply; `now` is the host's clock then."""
        tags: Mapping[str, str] = entry.get("tags") or {}
        start = float(entry.get("start", now))
        return cls(
            pid=int(entry["pid"]),
            ppid=int(entry.get("ppid", 0)),
            pgid=int(entry.get("pgid", 0)),
            uid=int(entry.get("uid", -1)),
            state=str(entry.get("state", "?")),
            started_at=start,
            age_s=max(0.0, now - start),
            cpu_s=float(entry.get("cpu_s", 0.0)),
            rss_bytes=int(entry.get("rss", 0)),
            argv=tuple(entry.get("cmdline") or ()),
            comm=str(entry.get("comm", "")),
            job_id=tags.get(JOB_ID_VAR),
            task=tags.get(TASK_VAR),
            role=tags.get(ROLE_VAR),
            inherited_from=entry.get("inherited_from"),
            orphaned=bool(entry.get("orphaned", False)),
            cpu_percent=entry.get(SCAN_CPU_PERCENT),
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "ppid": self.ppid,
            "pgid": self.pgid,
            "uid": self.uid,
            "state": self.state,
            "job_id": self.job_id,
            "task": self.task,
            "role": self.role,
            "started_at": self.started_at,
            "age_s": round(self.age_s, 3),
            "cpu_s": round(self.cpu_s, 3),
            "rss_bytes": self.rss_bytes,
            "argv": list(self.argv),
            "inherited_from": self.inherited_from,
            "cpu_percent": self.cpu_percent,
            "last_output_age_s": (
                None if self.last_output_age_s is None else round(self.last_output_age_s, 1)
            ),
        }


def duration_text(seconds: float) -> str:
    """A process age the way people say it: 42s, 5m03s, 3h05m, 2d04h."""
    total = int(seconds)
    if total < 60:
        return f"{total}s"
    minutes, secs = divmod(total, 60)
    if minutes < 60:
        return f"{minutes}m{secs:02d}s"
    hours, minutes = divmod(minutes, 60)
    if hours < 24:
        return f"{hours}h{minutes:02d}m"
    days, hours = divmod(hours, 24)
    return f"{days}d{hours:02d}h"


def by_job(processes: Iterable[JobProcess]) -> dict[str | None, tuple[JobProcess, ...]]:
    """Processes grouped by dtrain job id (None: DMLC processes dtrain did not start)."""
    groups: dict[str | None, list[JobProcess]] = {}
    for proc in processes:
        groups.setdefault(proc.job_id, []).append(proc)
    ordered = sorted(groups.items(), key=lambda item: (item[0] is None, item[0] or ""))
    return {job: tuple(procs) for job, procs in ordered}


@dataclass(frozen=True, slots=True)
class HostScan:
    """The job processes found on one host, or why the host could not be scanned."""

    host: str
    processes: tuple[JobProcess, ...] = ()
    error: Problem | None = None
    user: str | None = None
    is_local: bool = False

    @property
    def is_reachable(self) -> bool:
        return self.error is None

    def jobs(self) -> dict[str | None, tuple[JobProcess, ...]]:
        return by_job(self.processes)

    def to_dict(self) -> dict[str, object]:
        return {
            "host": self.host,
            "local": self.is_local,
            "reachable": self.is_reachable,
            "user": self.user,
            "processes": [p.to_dict() for p in self.processes],
            "error": self.error.to_dict() if self.error else None,
        }


def with_output_ages(scan: HostScan, ages: Mapping[str, Mapping[str, float]]) -> HostScan:
    """The scan with each task's seconds since its last output (`ages`: by job, then task)."""
    processes = tuple(
        replace(p, last_output_age_s=ages.get(p.job_id or "", {}).get(p.task or ""))
        for p in scan.processes
    )
    return replace(scan, processes=processes)


@dataclass(frozen=True, slots=True)
class Survivor:
    """A process still alive after SIGKILL, and why (as far as the host can tell)."""

    pid: int
    reason: str


@dataclass(frozen=True, slots=True)
class HostKill:
    """What a kill found on one host and what became of each process."""

    scan: HostScan
    grace_s: float
    dry_run: bool = False
    by_term: frozenset[int] = frozenset()
    by_kill: frozenset[int] = frozenset()
    survivors: tuple[Survivor, ...] = ()
    already_gone: frozenset[int] = frozenset()

    @property
    def host(self) -> str:
        return self.scan.host

    @property
    def error(self) -> Problem | None:
        return self.scan.error

    def fate(self, pid: int) -> Fate:
        if pid in self.by_term:
            return Fate.TERM
        if pid in self.by_kill:
            return Fate.KILL
        if any(s.pid == pid for s in self.survivors):
            return Fate.SURVIVED
        if pid in self.already_gone:
            return Fate.GONE
        return Fate.LISTED

    def to_dict(self) -> dict[str, object]:
        document = self.scan.to_dict()
        processes = document["processes"]
        assert isinstance(processes, list)
        for entry, proc in zip(processes, self.scan.processes, strict=True):
            entry["fate"] = self.fate(proc.pid).value
        document["survivors"] = [{"pid": s.pid, "reason": s.reason} for s in self.survivors]
        return document


@dataclass(frozen=True, slots=True)
class Outcome:
    """What a sweep over every host adds up to: the exit code, and the problems to report."""

    exit_code: int
    status: str  # ok | partial | failed, as in the JSON envelope
    headline: str | None = None
    problems: tuple[Problem, ...] = field(default=())


def _unreachable(results: Sequence[HostScan]) -> list[Problem]:
    return [s.error for s in results if s.error is not None]


def _status(exit_code: int, answered: int) -> str:
    if exit_code == ExitCode.OK:
        return "ok"
    return "partial" if answered else "failed"


def scan_outcome(scans: Sequence[HostScan]) -> Outcome:
    """A listing succeeds when every host answered, whatever it found."""
    problems = _unreachable(scans)
    if not problems:
        return Outcome(ExitCode.OK, "ok")
    answered = len(scans) - len(problems)
    return Outcome(
        ExitCode.ENVIRONMENT,
        _status(ExitCode.ENVIRONMENT, answered),
        f"could not scan {len(problems)} of {len(scans)} host{'s' if len(scans) != 1 else ''}"
        + _the_others(answered, "listed above"),
        tuple(problems),
    )


def kill_outcome(kills: Sequence[HostKill]) -> Outcome:
    """0 only when every host was reached and nothing survived; a dry run only lists."""
    problems = _unreachable([k.scan for k in kills])
    survivor_problems = [
        Problem(
            f"pid {s.pid}{_owner(k, s.pid)} survived SIGKILL: {s.reason}",
            host=k.host,
            code="survived",
            hint="see it with `dtrain ps`; a process in state D dies when its kernel call returns",
        )
        for k in kills
        for s in k.survivors
    ]
    answered = len(kills) - len(problems)
    parts = []
    if problems:
        done = "listed" if kills and kills[0].dry_run else "cleaned"
        parts.append(
            f"could not reach {len(problems)} of {len(kills)} "
            f"host{'s' if len(kills) != 1 else ''}" + _the_others(answered, done)
        )
    if survivor_problems:
        count = len(survivor_problems)
        parts.append(f"{count} process{'es' if count != 1 else ''} survived SIGKILL")
    if problems:
        code = int(ExitCode.ENVIRONMENT)
    elif survivor_problems:
        code = int(ExitCode.JOB_FAILED)
    else:
        return Outcome(ExitCode.OK, "ok")
    return Outcome(code, _status(code, answered), "; ".join(parts), (*problems, *survivor_problems))


def _the_others(count: int, done: str) -> str:
    if not count:
        return ""
    return f"; the other host was {done}" if count == 1 else f"; the other {count} were {done}"


def _owner(kill: HostKill, pid: int) -> str:
    for proc in kill.scan.processes:
        if proc.pid == pid:
            job = f" of job {proc.job_id}" if proc.job_id else ""
            return f" ({proc.label}{job})"
    return ""
