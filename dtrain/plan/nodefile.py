"""A PBS/Torque or LSF job's hosts: its node file -> dtrain's hosts (pure).

Both schedulers hand a job one file that lists one line per slot: `$PBS_NODEFILE` (a host
name a line, a host once per core or `ncpus`) and LSF's `$LSB_DJOB_HOSTFILE` (the same). dtrain
reads it as a hosts file: each host once, in the order it first appears, its lines counted as
its slots, so `dtrain launch` with no -H places tasks as the scheduler granted them.
"""

from __future__ import annotations

import enum
from collections.abc import Mapping
from dataclasses import dataclass

from dtrain.errors import UsageError
from dtrain.plan.hosts import Host, Origin

MAX_LINES = 1_000_000  # a slot a line: more than any job, less than a runaway file


class Scheduler(enum.Enum):
    PBS = "PBS"
    LSF = "LSF"

    @property
    def file_var(self) -> str:
        return "PBS_NODEFILE" if self is Scheduler.PBS else "LSB_DJOB_HOSTFILE"

    @property
    def job_var(self) -> str:
        return "PBS_JOBID" if self is Scheduler.PBS else "LSB_JOBID"

    @property
    def starter(self) -> str:
        """The scheduler's own command that runs a task on one host of the job."""
        return "pbsdsh" if self is Scheduler.PBS else "blaunch"


@dataclass(frozen=True)
class Job:
    """The PBS or LSF job this shell runs in: which scheduler, its id, its node file."""

    scheduler: Scheduler
    job_id: str
    node_file: str


def current_job(env: Mapping[str, str]) -> Job | None:
    """The job whose node file this shell has (PBS first: a PBS job inside LSF is unheard of,
    and the variable names cannot clash)."""
    for scheduler in Scheduler:
        path = env.get(scheduler.file_var, "")
        if path:
            return Job(scheduler, env.get(scheduler.job_var, ""), path)
    return None


def parse_node_file(text: str, source: str) -> tuple[Host, ...]:
    """One host name a line, a line a slot -> each host once, in first-seen order, with its
    line count as its slots. Blank lines are skipped; a line with more than one word (not a
    node file), or a file with no host, is an error naming the file and line."""
    slots: dict[str, int] = {}
    first_line: dict[str, int] = {}
    for number, line in enumerate(text.splitlines(), start=1):
        if number > MAX_LINES:
            raise UsageError(
                f"{source}: more than {MAX_LINES} lines",
                hint="check that it is the job's node file",
            )
        words = line.split()
        if not words:
            continue
        if len(words) > 1:
            raise UsageError(
                f'{source}:{number}: "{line.strip()[:80]}" is not a host name',
                hint="a node file has one host name a line (one line per slot)",
            )
        name = words[0]
        slots[name] = slots.get(name, 0) + 1
        first_line.setdefault(name, number)
    if not slots:
        raise UsageError(f"{source} names no host", hint="check that it is the job's node file")
    return tuple(
        Host(name=name, slots=count, origin=Origin(source, first_line[name]))
        for name, count in slots.items()
    )
