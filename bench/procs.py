"""The benchmark's view of processes, through psutil: by tag, by host, alive or gone.

A run's tag is its unique stamp directory, in the command line of every task and remote shell
of that run; nothing is ever chosen by name. Each cluster host is a PID namespace whose PID 1
is its sshd, and the root namespace sees every host's processes under root-namespace pids,
but psutil has no notion of namespaces. It does not need one here: what runs on a host
descends from that host's sshd, and an orphan on a host is re-parented to the namespace's
init, which is that sshd, so "on the hosts" is "below one of their sshd pids" in the parent
map psutil reads from this machine.
"""

from __future__ import annotations

import contextlib
import os
import signal
import time
from collections.abc import Iterable

import psutil

TASK_PYTHON = os.path.realpath("/usr/bin/python3")
POLL_S = 0.02
GONE = (psutil.NoSuchProcess, psutil.ZombieProcess, psutil.AccessDenied)


def is_alive(proc: psutil.Process) -> bool:
    """Running (psutil checks the pid was not reused) and not a zombie, which holds nothing."""
    try:
        return proc.is_running() and proc.status() != psutil.STATUS_ZOMBIE
    except GONE:
        return False


def alive(procs: Iterable[psutil.Process]) -> list[psutil.Process]:
    return [proc for proc in procs if is_alive(proc)]


def tagged(tag: str) -> list[psutil.Process]:
    """Every live process whose command line holds `tag` (tasks, shells, ssh clients)."""
    found = []
    for proc in psutil.process_iter(["cmdline"]):
        cmdline = proc.info["cmdline"] or []
        if any(tag in part for part in cmdline) and is_alive(proc):
            found.append(proc)
    return found


def tasks(tag: str) -> list[psutil.Process]:
    """The run's task processes: the task program under the hosts' python (no launcher here
    places a task on this machine)."""
    found = []
    for proc in tagged(tag):
        with contextlib.suppress(*GONE):
            if os.path.realpath(proc.exe()) == TASK_PYTHON:
                found.append(proc)
    return found


def on_hosts(sshd_pids: Iterable[int]) -> list[int]:
    """Pids of every live process below these hosts' sshd listeners (each host's PID 1):
    agents, shells, tasks and per-connection sshd processes."""
    children: dict[int, list[int]] = {}
    for proc in psutil.process_iter(["ppid", "status"]):
        if proc.info["status"] != psutil.STATUS_ZOMBIE and proc.info["ppid"] is not None:
            children.setdefault(proc.info["ppid"], []).append(proc.pid)
    found: list[int] = []
    todo = list(sshd_pids)
    while todo:
        below = children.get(todo.pop(), [])
        found += below
        todo += below
    return found


def wait_gone(procs: Iterable[psutil.Process], timeout_s: float) -> bool:
    """Until every one of `procs` has ended (True), or `timeout_s` (False)."""
    pending = list(procs)
    deadline = time.monotonic() + timeout_s
    while pending:
        pending = alive(pending)
        if pending and time.monotonic() > deadline:
            return False
        time.sleep(POLL_S)
    return True


def kill(procs: Iterable[psutil.Process], signum: int = signal.SIGKILL) -> None:
    for proc in procs:
        with contextlib.suppress(*GONE):
            proc.send_signal(signum)  # psutil refuses a pid that was reused


def kill_pids(pids: Iterable[int]) -> None:
    """SIGKILL by pid: what is left on the cluster's own hosts after a run."""
    for pid in pids:
        with contextlib.suppress(*GONE):
            psutil.Process(pid).kill()


def killpg(pgid: int) -> None:
    with contextlib.suppress(ProcessLookupError, PermissionError):
        os.killpg(pgid, signal.SIGKILL)
