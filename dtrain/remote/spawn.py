"""Starting processes and threads in the agent without subprocess or threading.

Every host starts an agent for every dtrain command. subprocess imports `re`, `locale`,
`signal` (with `enum`), `threading`, `selectors` and `contextlib`; threading imports
`functools` and `collections`: together they were most of the CPU an agent took to answer its
first request. Here processes start by posix_spawn (vfork and exec: no Python runs in the
child) and threads by `_thread`; subprocess is imported only where a process needs Python code
run in its child before exec, or on a Python without posix_spawn (3.6, 3.7). Standard library
only, Python >= 3.6, Linux.
"""

import _signal as signal  # type: ignore[import-not-found]  # no stub: signal's C half
import _thread
import os
import select
import time

# For the type checker only: importing typing would cost every agent's start ~3 ms.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Any, Callable, Dict, Iterable, List, Mapping, Tuple  # noqa: F401

POSIX_SPAWN = hasattr(os, "posix_spawn")  # Python >= 3.8
# What subprocess's restore_signals gives a child: Python ignores these, and an ignored
# signal stays ignored across exec (a task's `| head` would never end it).
DEFAULT_SIGNALS = (signal.SIGPIPE, signal.SIGXFSZ)
_INHERITED_FDS_CLOSED = []  # type: List[bool]
_CWD_LOCK = _thread.allocate_lock()  # a start that enters its cwd has the process's to itself
# Every process started here, by pid, until its owner has waited for it: a subreaper agent
# reaps only the other children it has (orphans it adopted), never one someone here waits for.
_STARTED = {}  # type: Dict[int, Any]
_STARTED_LOCK = _thread.allocate_lock()


def start_process(
    argv: "List[str]",
    cwd: "str | None" = None,
    env: "Mapping[str, str] | None" = None,
    stdout: "int | None" = None,
    stderr: "int | None" = None,
    session: bool = False,
    fork_hook: "Callable[[], None] | None" = None,
) -> "Any":
    """Start `argv` with stdin from /dev/null and stdout and stderr to the
    given fds (None: /dev/null), in a new session if `session`: a `Child` or a
    subprocess.Popen, both with pid, poll(), wait() and kill(). An OSError if it cannot.

    By posix_spawn unless `fork_hook` must run in the child before exec or this Python has
    none; then by subprocess, imported then. posix_spawn takes no working directory: the
    agent enters `cwd` around the call (one such start at a time), and has no close_fds: the
    fds the agent was started with are made close-on-exec first (Python opens its own that
    way)."""
    with _STARTED_LOCK:  # registered before anyone can see it exit: see reap_adopted
        proc = None  # type: Any
        if fork_hook is None and POSIX_SPAWN:
            try:
                proc = _posix_spawn(argv, cwd, env, stdout, stderr, session)
            except NotImplementedError:  # a C library without POSIX_SPAWN_SETSID (glibc < 2.26)
                pass
        if proc is None:
            import subprocess

            proc = subprocess.Popen(
                argv,
                cwd=cwd,
                env=env,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL if stdout is None else stdout,
                stderr=subprocess.DEVNULL if stderr is None else stderr,
                start_new_session=session,
                close_fds=True,
                preexec_fn=fork_hook,
            )
        _STARTED[proc.pid] = proc
    return proc


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


def _close_inherited_fds() -> None:
    """Make every fd above 2 close-on-exec, once: those the agent was started with (a
    --setup command's, a shell's) would otherwise reach every process it starts."""
    if _INHERITED_FDS_CLOSED:
        return
    for name in os.listdir("/proc/self/fd"):
        if int(name) > 2:
            try:
                os.set_inheritable(int(name), False)
            except OSError:
                pass  # the listing's own fd, closed by now
    _INHERITED_FDS_CLOSED.append(True)


def _posix_spawn(
    argv: "List[str]",
    cwd: "str | None",
    env: "Mapping[str, str] | None",
    stdout: "int | None",
    stderr: "int | None",
    session: bool,
) -> "Child":
    _close_inherited_fds()
    actions = [(os.POSIX_SPAWN_OPEN, 0, os.devnull, os.O_RDONLY, 0)]  # type: List[Any]
    for target, fd in ((1, stdout), (2, stderr)):
        if fd is None:
            actions.append((os.POSIX_SPAWN_OPEN, target, os.devnull, os.O_WRONLY, 0))
        else:
            actions.append((os.POSIX_SPAWN_DUP2, fd, target))
    spawner = os.posix_spawn if "/" in argv[0] else os.posix_spawnp  # this PATH
    environ = os.environ if env is None else env

    def start() -> "Child":
        pid = spawner(
            argv[0], argv, environ, file_actions=actions, setsid=session,
            setsigdef=DEFAULT_SIGNALS,
        )  # fmt: skip
        return Child(pid)

    if cwd is None:
        return start()
    with _CWD_LOCK:
        back = os.open(".", getattr(os, "O_PATH", os.O_RDONLY) | os.O_DIRECTORY)
        try:
            os.chdir(cwd)
            return start()
        finally:
            os.fchdir(back)
            os.close(back)


