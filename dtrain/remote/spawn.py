"""How the agent starts processes: tasks that die with it, and helper programs bounded in time.

A task starts in a session of its own with a parent-death signal, so it dies with the agent
however the agent dies: through util-linux's `setpriv --pdeathsig KILL` where the host's
setpriv takes that option (2.33 or later; checked once, by running it), else by prctl in the
child before exec. Every process started here is registered until its owner has waited for
it: a subreaper agent reaps only the orphans it adopted, never a process someone here waits
for. Standard library only, Python >= 3.6, Linux.
"""

import os
import signal
import subprocess
import sys
import threading
import time
from typing import Any, Callable, Dict, Iterable, List, Mapping, Optional, Tuple  # noqa: F401 - used in type comments

from . import procs

PR_SET_PDEATHSIG = 1
PR_SET_CHILD_SUBREAPER = 36
SETPRIV_CHECK_S = 5.0  # a setpriv that does not answer its check in this long is not used

_STARTED = {}  # type: Dict[int, subprocess.Popen[bytes]]
_STARTED_LOCK = threading.Lock()
_SETPRIV = []  # type: List[Optional[str]]  # the host's setpriv, once checked
_PRCTL = []  # type: List[Any]  # libc's prctl, loaded once in the agent: a child only calls it


def start_process(
    argv: "List[str]",
    cwd: "str | None" = None,
    env: "Mapping[str, str] | None" = None,
    stdout: "int | None" = None,
    stderr: "int | None" = None,
    session: bool = False,
    preexec_fn: "Callable[[], None] | None" = None,
) -> "subprocess.Popen[bytes]":
    """Start `argv` in `cwd` with stdin from /dev/null and stdout and stderr to the given fds
    (or subprocess.PIPE; None: /dev/null), in a new session if `session`. No fd of the agent's
    but those reaches it, and it starts with the signals Python ignores back at their
    defaults (a task's `| head` ends it). An OSError if it cannot start."""
    with _STARTED_LOCK:  # registered before anyone can see it exit: see reap_adopted
        proc = subprocess.Popen(
            argv,
            cwd=cwd,
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL if stdout is None else stdout,
            stderr=subprocess.DEVNULL if stderr is None else stderr,
            start_new_session=session,
            close_fds=True,
            preexec_fn=preexec_fn,
        )
        _STARTED[proc.pid] = proc
    return proc


def start_task(
    argv: "List[str]", cwd: str, env: "Mapping[str, str]", stdout: int, stderr: int
) -> "subprocess.Popen[bytes]":
    """Start a task's `argv` in a session of its own, dying with the agent."""
    setpriv = host_setpriv()
    if setpriv is not None:
        return start_process(spawn_argv(argv, setpriv), cwd, env, stdout, stderr, session=True)
    prctl()  # loaded here: the child must not import
    return start_process(argv, cwd, env, stdout, stderr, True, _parent_death_signal)


def spawn_argv(argv: "List[str]", setpriv: "str | None") -> "List[str]":
    """What the agent executes for a task's `argv`: through `setpriv` when there is one."""
    if setpriv is None:
        return list(argv)
    return [setpriv, "--pdeathsig", "KILL", "--", *argv]


def host_setpriv() -> "str | None":
    """This host's setpriv if it sets the parent-death signal, else None; checked once."""
    if not _SETPRIV:
        _SETPRIV.append(find_setpriv())
    return _SETPRIV[0]


def find_setpriv(path: "str | None" = None) -> "str | None":
    """The first `setpriv` on `path` (this process's PATH by default), as an absolute path, if
    it takes --pdeathsig (one older than util-linux 2.33 exits 1 on it); else None."""
    found = procs.which("setpriv", path)
    if found is None or not os.path.isabs(found):
        return None  # a relative PATH entry would be resolved in each task's directory
    try:
        check = start_process(spawn_argv([found, "--version"], found))
    except OSError:
        return None
    try:
        return found if check.wait(SETPRIV_CHECK_S) == 0 else None
    except subprocess.TimeoutExpired:
        check.kill()
        check.wait()
        return None


