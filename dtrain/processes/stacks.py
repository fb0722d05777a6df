"""Take the stack of every job process on every host at once: `dtrain stacks`, and a hung launch.

Each host's agent finds the job's processes as `dtrain ps` does and runs py-spy on all of them
in parallel (`dtrain.remote.stacks`); this module asks every host at once, so the whole takes
about as long as the slowest process, and turns the replies into a `StacksReport`. A host that
cannot be reached, or has no py-spy, is a problem in the report, never an exception: the other
hosts are still answered. The per-task files go under the job's log directory.
"""

from __future__ import annotations

import logging
import os
import threading
import time
from collections.abc import Mapping, Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING

from dtrain.agents import ops
from dtrain.agents.group import Reply
from dtrain.agents.session import AgentSession
from dtrain.errors import Problem, RemoteError
from dtrain.plan.hosts import Host
from dtrain.processes import stackgroups
from dtrain.processes.stackgroups import HostStacks, StacksReport, TaskStack
from dtrain.processes.sweep import open_agents, this_machine
from dtrain.remote import proto
from dtrain.transport.options import SshOptions

if TYPE_CHECKING:
    from dtrain.transport.engine import EngineOptions

logger = logging.getLogger(__name__)

PER_PROCESS_S = 10.0  # one py-spy on demand: --native on a large library reads its symbols
REPLY_MARGIN_S = 10.0  # beyond the per-process bound: finding the processes, a slow host
SUMMARY_FILE = "summary.txt"
DIR_MODE = 0o700  # as the job's directory and its files (launch/joblog)
FILE_MODE = 0o600


def take(
    hosts: Sequence[Host],
    ssh_options: SshOptions,
    job: str | None,
    *,
    native: bool = False,
    per_process_s: float = PER_PROCESS_S,
    remote_python: str = "auto",
    engine: EngineOptions | None = None,
) -> StacksReport:
    """Every job process's stack on every host in parallel (no hosts: this machine; `engine`:
    the hosts' agents started by that engine, as a launch's were)."""
    hosts = tuple(hosts) or this_machine()
    with open_agents(hosts, ssh_options, remote_python, engine) as (sessions, problems):
        done = take_sessions(sessions, job, native=native, per_process_s=per_process_s)
    ordered = []
    for host in hosts:
        if host.key in done:
            ordered.append(done[host.key])
        else:
            problem = problems.get(host.key) or Problem("no answer", host=host.display)
            ordered.append(HostStacks(host.display, error=problem))
    return StacksReport(tuple(ordered), job=job, is_native=native)


def take_sessions(
    sessions: Mapping[str, AgentSession],
    job: str | None,
    *,
    native: bool = False,
    per_process_s: float = PER_PROCESS_S,
    timeout_s: float | None = None,
) -> dict[str, HostStacks]:
    """`take` over agents that are already running (a launch has them open)."""
    wait_s = timeout_s if timeout_s is not None else 4 * per_process_s + REPLY_MARGIN_S
    replies = ops.stacks(sessions, wait_s, job=job, native=native, per_process_s=per_process_s)
    results = {}
    for key, session in sessions.items():
        reply = replies.get(key)
        if reply is not None:
            results[key] = host_stacks(session.host, reply)
    return results


def host_stacks(host: Host, reply: Reply) -> HostStacks:
    if isinstance(reply, RemoteError):
        problem = Problem(reply.what, host=host.display, hint=reply.hint, code=reply.code)
        return HostStacks(host.display, error=problem)
    found = [TaskStack.from_agent(e, host.display) for e in reply.get(proto.STACKS_PROCESSES, ())]
    return HostStacks(host.display, stackgroups.labelled(found))


def write_files(report: StacksReport, job_dir: Path, stamp: str) -> Path:
    """`job_dir/stacks-<stamp>/` (`-2`, `-3`, ... for another run in the same second): the
    grouped summary and one file per task, private as the rest of the job's directory (0700,
    files 0600, whatever the umask: a stack shows arguments and paths); the directory.

    Raises OSError when it cannot be written (the caller says so and goes on).
    """
    where = _new_dir(job_dir, f"stacks-{stamp}")
    lines = stackgroups.summary_lines(report)
    lines += [f"{p.host}: {p.message}" for p in report.problems]
    _write_new(where / SUMMARY_FILE, "\n".join(lines) + "\n")
    for stack in report.stacks:
        _write_new(where / stackgroups.file_name(stack), stackgroups.task_text(stack))
    logger.debug("stacks of %d processes in %s", len(report.stacks), where)
    return where


