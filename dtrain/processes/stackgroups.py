"""Every task's stack, grouped: which tasks wait in the same place, which one is elsewhere. Pure.

With 64 workers, "63 tasks in `barrier`, 1 task in `load_batch`" is the answer to "where is it
stuck"; 64 near-identical dumps are not. Two stacks are the same when their threads call the
same functions in the same files, line numbers and native addresses aside (a busy loop is on a
different line at every sample). The smallest groups come first: the odd ones out.
"""

from __future__ import annotations

import re
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import Any

from dtrain.errors import ExitCode, Problem
from dtrain.remote.proto import JOB_ID_VAR, ROLE_VAR, TASK_VAR

HEADLINE_FRAMES = 3  # frames of the main thread's stack shown in a group's one line

Signature = tuple[tuple[tuple[str, str], ...], ...]


@dataclass(frozen=True, slots=True)
class Frame:
    name: str
    file: str
    line: int = 0
    is_native: bool = False

    @property
    def where(self) -> str:
        return f"{self.file}:{self.line}" if self.line else self.file

    @property
    def is_address(self) -> bool:
        """A native frame without a symbol (`0x7f6b59a4524a`): differs in every process."""
        return self.name.startswith("0x")

    def to_dict(self) -> dict[str, object]:
        return {"name": self.name, "file": self.file, "line": self.line, "native": self.is_native}


@dataclass(frozen=True, slots=True)
class ThreadStack:
    """One thread's frames, innermost first."""

    frames: tuple[Frame, ...]
    name: str | None = None
    thread_id: int | None = None
    is_active: bool = False

    @property
    def signature(self) -> tuple[tuple[str, str], ...]:
        return tuple((f.name, f.file) for f in self.frames if not f.is_address)

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "id": self.thread_id,
            "active": self.is_active,
            "frames": [f.to_dict() for f in self.frames],
        }


@dataclass(frozen=True, slots=True)
class TaskStack:
    """One job process's stacks as its host's agent took them, or why there are none."""

    host: str
    pid: int
    task: str | None = None
    job_id: str | None = None
    role: str | None = None
    argv: tuple[str, ...] = ()
    state: str = "?"
    is_python: bool = True
    tool: str | None = None
    threads: tuple[ThreadStack, ...] | None = None
    error: str | None = None
    looked_in: tuple[str, ...] = ()
    interpreter: str | None = None  # the Python the process runs, as it found it
    label: str = ""

    @property
    def is_taken(self) -> bool:
        return self.threads is not None

    @property
    def signature(self) -> Signature:
        """The threads' call chains, sorted: thread ids and order never make stacks differ."""
        threads = self.threads or ()
        return tuple(sorted(t.signature for t in threads if t.signature))

    @property
    def main_thread(self) -> ThreadStack | None:
        threads = [t for t in self.threads or () if t.frames]
        for thread in threads:
            if thread.thread_id == self.pid or thread.name == "MainThread":
                return thread
        return threads[0] if threads else None

    @classmethod
    def from_agent(cls, entry: Mapping[str, Any], host: str) -> TaskStack:
        """From one entry of an agent's stacks reply."""
        tags: Mapping[str, str] = entry.get("tags") or {}
        raw_threads = entry.get("threads")
        threads = None
        if raw_threads is not None:
            threads = tuple(
                ThreadStack(
                    frames=tuple(
                        Frame(
                            str(f.get("name", "?")),
                            str(f.get("file", "")),
                            int(f.get("line") or 0),
                            bool(f.get("native")),
                        )
                        for f in t.get("frames") or ()
                    ),
                    name=t.get("name"),
                    thread_id=t.get("id"),
                    is_active=bool(t.get("active")),
                )
                for t in raw_threads
            )
        return cls(
            host=host,
            pid=int(entry["pid"]),
            task=tags.get(TASK_VAR),
            job_id=tags.get(JOB_ID_VAR),
            role=tags.get(ROLE_VAR),
            argv=tuple(entry.get("cmdline") or ()),
            state=str(entry.get("state") or "?"),
            is_python=bool(entry.get("python", True)),
            tool=entry.get("tool"),
            threads=threads,
            error=entry.get("error"),
            looked_in=tuple(entry.get("looked_in") or ()),
            interpreter=entry.get("interpreter"),
        )

    def to_dict(self) -> dict[str, object]:
        return {
            "label": self.label,
            "host": self.host,
            "pid": self.pid,
            "task": self.task,
            "job_id": self.job_id,
            "role": self.role,
            "state": self.state,
            "argv": list(self.argv),
            "python": self.is_python,
            "tool": self.tool,
            "error": self.error,
            "threads": None if self.threads is None else [t.to_dict() for t in self.threads],
        }


