"""Find and stop job processes by what they are (their environment), never by their name.

A job process is a process of this user whose environment carries `DTRAIN_JOB_ID` (any dtrain
job) or `DMLC_ROLE` (a parameter-server process however it was started), plus its descendants.
Reads /proc, so it needs nothing installed: standard library only, Python >= 3.6. Shared by
the agent's task cleanup, `dtrain ps`/`dtrain kill` and `dtrain doctor`'s stale-process check.
"""

import os
import shutil
import signal
import time
from typing import Dict, List, Optional, Tuple  # noqa: F401 - used in type comments

from . import proto
from .proto import JOB_ID_VAR, ROLE_VAR, TAG_VARS, TASK_VAR

_TICKS = os.sysconf("SC_CLK_TCK") if hasattr(os, "sysconf") else 100
_PAGE = os.sysconf("SC_PAGE_SIZE") if hasattr(os, "sysconf") else 4096
KILL_WAIT_S = 2.0  # after SIGKILL, how long a process may take to be gone


def which(program, path=None, cwd=None):
    # type: (str, Optional[str], Optional[str]) -> Optional[str]
    """The file `program` runs as, as execvp finds it: itself if it holds a `/`, else the
    first executable of that name on `path` (this process's PATH by default); None if there
    is none. With `cwd` (a task's, not the agent's), relative paths and entries count from
    there."""
    if cwd is not None:
        if path is None:
            path = os.environ.get("PATH", os.defpath)
        path = os.pathsep.join(os.path.join(cwd, folder) for folder in path.split(os.pathsep))
        if "/" in program:
            program = os.path.join(cwd, program)
    return shutil.which(program, path=path)


def boot_time():
    try:
        with open("/proc/stat", "rb") as f:
            for line in f:
                if line.startswith(b"btime "):
                    return float(line.split()[1])
    except OSError:
        pass
    return 0.0


class Proc:
    """One process as /proc shows it, with only the tag variables of its environment."""

    __slots__ = (
        "cmdline",
        "comm",
        "cpu_s",
        "pgid",
        "pid",
        "ppid",
        "rss",
        "sid",
        "start",
        "start_ticks",
        "state",
        "tags",
        "uid",
    )

    def __init__(self, pid, uid, stat, start, tags):
        self.pid = pid
        self.uid = uid
        self.state, self.ppid, self.pgid, self.sid, self.cpu_s, self.start_ticks = stat[:6]
        self.rss, self.comm = stat[6:]
        self.start = start
        self.tags = tags
        self.cmdline = []

    def to_dict(self):
        return {
            "pid": self.pid,
            "ppid": self.ppid,
            "pgid": self.pgid,
            "uid": self.uid,
            "state": self.state,
            "start": self.start,
            "cpu_s": self.cpu_s,
            "rss": self.rss,
            "cmdline": self.cmdline,
            "comm": self.comm,
            "tags": self.tags,
        }


