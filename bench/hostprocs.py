"""Finding, watching and killing the benchmark's processes through /proc, by tag or by pid.

Every cluster host runs in its own PID namespace, but all of them are visible from here (the
root namespace) with root-namespace pids, so the harness can watch and kill any host's task
without ssh. A run's tag is its unique stamp directory, which appears in the command line of
every process of that run (tasks, remote shells, ssh clients); nothing is ever chosen by name.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable
from dataclasses import dataclass
from pathlib import Path

TASK_PYTHON = os.path.realpath("/usr/bin/python3")
_OWN_PID_NS = os.readlink("/proc/self/ns/pid")
_TICKS = os.sysconf("SC_CLK_TCK")


@dataclass(frozen=True)
class Pid:
    """A process as (pid, start time in ticks), so a recycled pid is never mistaken for it."""

    pid: int
    start: int


def _stat(pid: int) -> list[str] | None:
    """Fields of /proc/PID/stat after the command name: [0] state, [1] ppid, [2] pgid..."""
    try:
        text = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return text[text.rindex(")") + 2 :].split()


def _all_pids() -> list[int]:
    return [int(name) for name in os.listdir("/proc") if name.isdigit()]


def is_alive(proc: Pid) -> bool:
    """Alive and not a zombie: a zombie has released everything a task holds."""
    fields = _stat(proc.pid)
    return fields is not None and fields[0] != "Z" and int(fields[19]) == proc.start


def tagged(tag: str) -> list[Pid]:
    """Every live process whose command line contains `tag` (tasks, shells, ssh clients)."""
    found = []
    needle = tag.encode()
    for pid in _all_pids():
        try:
            cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
        except OSError:
            continue
        if needle not in cmdline:
            continue
        fields = _stat(pid)
        if fields is not None and fields[0] != "Z":
            found.append(Pid(pid, int(fields[19])))
    return found


def remote_tagged(tag: str) -> list[Pid]:
    """The run's processes on cluster hosts (another PID namespace): tasks and remote shells."""
    found = []
    for proc in tagged(tag):
        try:
            if os.readlink(f"/proc/{proc.pid}/ns/pid") != _OWN_PID_NS:
                found.append(proc)
        except OSError:
            continue
    return found


def tasks(tag: str) -> tuple[list[Pid], list[Pid]]:
    """The run's task processes (the task program under the hosts' python): (remote, local).

    Remote means in another PID namespace, i.e. on a cluster host; the dmlc tracker's
    scheduler is the only local one.
    """
    remote: list[Pid] = []
    local: list[Pid] = []
    for proc in tagged(tag):
        try:
            exe = os.readlink(f"/proc/{proc.pid}/exe")
            namespace = os.readlink(f"/proc/{proc.pid}/ns/pid")
        except OSError:
            continue
        if os.path.realpath(exe) != TASK_PYTHON:
            continue
        (local if namespace == _OWN_PID_NS else remote).append(proc)
    return remote, local


def alive(procs: Iterable[Pid]) -> list[Pid]:
    return [proc for proc in procs if is_alive(proc)]


def wait_gone(procs: Iterable[Pid], deadline: float, poll_s: float = 0.01) -> float | None:
    """The wall time (time.time()) when every one of `procs` was gone; None if some outlive
    the wall-clock `deadline`."""
    pending = list(procs)
    while True:
        pending = alive(pending)
        now = time.time()
        if not pending:
            return now
        if now >= deadline:
            return None
        time.sleep(poll_s)


def others_in_namespaces(namespaces: dict[str, int]) -> int:
    """How many processes other than each namespace's PID 1 live in these PID namespaces.

    `namespaces` maps a PID-namespace id (readlink of /proc/PID/ns/pid) to its PID 1.
    """
    count = 0
    for pid in _all_pids():
        try:
            namespace = os.readlink(f"/proc/{pid}/ns/pid")
        except OSError:
            continue
        if namespaces.get(namespace, pid) != pid:
            count += 1
    return count


def pid_namespace(pid: int) -> str:
    return os.readlink(f"/proc/{pid}/ns/pid")


def kill(procs: Iterable[Pid], signum: int = signal.SIGKILL) -> None:
    for proc in procs:
        if is_alive(proc):
            with contextlib.suppress(ProcessLookupError):
                os.kill(proc.pid, signum)


def group_alive(pgid: int) -> bool:
    """True while any non-zombie process is in process group `pgid`."""
    for pid in _all_pids():
        fields = _stat(pid)
        if fields is not None and fields[0] != "Z" and int(fields[2]) == pgid:
            return True
    return False


def killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)


def cpu_of_tree(pid: int) -> float:
    """CPU seconds of `pid` plus all its children it has reaped (utime+stime+cutime+cstime).

    For a host's PID 1 (its sshd) this is everything that ran and finished on the host.
    """
    fields = _stat(pid)
    if fields is None:
        return 0.0
    return sum(int(fields[i]) for i in (11, 12, 13, 14)) / _TICKS


def cpu_of_live_tree(pid: int) -> float:
    """CPU seconds of `pid` and its live descendants (utime+stime), as they stand now."""
    fields = _stat(pid)
    if fields is None:
        return 0.0
    total = (int(fields[11]) + int(fields[12])) / _TICKS
    with contextlib.suppress(OSError):  # gone meanwhile
        for task in os.listdir(f"/proc/{pid}/task"):
            with contextlib.suppress(OSError):
                children = Path(f"/proc/{pid}/task/{task}/children").read_text().split()
                total += sum(cpu_of_live_tree(int(child)) for child in children)
    return total


def footprint(pgid: int, also: Iterable[Pid] = ()) -> dict[str, float]:
    """Processes, threads, open fds and RSS (MB) of every live process in group `pgid`, plus
    `also` (helpers that left the group, like pdsh's ssh clients, found by tag)."""
    found = {"processes": 0.0, "threads": 0.0, "fds": 0.0, "rss_mb": 0.0}
    extra = {proc.pid for proc in also}
    for pid in _all_pids():
        fields = _stat(pid)
        if fields is None or fields[0] == "Z":
            continue
        if int(fields[2]) != pgid and pid not in extra:
            continue
        try:
            status = Path(f"/proc/{pid}/status").read_text()
            fds = len(os.listdir(f"/proc/{pid}/fd"))
        except OSError:
            continue
        found["processes"] += 1
        found["fds"] += fds
        for line in status.splitlines():
            if line.startswith("Threads:"):
                found["threads"] += int(line.split()[1])
            elif line.startswith("VmRSS:"):
                found["rss_mb"] += int(line.split()[1]) / 1024
    return found