def labelled(stacks: Sequence[TaskStack]) -> tuple[TaskStack, ...]:
    """Each stack with its label, `worker.3@h2`; a pid is added where a task has several
    Python processes (a wrapper and its child, data loader workers)."""

    def base(stack: TaskStack) -> str:
        return f"{stack.task or stack.role or 'pid ' + str(stack.pid)}@{stack.host}"

    counts: dict[str, int] = {}
    for stack in stacks:
        counts[base(stack)] = counts.get(base(stack), 0) + 1
    return tuple(
        replace(s, label=base(s) if counts[base(s)] == 1 else f"{base(s)}[{s.pid}]") for s in stacks
    )


@dataclass(frozen=True, slots=True)
class StackGroup:
    """Tasks whose stacks are the same (see the module's docstring); the first is shown."""

    members: tuple[TaskStack, ...]

    @property
    def sample(self) -> TaskStack:
        return self.members[0]

    @property
    def headline(self) -> str:
        return headline(self.sample)

    def to_dict(self) -> dict[str, object]:
        sample = self.sample
        return {
            "count": len(self.members),
            "headline": self.headline,
            "tasks": [m.label for m in self.members],
            "threads": [t.to_dict() for t in sample.threads or ()],
        }


def headline(stack: TaskStack) -> str:
    """Where the main thread is, in one line: `in all_reduce (c10d.py:2806) <- main (t.py:9)`."""
    thread = stack.main_thread
    if thread is None:
        return "no Python frames"
    python = [f for f in thread.frames if not f.is_native] or list(thread.frames)
    shown = python[:HEADLINE_FRAMES]
    text = " <- ".join(f"{f.name} ({f.where})" for f in shown)
    more = len(python) - len(shown)
    return f"in {text}" + (f" <- ... {more} more" if more > 0 else "")


def natural_key(label: str) -> tuple[tuple[int, int | str], ...]:
    """worker.2 before worker.10."""
    parts = re.split(r"(\d+)", label)
    return tuple((1, int(p)) if p.isdigit() else (0, p) for p in parts)


def group(stacks: Iterable[TaskStack]) -> tuple[StackGroup, ...]:
    """The taken stacks grouped by signature, smallest group first (ties: by first label)."""
    groups: dict[Signature, list[TaskStack]] = {}
    for stack in stacks:
        if stack.is_taken:
            groups.setdefault(stack.signature, []).append(stack)
    made = [
        StackGroup(tuple(sorted(found, key=lambda s: natural_key(s.label))))
        for found in groups.values()
    ]
    return tuple(sorted(made, key=lambda g: (len(g.members), natural_key(g.sample.label))))


@dataclass(frozen=True, slots=True)
class HostStacks:
    """What one host answered: its job processes' stacks, or why it could not be asked."""

    host: str
    stacks: tuple[TaskStack, ...] = ()
    error: Problem | None = None


