"""The local transport: dtrain's agent as a child process of this machine, over pipes."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import threading
from collections.abc import Mapping

from dtrain.containers import ContainerSpec, host_script
from dtrain.errors import RemoteError
from dtrain.transport.bootstrap import agent_argv, agent_payload, boot_code
from dtrain.transport.machine import TASKS_ELSEWHERE_HINT, tasks_here_refused


class LocalLink:
    """A local agent process in its own session, so the terminal's Ctrl-C reaches only dtrain."""

    def __init__(
        self, env: Mapping[str, str] | None = None, container: ContainerSpec | None = None
    ) -> None:
        refused = tasks_here_refused()
        if refused is not None:
            raise RemoteError(refused, hint=TASKS_ELSEWHERE_HINT)
        argv = [sys.executable, "-c", boot_code()]
        if container is not None:  # the agent inside it, under the container's own python
            argv = ["sh", "-c", host_script(container, agent_argv())]
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=dict(env) if env is not None else None,
        )
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        self._stdin_fd = self.proc.stdin.fileno()
        self._stdout_fd = self.proc.stdout.fileno()
        self._stderr = bytearray()
        self._stderr_thread = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_thread.start()
        # It may end before reading it (a crash): at end of stream, its stderr says why.
        with contextlib.suppress(BrokenPipeError):
            self.send(agent_payload())

    def _read_stderr(self) -> None:
        assert self.proc.stderr
        fd = self.proc.stderr.fileno()
        while chunk := os.read(fd, 65536):
            self._stderr += chunk[: max(0, 65536 - len(self._stderr))]

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._stdin_fd, view)
            view = view[written:]

    def recv(self, size: int) -> bytes:
        return os.read(self._stdout_fd, size)

    def stderr_text(self) -> str:
        if self.proc.poll() is not None:  # it ended: all of what it said
            self._stderr_thread.join(timeout=1.0)
        return self._stderr.decode("utf-8", "replace")

    def close_input(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def close(self) -> None:
        """Wait briefly for the agent to finish its cleanup; never leave it behind."""
        self.close_input()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()