def _new_dir(parent: Path, name: str, tries: int = 100) -> Path:
    """A directory of its own under `parent`, 0700: `name`, else `name-2`, `name-3`, ..."""
    for number in range(1, tries + 1):
        where = parent / (name if number == 1 else f"{name}-{number}")
        try:
            where.mkdir(mode=DIR_MODE)
        except FileExistsError:
            continue
        os.chmod(where, DIR_MODE)  # mkdir's mode is cut by the umask, never widened
        return where
    raise FileExistsError(f"{parent / name} and {tries - 1} more like it exist")


def _write_new(path: Path, text: str) -> None:
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_CLOEXEC, FILE_MODE)
    with os.fdopen(fd, "w") as f:
        os.fchmod(fd, FILE_MODE)
        f.write(text)


def job_dir(root: Path, job: str) -> Path | None:
    """The job's log directory under `root` when it is on this machine, else None."""
    candidate = root / job
    return candidate if os.path.isdir(candidate) else None


def with_files(report: StacksReport, root: Path, stamp: str) -> StacksReport:
    """The report, its per-task files written under each job's directory in `root` (when it
    is on this machine), and a note for each job whose directory is not."""
    by_job: dict[str, list[TaskStack]] = {}
    for stack in report.stacks:
        if stack.job_id:  # an empty DTRAIN_JOB_ID names no job: its directory would be root
            by_job.setdefault(stack.job_id, []).append(stack)
    written: list[str] = []
    notes = list(report.notes)
    for job, found in sorted(by_job.items()):
        directory = job_dir(root, job)
        if directory is None:
            notes.append(f"no directory for job {job} under {root}: stacks not written to files")
            continue
        part = replace(report, hosts=(HostStacks("", tuple(found)),))
        try:
            written.append(str(write_files(part, directory, stamp)))
        except OSError as exc:
            notes.append(f"cannot write stacks under {directory}: {exc.strerror or exc}")
    files = written[0] if len(written) == 1 else (", ".join(written) or None)
    return replace(report, files_dir=files, notes=tuple(notes))


class Background:
    """The stacks of a running job's tasks, taken in a thread over the launch's own agents and
    written under its log directory: a hung job's stop waits for them only so long."""

    def __init__(
        self,
        sessions: Mapping[str, AgentSession],
        job: str,
        job_dir: Path,
        budget_s: float,
    ) -> None:
        self.sessions = dict(sessions)
        self.job = job
        self.job_dir = job_dir
        self.budget_s = budget_s
        self.report: StacksReport | None = None
        self._done = threading.Event()

    def start(self) -> None:
        threading.Thread(target=self._take, name="dtrain-stacks", daemon=True).start()

    def _take(self) -> None:
        try:
            per_process_s = max(0.1, self.budget_s - 1.0)
            done = take_sessions(
                self.sessions, self.job, per_process_s=per_process_s, timeout_s=self.budget_s
            )
            hosts = tuple(done[key] for key in self.sessions if key in done)
            report = StacksReport(hosts, job=self.job)
            try:
                where = write_files(report, self.job_dir, time.strftime("%Y%m%d-%H%M%S"))
                report = replace(report, files_dir=str(where))
            except OSError as exc:
                note = f"cannot write stacks under {self.job_dir}: {exc.strerror or exc}"
                report = replace(report, notes=(note,))
            self.report = report
        finally:
            self._done.set()

    def is_done(self) -> bool:
        return self._done.is_set()

    def summary(self) -> list[str]:
        report = self.report
        if report is None:
            return [f"stacks: no answer within {self.budget_s:g}s; stopping the job anyway"]
        lines = [f"stacks: {line}" for line in stackgroups.summary_lines(report)]
        lines += [f"stacks: {p.host}: {p.message}" for p in report.problems]
        lines += [f"stacks: {note}" for note in report.notes]
        if where := stackgroups.files_line(report):
            lines.append(f"stacks: {where}")
        return lines