@dataclass(frozen=True, slots=True)
class StacksReport:
    """Every host's answer to `dtrain stacks`, and where the per-task files went."""

    hosts: tuple[HostStacks, ...]
    job: str | None = None
    is_native: bool = False
    files_dir: str | None = None
    notes: tuple[str, ...] = field(default=())

    @property
    def stacks(self) -> tuple[TaskStack, ...]:
        return tuple(s for h in self.hosts for s in h.stacks)

    @property
    def python_stacks(self) -> tuple[TaskStack, ...]:
        return tuple(s for s in self.stacks if s.is_python)

    @property
    def groups(self) -> tuple[StackGroup, ...]:
        return group(self.stacks)

    @property
    def problems(self) -> tuple[Problem, ...]:
        """Unreachable hosts, then one line per host whose Python processes have no stacks."""
        found = [h.error for h in self.hosts if h.error is not None]
        for host in self.hosts:
            failed = [s for s in host.stacks if s.is_python and not s.is_taken]
            if not failed:
                continue
            first = failed[0]
            missing = first.tool is None
            found.append(
                Problem(
                    f"no stacks for {_count(len(failed), 'process', 'processes')} "
                    f"({', '.join(s.label for s in failed[:4])}"
                    f"{', ...' if len(failed) > 4 else ''}): {first.error}",
                    host=host.host,
                    code="no-py-spy" if missing else "stacks-failed",
                    hint=install_hint(first) if missing else None,
                )
            )
        return tuple(found)

    @property
    def headline(self) -> str:
        hosts = {p.host for p in self.problems}
        total = len(self.hosts)
        answered = total - len(hosts)
        others = ""
        if answered:
            others = (
                "; the other host is above"
                if answered == 1
                else f"; the other {answered} are above"
            )
        return f"no stacks from {len(hosts)} of {_count(total, 'host', 'hosts')}{others}"

    @property
    def exit_code(self) -> int:
        if not self.problems:
            return int(ExitCode.OK)
        return int(ExitCode.ENVIRONMENT)

    @property
    def status(self) -> str:
        if not self.problems:
            return "ok"
        return "partial" if any(s.is_taken for s in self.stacks) else "failed"

    def to_dict(self) -> dict[str, object]:
        return {
            "job": self.job,
            "native": self.is_native,
            "files": self.files_dir,
            "groups": [g.to_dict() for g in self.groups],
            "tasks": [s.to_dict() for s in self.stacks],
            "hosts": [
                {"host": h.host, "error": h.error.to_dict() if h.error else None}
                for h in self.hosts
            ],
        }


def install_hint(stack: TaskStack) -> str:
    """`pip install py-spy` into the environment of the task's interpreter, named when known."""
    if stack.interpreter:
        return f"install it into the job's environment: {stack.interpreter} -m pip install py-spy"
    return "install it into the job's environment: pip install py-spy"


def files_line(report: StacksReport) -> str | None:
    """Where the per-task files went, and what they hold: a full stack only where one was
    taken (py-spy missing on a host leaves each file saying why instead)."""
    if not report.files_dir:
        return None
    python = report.python_stacks
    taken = sum(1 for s in python if s.is_taken)
    if python and taken == len(python):
        return f"every task's full stack: {report.files_dir}/"
    if taken:
        return f"the full stacks of {taken} of {len(python)} Python processes: {report.files_dir}/"
    return f"no stack was taken; {report.files_dir}/ says why for each task"


def _count(number: int, one: str, many: str) -> str:
    return f"{number} {one if number == 1 else many}"


def summary_lines(report: StacksReport, max_labels: int = 4) -> list[str]:
    """The grouped answer in a few lines, odd ones out first."""
    lines = []
    for stack_group in report.groups:
        members = stack_group.members
        labels = ", ".join(m.label for m in members[:max_labels])
        if len(members) > max_labels:
            labels += f", ... {len(members) - max_labels} more"
        lines.append(f"{_count(len(members), 'task', 'tasks')} ({labels}): {stack_group.headline}")
    skipped = [s for s in report.stacks if not s.is_python]
    if skipped:
        names = sorted({s.argv[0].rsplit("/", 1)[-1] if s.argv else "?" for s in skipped})
        lines.append(
            f"{_count(len(skipped), 'process is', 'processes are')} not Python "
            f"({', '.join(names[:4])}): no stacks"
        )
    if not report.stacks and not any(h.error for h in report.hosts):
        job = f" of job {report.job}" if report.job else ""
        lines.append(f"no job processes{job} on {_count(len(report.hosts), 'host', 'hosts')}")
    return lines


def task_text(stack: TaskStack) -> str:
    """One task's full dump, as its file under the job's log directory holds it."""
    lines = [f"{stack.label} pid {stack.pid} state {stack.state}: {' '.join(stack.argv)}"]
    if stack.threads is None:
        lines.append(f"no stack: {stack.error or 'not a Python process'}")
    for thread in stack.threads or ():
        name = f" ({thread.name})" if thread.name else ""
        active = "active" if thread.is_active else "idle"
        lines.append(f"Thread {thread.thread_id}{name} {active}")
        lines.extend(f"    {f.name} ({f.where})" for f in thread.frames)
    return "\n".join(lines) + "\n"


def file_name(stack: TaskStack) -> str:
    """The task's file name: its label with nothing a file system could misread."""
    safe = "".join(c if c.isalnum() or c in "._@-[]" else "_" for c in stack.label)
    return f"{safe}.txt"
