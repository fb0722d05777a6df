"""What `dtrain doctor` asks of one host, answered by looking, each answer bounded in time.

The interpreter a command would run and its installed distributions, a file's hash, the
variables that steer ps-lite, GPUs, which firewall tool holds rules, what listens on a port
(the TCP probes between hosts are `netprobe`'s). It runs inside the agent, in the login
environment tasks get, so what it finds is what a task would see, and it changes nothing on
the host. Standard library only, Python >= 3.6.
"""

import errno
import hashlib
import json
import os
import socket
import stat
import threading
import time
from typing import Any, Dict, List  # noqa: F401 - used in type comments

from . import files, procs, proto, spawn, stacks

ENV_PREFIXES = ("DMLC_", "PS_")
ENV_NAMES = ("OMP_NUM_THREADS", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES")
RUN_TIMEOUT_S = 15.0  # one helper program (the interpreter listing its packages, nvidia-smi)
TOOL_TIMEOUT_S = 3.0  # one firewall tool
RESOLVE_TIMEOUT_S = 3.0
SBIN_DIRS = ("/usr/local/sbin", "/usr/sbin", "/sbin")

# Runs in the interpreter under test, which may be old: no f-strings, standard library only.
# importlib.metadata lists the distributions from Python 3.8 on; before, pkg_resources.
_LIST_DISTRIBUTIONS = r"""
import json, sys
found = {}
error = None
try:
    try:
        from importlib import metadata
    except ImportError:
        import pkg_resources
        for dist in pkg_resources.working_set:
            found.setdefault(dist.project_name, dist.version)
    else:
        for dist in metadata.distributions():
            try:
                name, version = dist.metadata["Name"], dist.version
            except Exception:  # metadata it cannot read loses that one, not the listing
                continue
            if name and name not in found:
                found[name] = version
except Exception as exc:
    error = "cannot list installed distributions: %s" % exc
json.dump({
    "executable": sys.executable,
    "version": "%d.%d.%d" % tuple(sys.version_info[:3]),
    "prefix": sys.prefix,
    "distributions": found,
    "error": error,
}, sys.stdout)
"""


# ---- environment --------------------------------------------------------------------------


def looks_like_python(program):
    name = os.path.basename(program)
    return name.startswith("python") or name.startswith("pypy")


def resolve_program(program, cwd):
    """The file `program` names, as the agent's spawn would find it (cwd, then PATH)."""
    if "/" in program:
        path = os.path.join(cwd, program)  # an absolute `program` stays itself
        return path if os.path.isfile(path) and os.access(path, os.X_OK) else None
    return procs.which(program)


def shebang_interpreter(path):
    """`python3` for `#!/usr/bin/env python3`, the path for `#!/opt/py/bin/python`, else None."""
    try:
        with open(path, "rb") as f:
            first = f.readline(512)
    except OSError:
        return None
    if not first.startswith(b"#!"):
        return None
    words = first[2:].decode("utf-8", "replace").split()
    if words and os.path.basename(words[0]) == "env":
        words = [w for w in words[1:] if not w.startswith("-")]
    if words and looks_like_python(words[0]):
        return words[0]
    return None


def interpreter(program, cwd):
    """The Python that `program` runs here: its path, version and installed distributions."""
    result = {"program": program, "resolved": resolve_program(program, cwd), "interpreter": None}
    if result["resolved"] is None:
        result["error"] = "%s: command not found (PATH=%s)" % (program, os.environ.get("PATH", ""))
        return result
    chosen = program if looks_like_python(program) else shebang_interpreter(result["resolved"])
    if chosen is None:
        result["error"] = None  # not a Python program: nothing to compare beyond its path
        return result
    path = resolve_program(chosen, cwd)
    result["interpreter"] = chosen
    if path is None:
        result["error"] = "%s (from the #! line of %s): command not found" % (
            chosen,
            result["resolved"],
        )
        return result
    code, out, err = run([path, "-c", _LIST_DISTRIBUTIONS], cwd)
    if code != 0:
        result["error"] = "%s could not list its packages (exit %s): %s" % (
            path,
            code,
            last_line(err),
        )
        return result
    try:
        result.update(json.loads(out.strip()))
    except ValueError:
        result["error"] = "%s printed something unexpected: %s" % (path, last_line(out))
    return result


def run(argv, cwd=None, timeout_s=RUN_TIMEOUT_S):
    """(exit code or None on timeout/failure to start, stdout, stderr), never longer than asked.

    The program runs in the agent's environment without its job tags: a helper is never one
    of a job's processes, even to a scan that runs while it does."""
    if cwd is not None and not os.path.isdir(cwd):
        cwd = None
    env = {key: value for key, value in os.environ.items() if key not in proto.TAG_VARS}
    try:
        code, out, err = spawn.run(argv, cwd, env, timeout_s)
    except OSError as exc:
        return None, "", str(exc.strerror or exc)
    if code is None:
        return None, "", "timed out after %gs" % timeout_s
    return code, out.decode("utf-8", "replace"), err.decode("utf-8", "replace")


def last_line(text):
    lines = [line for line in text.strip().splitlines() if line.strip()]
    return lines[-1][:300] if lines else "(no output)"


def file_facts(directory, relative, synced=False):
    """Whether `directory` exists, and the SHA-256 of `relative` in it (None: not a file);
    when launch is to copy it there (`synced`), why it could not (the launch's own check)."""
    result = {"dir": directory, "dir_exists": os.path.isdir(directory)}
    if synced:
        result["sync_problem"] = files.destination_problem(directory)
    if relative is None:
        return result
    path = relative if os.path.isabs(relative) else os.path.join(directory, relative)
    result["file"] = path
    try:
        result["sha256"], result["size"] = _file_digest(path)
    except OSError as exc:
        result["sha256"] = None
        result["error"] = exc.strerror or str(exc)
    return result


def _file_digest(path):
    """SHA-256 and size of a regular file, reading no more than its size when opened: a
    script named `/dev/zero` or a FIFO would otherwise be read, or waited on, forever."""
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    with os.fdopen(fd, "rb") as f:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode):
            raise OSError(errno.EINVAL, "not a regular file")
        digest = hashlib.sha256()
        left = info.st_size
        while left > 0:
            chunk = f.read(min(1 << 20, left))
            if not chunk:
                break
            digest.update(chunk)
            left -= len(chunk)
    return digest.hexdigest(), info.st_size


