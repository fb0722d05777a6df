"""A Grid Engine parallel-environment job as dtrain's hosts: the job's variables and its
`$PE_HOSTFILE` (pure).

Inside a job submitted with `qsub -pe NAME N`, Grid Engine sets `JOB_ID`, `SGE_ROOT`, `PE` and
`PE_HOSTFILE`, a file with one line per granted queue instance:

    node3 2 all.q@node3 UNDEFINED
    node1 1 all.q@node1 UNDEFINED

(host, slots, queue, processor range; the job script runs on the first host). A host granted
slots in two queues has two lines: dtrain makes it one host with the slots added up, in the
order the hosts first appear. The caller reads the file; this module turns its text into hosts
or an error that names the file and line.
"""

from __future__ import annotations

import re
import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dtrain.errors import UsageError
from dtrain.plan.hosts import MAX_SLOTS, Host, Origin

JOB_ID_VAR = "JOB_ID"
ROOT_VAR = "SGE_ROOT"
PE_VAR = "PE"
HOSTFILE_VAR = "PE_HOSTFILE"
MAX_HOSTS = 100_000
SUBMIT_HINT = "submit the job with a parallel environment: qsub -pe NAME SLOTS job.sh"

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")


@dataclass(frozen=True)
class PeJob:
    """The Grid Engine job dtrain runs in: its id, PE, and hosts with their granted slots."""

    job_id: str
    pe: str
    hosts: tuple[Host, ...]

    def summary(self) -> str:
        """`3 hosts h3, h1, h2 (PE mpi, 4 slots)`, for the line that says where dtrain runs."""
        count = len(self.hosts)
        slots = sum(h.slot_count for h in self.hosts)
        names = ", ".join(h.name for h in self.hosts)
        pe = f"PE {self.pe}, " if self.pe else ""
        return f"{count} host{'s' if count != 1 else ''} {names} ({pe}{slots} slots)"


def in_job(env: Mapping[str, str]) -> bool:
    """Inside a Grid Engine job (its script, or a task it started): the job's id and the
    cell's root are set. SGE_ROOT alone is set in every shell of a site's login nodes."""
    return bool(env.get(JOB_ID_VAR)) and bool(env.get(ROOT_VAR))


def hostfile_path(env: Mapping[str, str]) -> str:
    """Where the job's PE_HOSTFILE is; one line when the job has none (no `-pe`)."""
    path = env.get(HOSTFILE_VAR, "")
    if not path:
        raise UsageError(
            f"inside Grid Engine job {env.get(JOB_ID_VAR, '?')}, which has no parallel "
            f"environment ({HOSTFILE_VAR} is not set)",
            hint=f"{SUBMIT_HINT}, or pass -H hosts",
        )
    return path


def parse_hostfile(text: str, path: str) -> tuple[Host, ...]:
    """The hosts of a PE_HOSTFILE in the order they first appear, each with the slots of all
    its lines; a line that is not `host slots queue [range]` is an error naming `path:line`."""
    slots: dict[str, int] = {}
    origins: dict[str, Origin] = {}
    names: dict[str, str] = {}  # by lower-case name: the spelling of the first line
    for number, line in enumerate(text.splitlines(), start=1):
        words = line.split()
        if not words:
            continue
        where = Origin(path, number)
        if len(words) < 3:
            raise UsageError(
                f'{where}: "{line.strip()}" is not "host slots queue processors"',
                hint="this file is Grid Engine's own: run dtrain inside the job it belongs to",
            )
        name, count = words[0], words[1]
        if not _NAME_RE.match(name):
            raise UsageError(f'{where}: "{name}" is not a host name')
        if not count.isdigit() or not 1 <= int(count) <= MAX_SLOTS:
            raise UsageError(f'{where}: "{count}" is not a slot count (1-{MAX_SLOTS})')
        key = name.lower()
        names.setdefault(key, name)
        origins.setdefault(key, where)
        slots[key] = min(MAX_SLOTS, slots.get(key, 0) + int(count))
        if len(slots) > MAX_HOSTS:
            raise UsageError(f"{where}: more than {MAX_HOSTS} hosts")
    if not slots:
        raise UsageError(f"{path} names no host", hint=SUBMIT_HINT)
    return tuple(Host(name=names[k], slots=slots[k], origin=origins[k]) for k in slots)


def job_from(env: Mapping[str, str], hostfile_text: str) -> PeJob:
    """The job these variables and this PE_HOSTFILE text describe."""
    path = hostfile_path(env)
    return PeJob(env.get(JOB_ID_VAR, ""), env.get(PE_VAR, ""), parse_hostfile(hostfile_text, path))


def inherit_argv(host: str, command: Sequence[str]) -> list[str]:
    """`qrsh -inherit` running `command` on one granted host of the job: without stdin, with
    this process's whole environment (-V: the key and address of a connect-back reach the
    agent there, never its argv). qrsh joins its arguments for the host's login shell, as ssh
    does, so `command` goes as one quoted word."""
    return ["qrsh", "-inherit", "-nostdin", "-V", host, shlex.join(command)]


def local_name(hostname: str, names: Sequence[str]) -> str | None:
    """Which of the job's host names is this machine (`hostname`): the same
    name, else the same first label (`node1` and `node1.cluster`); None if neither."""
    wanted = hostname.lower()
    for name in names:
        if name.lower() == wanted:
            return name
    short = wanted.split(".")[0]
    for name in names:
        if name.lower().split(".")[0] == short:
            return name
    return None
