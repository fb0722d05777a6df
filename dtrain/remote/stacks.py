"""Where every job process on this host is right now: its Python stack, taken with py-spy.

The agent finds the job's processes as `dtrain ps` does (`procs.find`), keeps the Python ones,
and runs `py-spy dump` on all of them at once, each bounded by a timeout. py-spy is looked for
beside the process's own interpreter first (the job's environment), then on the task's and the
agent's PATH: dtrain installs nothing on hosts. py-spy pauses a process for milliseconds;
nothing else here touches the tasks. Standard library only, Python >= 3.6.
"""

import json
import os
import time
from typing import Any, Dict, List, Optional  # noqa: F401 - used in type comments

from . import procs, proto, spawn

TOOL = "py-spy"
MAX_PARALLEL = 16  # py-spy processes at once: each is short, but a host may run 64 tasks
MAX_FRAMES = 200  # per thread: deep recursion keeps its innermost and outermost frames


def is_python(pid):
    """True when the process runs a Python interpreter (its executable or a mapped libpython)."""
    try:
        exe = os.path.basename(os.readlink("/proc/%d/exe" % pid))
    except OSError:
        exe = ""
    if exe.startswith("python") or exe.startswith("pypy"):
        return True
    try:
        with open("/proc/%d/maps" % pid, "rb") as f:
            for line in f:
                if b"libpython" in line:
                    return True
    except OSError:
        pass
    return False


def interpreter_dirs(pid, cmdline, env):
    """Where the process's own Python lives: its argv[0], its executable, its virtualenv."""
    found = []  # type: List[str]
    if cmdline and "/" in cmdline[0]:
        cwd = ""
        try:
            cwd = os.readlink("/proc/%d/cwd" % pid)
        except OSError:
            pass
        found.append(os.path.dirname(os.path.join(cwd, cmdline[0])))
    try:
        found.append(os.path.dirname(os.readlink("/proc/%d/exe" % pid)))
    except OSError:
        pass
    for var in ("VIRTUAL_ENV", "CONDA_PREFIX"):
        if env.get(var):
            found.append(os.path.join(env[var], "bin"))
    unique = []  # type: List[str]
    for path in found:
        if path and path not in unique:
            unique.append(path)
    return unique


def interpreter_path(pid, cmdline, env):
    """The Python the process runs, as the process itself found it: its argv[0] (from its
    working directory, or on its PATH), else its executable. For a hint such as
    `PYTHON -m pip install py-spy`, which must name the job's environment (a virtualenv's
    `bin/python`, not the file that link resolves to)."""
    program = cmdline[0] if cmdline else ""
    if os.path.basename(program).startswith(("python", "pypy")):
        try:
            cwd = os.readlink("/proc/%d/cwd" % pid)
        except OSError:
            cwd = "/"
        found = procs.which(program, env.get("PATH", os.defpath), cwd)
        if found is not None:
            return os.path.normpath(os.path.join(cwd, found))
    try:
        return os.readlink("/proc/%d/exe" % pid)
    except OSError:
        return None


def find_tool(dirs, path_var):
    """py-spy in one of `dirs`, else on `path_var` (the task's PATH), else on the agent's PATH."""
    for directory in dirs:
        candidate = os.path.join(directory, TOOL)
        if os.path.isfile(candidate) and os.access(candidate, os.X_OK):
            return candidate
    for search in (path_var, None):
        found = procs.which(TOOL, search)
        if found:
            return found
    return None


def availability(python_path=None):
    """For doctor: the py-spy a job using `python_path` would get, and whether ptrace is allowed."""
    dirs = [os.path.dirname(python_path)] if python_path and "/" in python_path else []
    if python_path and "/" in python_path:
        real = os.path.dirname(os.path.realpath(python_path))
        if real not in dirs:
            dirs.append(real)
    return {
        "tool": find_tool(dirs, None),
        "looked_in": dirs,
        "ptrace_scope": ptrace_scope(),
        "is_root": os.getuid() == 0,
    }


def ptrace_scope():
    try:
        with open("/proc/sys/kernel/yama/ptrace_scope") as f:
            return int(f.read().strip())
    except (OSError, ValueError):
        return None


def _frames(raw):
    raw = list(raw or ())
    if len(raw) > MAX_FRAMES:
        cut = len(raw) - MAX_FRAMES
        keep = MAX_FRAMES * 3 // 4
        marker = {"name": "... %d frames left out ..." % cut, "short_filename": ""}
        kept = raw[:keep]
        kept.append(marker)
        kept.extend(raw[keep + cut :])
        raw = kept
    frames = []
    for frame in raw:
        frames.append(
            {
                "name": frame.get("name") or "?",
                "file": frame.get("short_filename") or frame.get("filename") or "",
                "line": frame.get("line") or 0,
                "native": bool(frame.get("module")),
            }
        )
    return frames