def env_facts():
    return {
        key: value
        for key, value in os.environ.items()
        if key.startswith(ENV_PREFIXES) or key in ENV_NAMES
    }


def gpu_facts():
    """GPUs as nvidia-smi lists them, or {"present": False} where there is no nvidia-smi."""
    tool = procs.which("nvidia-smi")
    if tool is None:
        return {"present": False}
    code, out, err = run([tool, "--query-gpu=name,driver_version", "--format=csv,noheader"])
    if code != 0:
        return {"present": True, "error": last_line(err or out)}
    gpus = []
    for line in out.splitlines():
        if line.strip():
            name, _, driver = line.rpartition(",")
            gpus.append([name.strip(), driver.strip()])
    return {"present": True, "gpus": gpus}


def hostname_facts():
    """This host's name and what it resolves to here, bounded (a resolver can hang)."""
    name = socket.gethostname()
    found = {}  # type: Dict[str, Any]

    def resolve():
        try:
            infos = socket.getaddrinfo(name, None, socket.AF_INET, socket.SOCK_STREAM)
            found["addresses"] = sorted(set(info[4][0] for info in infos))
        except OSError as exc:
            found["error"] = str(exc.strerror or exc)

    resolving = threading.Thread(target=resolve, daemon=True)
    resolving.start()
    resolving.join(RESOLVE_TIMEOUT_S)
    if resolving.is_alive():
        found = {"error": "resolving it timed out after %gs" % RESOLVE_TIMEOUT_S}
    return dict(found, hostname=name)


def _find_tool(name):
    found = procs.which(name)
    if found:
        return found
    for directory in SBIN_DIRS:
        path = os.path.join(directory, name)
        if os.access(path, os.X_OK):
            return path
    return None