class Child:
    """A process posix_spawn started: what the agent uses of a subprocess.Popen."""

    def __init__(self, pid: int) -> None:
        self.pid = pid
        self.returncode = None  # type: int | None

    def _set(self, status: int) -> int:
        if os.WIFSIGNALED(status):
            self.returncode = -os.WTERMSIG(status)
        else:
            self.returncode = os.WEXITSTATUS(status)
        return self.returncode

    def poll(self) -> "int | None":
        if self.returncode is None:
            try:
                pid, status = os.waitpid(self.pid, os.WNOHANG)
            except ChildProcessError:  # reaped already: Popen says 0 then too
                pid, status = self.pid, 0
            if pid == self.pid:
                self._set(status)
        return self.returncode

    def wait(self) -> int:
        if self.returncode is not None:
            return self.returncode
        try:
            _, status = os.waitpid(self.pid, 0)
        except ChildProcessError:
            status = 0
        return self._set(status)

    def kill(self) -> None:
        if self.returncode is None:
            try:
                os.kill(self.pid, signal.SIGKILL)
            except ProcessLookupError:
                pass


def wait_for(proc: "Any", timeout_s: float) -> "int | None":
    """`proc`'s exit code once it exits, or None if it still runs after `timeout_s`."""
    deadline = time.monotonic() + timeout_s
    pause = 0.0005
    while True:
        code = proc.poll()  # type: int | None
        if code is not None or time.monotonic() >= deadline:
            return code
        time.sleep(pause)
        pause = min(pause * 2, 0.05)


def run(
    argv: "List[str]",
    cwd: "str | None" = None,
    env: "Mapping[str, str] | None" = None,
    timeout_s: float = 15.0,
) -> "Tuple[int | None, bytes, bytes]":
    """(exit code, stdout, stderr) of `argv`, run in its own session to its
    end; (None, what it wrote, b"") if it ran past `timeout_s`: its session is killed then.
    An OSError if it cannot start."""
    out_r, out_w = os.pipe()
    err_r, err_w = os.pipe()
    try:
        proc = start_process(argv, cwd, env, out_w, err_w, session=True)
    except OSError:
        os.close(out_r)
        os.close(err_r)
        raise
    finally:
        os.close(out_w)
        os.close(err_w)
    deadline = time.monotonic() + timeout_s
    chunks = {out_r: [], err_r: []}  # type: Dict[int, List[bytes]]
    poller = select.poll()
    for fd in chunks:
        poller.register(fd, select.POLLIN)
    reading = len(chunks)
    try:
        while reading:
            left = deadline - time.monotonic()
            if left <= 0:
                break
            for fd, _ in poller.poll(int(left * 1000) + 1):
                data = os.read(fd, 1 << 16)
                if data:
                    chunks[fd].append(data)
                else:
                    poller.unregister(fd)
                    reading -= 1
    finally:
        os.close(out_r)
        os.close(err_r)
    code = wait_for(proc, max(0.0, deadline - time.monotonic())) if not reading else None
    if code is None:  # past its time: it, and whatever it started, go
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except OSError:
            pass
        proc.wait()
        return None, b"".join(chunks[out_r]), b""
    return code, b"".join(chunks[out_r]), b"".join(chunks[err_r])


def in_thread(function: "Callable[..., object]", *args: object) -> "Any":
    """Run `function(*args)` in a new thread; a lock released when it returns (acquire it,
    with a timeout, to join)."""
    done = _thread.allocate_lock()
    done.acquire()

    def body() -> None:
        try:
            function(*args)
        finally:
            done.release()

    _thread.start_new_thread(body, ())
    return done


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

    deadline = time.monotonic() + within_s
    for done in [in_thread(work) for _ in range(min(threads, len(todo)))]:
        done.acquire(True, max(0.0, deadline - time.monotonic()))