def parse_dump(text):
    """py-spy's --json output as a list of threads, innermost frame first."""

    threads = []
    for thread in json.loads(text):
        threads.append(
            {
                "id": thread.get("os_thread_id") or thread.get("thread_id"),
                "name": thread.get("thread_name"),
                "active": bool(thread.get("active")),
                "owns_gil": bool(thread.get("owns_gil")),
                "frames": _frames(thread.get("frames")),
            }
        )
    return threads


def explain(stderr, tool):
    """py-spy's own error as one line a person can act on."""
    lines = []
    for line in stderr.splitlines():
        line = line.strip()
        if line.startswith("Stack backtrace"):
            break
        if line and line != "Caused by:":
            lines.append(line.split(": ", 1)[1] if line[:1].isdigit() and ": " in line else line)
    first = ": ".join(lines[:3]) if lines else "no output"
    if first.startswith("Error: "):
        first = first[len("Error: ") :]
    lowered = first.lower()
    if "permission" in lowered or "not permitted" in lowered:
        return (
            "%s was not allowed to read the process (%s): it needs ptrace, e.g. "
            "kernel.yama.ptrace_scope=0, root, or CAP_SYS_PTRACE" % (tool, first)
        )
    return "%s failed: %s" % (tool, first)


def dump(pid, tool, native, timeout_s):
    """(threads, error) for one process: py-spy's answer, or why there is none.

    A stopped process (SIGSTOP, state T) cannot be paused again: py-spy reads it without
    pausing, which is exact for a process that does not run.
    """
    threads, error, stderr = _run_py_spy(pid, tool, native, timeout_s, False)
    if threads is None and "suspend" in stderr:
        threads, error, stderr = _run_py_spy(pid, tool, native, timeout_s, True)
    return threads, error


def _run_py_spy(pid, tool, native, timeout_s, nonblocking):
    argv = [tool, "dump", "--json", "--pid", str(pid)]
    if native:
        argv.append("--native")
    if nonblocking:
        argv.append("--nonblocking")
    try:
        code, out, err = spawn.run(argv, timeout_s=timeout_s)
    except OSError as exc:
        return None, "cannot run %s: %s" % (tool, exc.strerror or exc), ""
    if code is None:
        return None, "%s took longer than %gs" % (tool, timeout_s), ""
    stderr = err.decode("utf-8", "replace")
    if code != 0:
        return None, explain(stderr, tool), stderr
    try:
        return parse_dump(out.decode("utf-8", "replace")), None, ""
    except (ValueError, AttributeError, TypeError):
        return None, "%s printed something unexpected" % tool, ""


def _entry(described):
    """One process of the reply, with what is needed to dump it (None: not a Python process)."""
    pid = described["pid"]
    entry = {
        "pid": pid,
        "ppid": described.get("ppid"),
        "state": described.get("state"),
        "cmdline": described.get("cmdline") or [],
        "comm": described.get("comm"),
        "tags": described.get("tags") or {},
        "python": is_python(pid),
        "tool": None,
        "threads": None,
        "error": None,
        "looked_in": [],
        "interpreter": None,
    }
    if not entry["python"]:
        return entry
    env = procs.read_environ(pid) or {}
    entry["interpreter"] = interpreter_path(pid, entry["cmdline"], env)
    dirs = interpreter_dirs(pid, entry["cmdline"], env)
    entry["looked_in"] = dirs
    entry["tool"] = find_tool(dirs, env.get("PATH"))
    if entry["tool"] is None:
        entry["error"] = "%s is not installed (looked beside %s and on PATH)" % (
            TOOL,
            ", ".join(dirs) or "the interpreter",
        )
    return entry


def _run_all(entries, native, timeout_s):
    todo = [e for e in entries if e["tool"] is not None]

    def one(entry):
        started = time.monotonic()
        entry["threads"], entry["error"] = dump(entry["pid"], entry["tool"], native, timeout_s)
        entry["elapsed_s"] = round(time.monotonic() - started, 3)

    within_s = timeout_s * (len(todo) // MAX_PARALLEL + 1) + 1.0
    spawn.for_each(todo, one, MAX_PARALLEL, within_s)
    for entry in entries:
        if entry["tool"] is not None and entry["threads"] is None and entry["error"] is None:
            entry["error"] = "%s gave no answer in time" % TOOL


def take(request):
    """The stacks of the job's processes on this host, as the reply to a `stacks` request."""
    job = request.get(proto.STACKS_JOB)
    native = bool(request.get(proto.STACKS_NATIVE))
    timeout_s = float(request.get(proto.STACKS_PER_PROCESS_S, 5.0))
    table, selected = procs.find(job, include_dmlc=job is None)
    described = procs.describe(table, selected)
    entries = [_entry(d) for d in described]
    _run_all(entries, native, timeout_s)
    return {
        proto.STACKS_PROCESSES: entries,
        proto.REPLY_TIME: time.time(),
        proto.SCAN_USER: procs.user_name(),
    }