def firewall_tools():
    """Which firewall tool holds blocking rules here, where this user may read them."""
    result = []
    tool = _find_tool("nft")
    if tool:
        code, out, err = run([tool, "list", "ruleset"], timeout_s=TOOL_TIMEOUT_S)
        if code == 0:
            table, counts = None, {}  # type: Any, Dict[str, int]
            for line in out.splitlines():
                words = line.split()
                if words[:1] == ["table"] and len(words) >= 3:
                    table = "%s %s" % (words[1], words[2])
                    counts.setdefault(table, 0)
                elif table and (" drop" in line or " reject" in line or "policy drop" in line):
                    counts[table] += 1
            blocking = [
                "table %s: %d drop/reject rule(s)" % item for item in counts.items() if item[1]
            ]
            result.append({"tool": "nft", "rules": blocking})
        else:
            result.append({"tool": "nft", "error": last_line(err)})
    tool = _find_tool("iptables")
    if tool:
        code, out, err = run([tool, "-S"], timeout_s=TOOL_TIMEOUT_S)
        if code == 0:
            rules = [
                line
                for line in out.splitlines()
                if ("-j DROP" in line or "-j REJECT" in line or line.startswith("-P INPUT DROP"))
            ]
            result.append({"tool": "iptables", "rules": rules[:20]})
        else:
            result.append({"tool": "iptables", "error": last_line(err)})
    tool = _find_tool("ufw")
    if tool:
        code, out, err = run([tool, "status"], timeout_s=TOOL_TIMEOUT_S)
        active = code == 0 and "Status: active" in out
        result.append({"tool": "ufw", "rules": ["ufw is active"] if active else []})
    tool = _find_tool("firewall-cmd")
    if tool:
        code, out, err = run([tool, "--state"], timeout_s=TOOL_TIMEOUT_S)
        running = code == 0 and out.strip() == "running"
        result.append({"tool": "firewalld", "rules": ["firewalld is running"] if running else []})
    return result


def port_holders(port):
    """The processes (of any user, where readable) listening on TCP `port` here."""
    inodes = set()
    for table in ("/proc/net/tcp", "/proc/net/tcp6"):
        try:
            with open(table) as f:
                next(f, None)
                for line in f:
                    fields = line.split()
                    is_listening = len(fields) > 9 and fields[3] == "0A"
                    if is_listening and int(fields[1].rsplit(":", 1)[1], 16) == port:
                        inodes.add("socket:[%s]" % fields[9])
        except (OSError, ValueError):
            continue
    holders = []  # type: List[Dict[str, Any]]
    if not inodes:
        return holders
    btime = procs.boot_time()
    for pid in procs.pids():
        try:
            fds = os.listdir("/proc/%d/fd" % pid)
        except OSError:
            continue
        for fd in fds:
            try:
                target = os.readlink("/proc/%d/fd/%s" % (pid, fd))
            except OSError:
                continue
            if target in inodes:
                stat = procs.read_stat(pid)
                tags = procs.read_tags(pid)
                holders.append(
                    {
                        "pid": pid,
                        "start": procs.start_time(btime, stat) if stat else None,
                        "cmdline": procs.read_cmdline(pid),
                        "tags": tags,
                    }
                )
                break
    if not holders:
        holders.append({"pid": None, "cmdline": [], "tags": {}, "start": None})
    return holders


def slow_facts(request):
    """The part of a probe that runs helper programs (the interpreter listing its packages,
    nvidia-smi) or waits on the resolver: what takes a probe its time."""
    slow = {}  # type: Dict[str, Any]
    if request.get("interpreter"):
        slow["interpreter"] = interpreter(
            request["interpreter"], request.get("workdir") or os.getcwd()
        )
    if request.get("environment", True):
        slow["gpu"] = gpu_facts()
        slow["hostname"] = hostname_facts()
    return slow


def facts(request):
    """Everything doctor compares across hosts, for one `probe` request."""
    result = {"time": time.time()}  # type: Dict[str, Any]
    slow = slow_facts(request)
    result.update(slow)
    python = slow.get("interpreter") or {}  # type: Dict[str, Any]
    if request.get("workdir"):
        result["files"] = file_facts(
            request["workdir"], request.get("script"), bool(request.get("synced"))
        )
    if request.get("environment", True):
        result["env"] = env_facts()
        executable = python.get("executable") if python.get("interpreter") else None
        result[proto.PROBE_STACKS] = stacks.availability(executable)
    if request.get("port"):
        result[proto.PROBE_PORT_HOLDERS] = port_holders(int(request["port"]))
    if request.get("firewall_tools"):
        result[proto.PROBE_FIREWALL_TOOLS] = firewall_tools()
    result["time"] = time.time()
    return result
