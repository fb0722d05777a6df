"""A ProxyCommand as the socket a connection runs over: a local process on pipes.

It runs as OpenSSH runs it (`sh -c 'exec CMD'`, tokens already expanded), in its own session
so the terminal's Ctrl-C reaches only dtrain, and with the parent-death signal set, so it dies
with the connection, when dtrain exits, and when dtrain is SIGKILLed. paramiko's own
ProxyCommand spins on EOF and leaves the process to its fate; this one does neither.
"""

from __future__ import annotations

import contextlib
import os
import select
import signal
import subprocess
import threading
from concurrent.futures import ThreadPoolExecutor

PR_SET_PDEATHSIG = 1
STDERR_TAIL = 4096
# The parent-death signal fires when the *thread* that forked exits: every ProxyCommand is
# started from this one thread, which lives as long as dtrain does.
_SPAWNER = ThreadPoolExecutor(max_workers=1, thread_name_prefix="dtrain-proxy-spawner")


def _spawn(command: str) -> subprocess.Popen[bytes]:
    # ctypes only where a ProxyCommand starts (~4 ms of every launch's start otherwise), and
    # loaded here: a child between fork and exec must not import.
    import ctypes

    libc = ctypes.CDLL(None)

    def die_with_parent() -> None:
        """In the child before exec: SIGKILL when dtrain (the spawning thread) goes away."""
        with contextlib.suppress(Exception):
            libc.prctl(PR_SET_PDEATHSIG, signal.SIGKILL)

    return subprocess.Popen(
        ["/bin/sh", "-c", f"exec {command}"],
        stdin=subprocess.PIPE,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        bufsize=0,
        start_new_session=True,
        close_fds=True,
        preexec_fn=die_with_parent,
    )


class ProxySocket:
    """The socket-like object paramiko's Transport reads and writes (send, recv, timeouts)."""

    def __init__(self, command: str) -> None:
        self.command = command
        self.process = _SPAWNER.submit(_spawn, command).result()
        assert self.process.stdin and self.process.stdout and self.process.stderr
        self._in = self.process.stdin.fileno()
        self._out = self.process.stdout.fileno()
        self._timeout: float | None = None
        self._stderr = bytearray()
        self.closed = False
        self._ended_itself: bool | None = None  # None: not ended yet (as far as `end` knows)
        self._close_lock = threading.Lock()
        self._end_lock = threading.Lock()
        self._stderr_reader = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_reader.start()

    @property
    def _closed(self) -> bool:  # paramiko's Transport.stop_thread reads it, as on a socket
        return self.closed

    @property
    def pid(self) -> int:
        return self.process.pid

    def _read_stderr(self) -> None:
        assert self.process.stderr
        fd = self.process.stderr.fileno()
        with contextlib.suppress(OSError):
            while chunk := os.read(fd, 65536):
                self._stderr = (self._stderr + chunk)[-STDERR_TAIL:]

    def stderr_text(self) -> str:
        """What the command wrote to stderr (its last 4 KiB); once it is closed, all of it
        (a child that still holds the pipe open is waited for a second at most)."""
        if self.closed:
            self._stderr_reader.join(1.0)
        return self._stderr.decode("utf-8", "replace").strip()

    def own_exit_status(self) -> int | None:
        """The command's exit status if it ended by itself, else None (running, or ended by
        `end`)."""
        if self._ended_itself is None:
            return self.process.poll()
        return self.process.returncode if self._ended_itself else None

    def settimeout(self, timeout: float | None) -> None:
        self._timeout = timeout

    def gettimeout(self) -> float | None:
        return self._timeout

    def send(self, data: bytes | memoryview) -> int:
        try:
            return os.write(self._in, data)
        except OSError as exc:
            raise OSError(exc.errno, f"ProxyCommand ended: {self.stderr_text() or exc}") from None

    def sendall(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            view = view[self.send(view) :]

    def recv(self, size: int) -> bytes:
        """Up to `size` bytes; b"" at the command's end; socket.timeout as a socket would."""
        ready, _, _ = select.select([self._out], [], [], self._timeout)
        if not ready:
            raise TimeoutError()
        return os.read(self._out, size)

    def close(self) -> None:
        """Close the pipes, then `end` the command."""
        with self._close_lock:  # paramiko's thread and the connecting one both close it
            if self.closed:
                return
            self.closed = True
        for stream in (self.process.stdin, self.process.stdout):
            with contextlib.suppress(OSError):
                if stream:
                    stream.close()
        self.end()

    def end(self) -> None:
        """End the command and what it started in its session (SIGTERM, then SIGKILL after
        a second), and reap it. The pipes stay open: a thread reading them sees their end
        (this is how a connection under way is stopped; its own thread closes them)."""
        with self._end_lock:
            if self.process.poll() is not None:
                if self._ended_itself is None:
                    self._ended_itself = True
                return
            self._signal_group(signal.SIGTERM)
            try:
                self.process.wait(timeout=1.0)
            except subprocess.TimeoutExpired:
                self._signal_group(signal.SIGKILL)
                self.process.wait()
            # it may have been on its way out already: an exit of its own is its own
            self._ended_itself = self.process.returncode not in (-signal.SIGTERM, -signal.SIGKILL)

    def _signal_group(self, signum: int) -> None:
        """Signal the command's session (its own process group); called while it is not yet
        reaped, so the group id is still this command's."""
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(self.process.pid, signum)