def prctl() -> Any:
    """libc's prctl, or None where there is none to call (not Linux, no ctypes)."""
    if not _PRCTL:
        function = None
        if sys.platform.startswith("linux"):
            try:
                import ctypes

                function = ctypes.CDLL(None).prctl
            except Exception:
                pass
        _PRCTL.append(function)
    return _PRCTL[0]


def become_subreaper() -> bool:
    """Make this process the parent of every orphan its tasks leave (Linux >= 3.4), rather
    than init: a daemon that left its task's group and tag (`setsid env -i cmd &`) stays
    below the agent, which stops it with the job. False where prctl cannot be called."""
    function = prctl()
    if function is None:
        return False
    try:
        return bool(function(PR_SET_CHILD_SUBREAPER, 1, 0, 0, 0) == 0)
    except Exception:
        return False


def _parent_death_signal() -> None:
    """Runs in the task's child before exec: die if the agent dies, whatever kills it."""
    function = _PRCTL[0] if _PRCTL else None
    if function is not None:
        try:
            function(PR_SET_PDEATHSIG, signal.SIGKILL)
        except Exception:
            pass


def reap_adopted(pids: "Iterable[int]") -> None:
    """Reap those of `pids` (zombie children of this process) that no process started here
    is: orphans this process adopted as a subreaper, which nobody else will wait for."""
    with _STARTED_LOCK:
        for pid in [pid for pid, proc in _STARTED.items() if proc.returncode is not None]:
            del _STARTED[pid]  # waited for by its owner: the pid may be anyone's now
        for pid in pids:
            if pid in _STARTED:
                continue
            try:
                os.waitpid(pid, os.WNOHANG)
            except ChildProcessError:
                pass


def is_started_here(pid: int) -> bool:
    """Whether `pid` is a process started here that its owner has not waited for yet."""
    proc = _STARTED.get(pid)
    return proc is not None and proc.returncode is None


def run(
    argv: "List[str]",
    cwd: "str | None" = None,
    env: "Mapping[str, str] | None" = None,
    timeout_s: float = 15.0,
) -> "Tuple[int | None, bytes, bytes]":
    """(exit code, stdout, stderr) of `argv`, run in its own session to its end; (None, what
    it wrote, b"") if it ran past `timeout_s`: its session is killed then. An OSError if it
    cannot start."""
    proc = start_process(argv, cwd, env, subprocess.PIPE, subprocess.PIPE, session=True)
    try:
        out, err = proc.communicate(timeout=timeout_s)
        return proc.returncode, out, err
    except subprocess.TimeoutExpired:
        pass
    try:
        os.killpg(proc.pid, signal.SIGKILL)  # it, and whatever it started
    except OSError:
        pass
    try:
        out, _ = proc.communicate(timeout=1.0)
    except subprocess.TimeoutExpired:  # something it started left the session, pipe open
        out = b""
    for stream in (proc.stdout, proc.stderr):
        if stream is not None:
            stream.close()
    proc.wait()
    return None, out, b""


def for_each(
    items: "Iterable[Any]", function: "Callable[[Any], object]", threads: int, within_s: float
) -> None:
    """`function(item)` for every item, on up to `threads` threads at once; returns once all
    are done or after `within_s` seconds (a straggler then goes on in the background)."""
    todo = list(items)

    def work() -> None:
        while True:
            try:
                item = todo.pop()  # atomic: each item goes to one thread
            except IndexError:
                return
            function(item)

    workers = [threading.Thread(target=work, daemon=True) for _ in range(min(threads, len(todo)))]
    for worker in workers:
        worker.start()
    deadline = time.monotonic() + within_s
    for worker in workers:
        worker.join(max(0.0, deadline - time.monotonic()))