def read_stat(pid):
    """(state, ppid, pgid, sid, cpu seconds, start ticks since boot, rss bytes, comm) or None."""
    try:
        with open("/proc/%d/stat" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    open_paren = data.find(b"(")
    close_paren = data.rfind(b")")
    if open_paren < 0 or close_paren < 0:
        return None
    comm = data[open_paren + 1 : close_paren].decode("utf-8", "replace")
    fields = data[close_paren + 2 :].split()
    # fields[0] is field 3 of proc(5): state, ppid, pgrp, session, ..., utime(14), stime(15),
    # ..., starttime(22), vsize(23), rss(24)
    try:
        cpu = (int(fields[11]) + int(fields[12])) / float(_TICKS)
        return (
            fields[0].decode(),
            int(fields[1]),
            int(fields[2]),
            int(fields[3]),
            cpu,
            int(fields[19]),
            int(fields[21]) * _PAGE,
            comm,
        )
    except (IndexError, ValueError):
        return None


def read_environ(pid):
    """The process's initial environment as a dict of str, or None if unreadable."""
    try:
        with open("/proc/%d/environ" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return None
    env = {}
    for item in data.split(b"\0"):
        key, sep, value = item.partition(b"=")
        if sep:
            env[key.decode("utf-8", "surrogateescape")] = value.decode("utf-8", "replace")
    return env


def read_tags(pid):
    """The tag variables of the process's environment ({} if unreadable)."""
    env = read_environ(pid) or {}
    return {key: env[key] for key in TAG_VARS if key in env}


def start_time(btime, stat):
    """When the process of `stat` started, in seconds since the epoch (`btime`: boot_time())."""
    return btime + stat[5] / float(_TICKS)


def read_cmdline(pid):
    try:
        with open("/proc/%d/cmdline" % pid, "rb") as f:
            data = f.read()
    except OSError:
        return []
    return [part.decode("utf-8", "replace") for part in data.rstrip(b"\0").split(b"\0")]


def pids():
    try:
        names = os.listdir("/proc")
    except OSError:
        return []
    return [int(name) for name in names if name.isdigit()]


def pid_namespace(pid):
    """The PID namespace `pid` lives in ('pid:[4026531836]'), or None when unreadable."""
    try:
        return os.readlink("/proc/%s/ns/pid" % pid)
    except OSError:
        return None


def snapshot(uid=None, with_tags=True, since_ticks=None, own_namespace=False):
    """Every process of `uid` (default: ours), keyed by pid.

    With `since_ticks`, only the tags of processes started at or after that moment (in clock
    ticks since boot) are read: a task's strays cannot be older than the task, and reading
    every environment on a busy host costs tens of milliseconds. With `own_namespace`, only
    processes of our PID namespace: root's /proc also shows every container's processes,
    which no launcher on this host started and no cleanup here should touch.
    """
    if uid is None:
        uid = os.getuid()
    btime = boot_time()
    ours = pid_namespace("self") if own_namespace else None
    result = {}
    for pid in pids():
        try:
            owner = os.stat("/proc/%d" % pid).st_uid
        except OSError:
            continue
        if owner != uid:
            continue
        if ours is not None and pid_namespace(pid) not in (ours, None):
            continue
        stat = read_stat(pid)
        if stat is None:
            continue
        tags = {}
        if with_tags and (since_ticks is None or stat[5] >= since_ticks):
            tags = read_tags(pid)
        proc = Proc(pid, owner, stat, start_time(btime, stat), tags)
        result[pid] = proc
    return result


def ancestors(pid, table=None):
    """pid and its ancestors: a cleanup must never stop the session it runs in."""
    chain = set()
    while pid > 1 and pid not in chain:
        chain.add(pid)
        if table is not None and pid in table:
            pid = table[pid].ppid
        else:
            stat = read_stat(pid)
            if stat is None:
                break
            pid = stat[1]
    return chain


def descendants(table, root):
    """Every process below `root` in `table` by parent links (not `root` itself)."""
    children = {}  # type: Dict[int, List[int]]
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    found = set()
    stack = list(children.get(root, ()))
    while stack:
        pid = stack.pop()
        if pid not in found:
            found.add(pid)
            stack.extend(children.get(pid, ()))
    return found


def select_job_processes(table, job=None, task=None, include_dmlc=True, exclude=()):
    """Tagged processes and all their descendants, as a sorted list of pids.

    With `job`, only that dtrain job's processes; with `task` too, only that task's.
    """
    excluded = set(exclude)
    roots = set()
    for proc in table.values():
        if proc.pid in excluded or proc.state == "Z":
            continue
        tags = proc.tags
        if job is not None:
            if tags.get(JOB_ID_VAR) != job:
                continue
            if task is not None and tags.get(TASK_VAR) != task:
                continue
        elif JOB_ID_VAR not in tags and not (include_dmlc and ROLE_VAR in tags):
            continue
        roots.add(proc.pid)
    children = {}  # type: Dict[int, List[int]]
    for proc in table.values():
        children.setdefault(proc.ppid, []).append(proc.pid)
    selected = set()
    stack = list(roots)
    while stack:
        pid = stack.pop()
        if pid in selected or pid in excluded:
            continue
        if table[pid].state == "Z":
            continue
        selected.add(pid)
        stack.extend(children.get(pid, ()))
    return sorted(selected)


def describe(table, selected):
    """Selected processes as dicts with their command lines, for ps/kill/doctor reports.

    A descendant that carries no tag of its own (its environment was replaced) gets the tags
    of its nearest tagged ancestor, and `inherited_from` names that ancestor. `orphaned` says
    the process's tree has lost whatever started it (its topmost job process was adopted by
    init): a leftover, as opposed to a job whose launcher or agent still runs.
    """
    chosen = set(selected)
    result = []
    for pid in selected:
        proc = table.get(pid)
        if proc is None:
            continue
        proc.cmdline = read_cmdline(pid)
        entry = proc.to_dict()
        entry["inherited_from"] = None
        owner = proc
        seen = set()
        while not owner.tags and owner.ppid in chosen and owner.ppid not in seen:
            seen.add(owner.ppid)
            owner = table[owner.ppid]
        if owner is not proc and owner.tags:
            entry["tags"] = dict(owner.tags)
            entry["inherited_from"] = owner.pid
        root = proc
        seen = set()
        while root.ppid in chosen and root.ppid not in seen:
            seen.add(root.ppid)
            root = table[root.ppid]
        entry["orphaned"] = root.ppid <= 1
        result.append(entry)
    return result


def alive(pid, start_ticks=None):
    """True while `pid` runs (zombies are dead); with `start_ticks`, only that same process."""
    return _runs(read_stat(pid), start_ticks)


def _runs(stat, start_ticks=None):
    if stat is None or stat[0] in ("Z", "X", "x"):
        return False
    return start_ticks is None or stat[5] == start_ticks


def _same(table, pid):
    proc = table.get(pid)
    return proc is not None and alive(pid, proc.start_ticks)


def signal_processes(table, selected, signum, errors=None):
    """Signal whole process groups where every member is selected, single pids otherwise.

    Only processes that are still the ones in `table` (same start time): a pid reused by
    someone else since the snapshot is never signalled. Failures land in `errors` by pid.
    Returns the pids signalled: one already gone was not (its launcher stopped it, or it exited).
    """
    stats = {pid: read_stat(pid) for pid in pids()}  # every user's: a group may hold others'
    chosen = set(
        pid for pid in selected if pid in table and _runs(stats.get(pid), table[pid].start_ticks)
    )
    groups = {}  # type: Dict[int, List[int]]
    for pid, stat in stats.items():
        if stat is not None and stat[0] != "Z":
            groups.setdefault(stat[2], []).append(pid)
    done = set()
    signalled = set()
    for pid in selected:
        if pid in done or pid not in chosen:
            continue
        pgid = table[pid].pgid
        members = groups.get(pgid, [])
        try:
            if pgid > 1 and members and all(member in chosen for member in members):
                done.update(members)
                os.killpg(pgid, signum)
                signalled.update(members)
            else:
                done.add(pid)
                os.kill(pid, signum)
                signalled.add(pid)
        except ProcessLookupError:
            pass
        except OSError as exc:
            if errors is not None:
                errors[pid] = exc.strerror or str(exc)
    return signalled


def _wait_gone(table, waiting, seconds, poll_s):
    deadline = time.monotonic() + max(seconds, 0.0)
    remaining = [pid for pid in waiting if _same(table, pid)]
    while remaining and time.monotonic() < deadline:
        time.sleep(poll_s)
        remaining = [pid for pid in remaining if _same(table, pid)]
    return remaining


def terminate(table, selected, grace_s, poll_s=0.05, errors=None):
    """SIGTERM (and SIGCONT, so stopped processes see it), wait up to the grace, SIGKILL what
    is left, verify.

    Returns (killed_by_term, killed_by_kill, survivors, already_gone) as lists of pids;
    `already_gone` were gone before they could be signalled, so this did not stop them.
    """
    if not selected:
        return [], [], [], []
    signalled = signal_processes(table, selected, signal.SIGTERM, errors)
    signal_processes(table, selected, signal.SIGCONT)
    remaining = _wait_gone(table, selected, grace_s, poll_s)
    already_gone = [pid for pid in selected if pid not in remaining and pid not in signalled]
    by_term = [pid for pid in selected if pid not in remaining and pid in signalled]
    survivors = []  # type: List[int]
    if remaining:
        signal_processes(table, remaining, signal.SIGKILL, errors)
        survivors = _wait_gone(table, remaining, KILL_WAIT_S, poll_s)
    by_kill = [pid for pid in remaining if pid not in survivors]
    return by_term, by_kill, survivors, already_gone


def why_alive(pid, errors):
    """Why a process outlived SIGKILL, in words a person can act on."""
    if pid in errors:
        return "could not be signalled: %s" % errors[pid]
    stat = read_stat(pid)
    state = stat[0] if stat else "?"
    if state == "D":
        return (
            "in uninterruptible sleep (state D): stuck in a kernel call (a hung NFS mount or "
            "device driver, e.g. the GPU's); it dies when the call returns, else reboot"
        )
    return "still alive %.0fs after SIGKILL (state %s)" % (KILL_WAIT_S, state)


# ---- what the agent's scan and kill requests do ------------------------------------------


def find(job=None, include_dmlc=True):
    """(table, pids) of this user's job processes in this PID namespace.

    Never this process or the session it runs in, nor a container's processes.
    """
    table = snapshot(own_namespace=True)
    selected = select_job_processes(
        table, job=job, include_dmlc=include_dmlc, exclude=ancestors(os.getpid(), table)
    )
    return table, selected


def user_name():
    try:
        import pwd

        return pwd.getpwuid(os.getuid()).pw_name
    except (ImportError, KeyError):
        return str(os.getuid())


def scan(job=None, include_dmlc=True, cpu_window_s=0.0):
    """The job processes on this host, as a reply for `dtrain ps` and doctor's stale check.

    With `cpu_window_s`, each process's CPU % over that window too: a process spinning or
    stuck idle stands out, where the total CPU time since it started says little.
    """
    table, selected = find(job, include_dmlc)
    reply = _found(table, selected)
    if cpu_window_s > 0 and selected:
        time.sleep(min(float(cpu_window_s), 5.0))
        for entry in reply[proto.SCAN_PROCESSES]:
            stat = read_stat(entry["pid"])
            if stat is not None and stat[5] == table[entry["pid"]].start_ticks:
                used = stat[4] - table[entry["pid"]].cpu_s
                entry[proto.SCAN_CPU_PERCENT] = round(100.0 * used / cpu_window_s, 1)
                entry["state"] = stat[0]
    return reply


def _found(table, selected):
    return {
        proto.SCAN_PROCESSES: describe(table, selected),
        proto.REPLY_TIME: time.time(),
        "uid": os.getuid(),
        proto.SCAN_USER: user_name(),
    }


def kill(job=None, include_dmlc=True, grace_s=5.0, dry_run=False, rounds=3):
    """Stop the job processes on this host: TERM, grace, KILL, verify, as a reply.

    Processes that join the job while it is being stopped (a supervisor respawning workers)
    are found by a fresh scan and stopped too, for a bounded number of rounds.
    """
    table, selected = find(job, include_dmlc)
    reply = _found(table, selected)
    for field in (proto.KILL_TERM, proto.KILL_KILL, proto.KILL_GONE, proto.KILL_SURVIVORS):
        reply[field] = []
    reply["dry_run"] = bool(dry_run)
    if dry_run:
        return reply
    errors = {}  # type: Dict[int, str]
    known = set((pid, table[pid].start_ticks) for pid in selected)
    survivors = []  # type: List[Tuple[int, int]]
    for round_number in range(rounds):
        grace = float(grace_s)
        if round_number:
            table, fresh = find(job, include_dmlc)
            selected = [pid for pid in fresh if (pid, table[pid].start_ticks) not in known]
            if not selected:
                break
            reply[proto.SCAN_PROCESSES].extend(describe(table, selected))
            known.update((pid, table[pid].start_ticks) for pid in selected)
            grace = min(grace, 1.0)
        by_term, by_kill, left, gone = terminate(table, selected, grace, errors=errors)
        reply[proto.KILL_TERM].extend(by_term)
        reply[proto.KILL_KILL].extend(by_kill)
        reply[proto.KILL_GONE].extend(gone)
        survivors.extend((pid, table[pid].start_ticks) for pid in left)
    reply[proto.KILL_SURVIVORS] = [
        {"pid": pid, "reason": why_alive(pid, errors)}
        for pid, ticks in survivors
        if alive(pid, ticks)
    ]
    reply[proto.REPLY_TIME] = time.time()
    return reply
