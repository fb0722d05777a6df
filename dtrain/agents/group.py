"""The open agents of a set of hosts: one owner that opens them in parallel and closes them all."""

from __future__ import annotations

import queue
import threading
from collections.abc import Sequence
from typing import TYPE_CHECKING

from dtrain.agents.session import (
    AgentSession,
    Event,
    Interrupt,
    OutputBudget,
    in_parallel,
)
from dtrain.errors import ConnectError, Problem, RemoteError
from dtrain.plan.hosts import Host
from dtrain.transport.local import LocalLink
from dtrain.transport.machine import (
    raise_open_file_limit,
)
from dtrain.transport.options import SshOptions

if TYPE_CHECKING:
    from dtrain.transport.ssh import SshTransport


AGENT_PROBLEM = "agent"


CLOSE_TIMEOUT_S = 5.0


class Hosts:
    """Open agent sessions to a set of hosts, and close them all, whatever happens."""

    def __init__(self, options: SshOptions, remote_python: str = "auto") -> None:
        raise_open_file_limit()
        self.ssh_options = options
        self._ssh: SshTransport | None = None
        self.remote_python = remote_python
        self.events: queue.SimpleQueue[Event | Interrupt] = queue.SimpleQueue()
        self.budget = OutputBudget()
        self.sessions: dict[str, AgentSession] = {}  # by Host.key: name and port
        self._lock = threading.Lock()

    @property
    def ssh(self) -> SshTransport:
        """Created on first use: paramiko costs 0.1 s to import, and local jobs never need it."""
        if self._ssh is None:
            from dtrain.transport.ssh import SshTransport

            self._ssh = SshTransport(self.ssh_options)
        return self._ssh

    def open(self, hosts: Sequence[Host]) -> dict[str, AgentSession]:
        """Connect every host and start an agent on each; any failure names each host, and
        nothing will have been started anywhere."""
        sessions, problems = self.open_reachable(hosts)
        if problems:
            unreached = [p for p in problems.values() if p.code != AGENT_PROBLEM]
            if unreached:
                remote = sum(1 for h in hosts if not h.is_local)
                raise ConnectError(
                    f"cannot reach {len(unreached)} of {remote} "
                    f"host{'s' if remote > 1 else ''}; nothing was started",
                    problems=unreached,
                )
            raise RemoteError(
                "could not start on every host; nothing was started",
                problems=list(problems.values()),
            )
        return sessions

    def open_reachable(
        self, hosts: Sequence[Host]
    ) -> tuple[dict[str, AgentSession], dict[str, Problem]]:
        """Like `open`, but a host that cannot be reached is a problem, not an error.

        For commands that must act on every host they can (`dtrain kill`, `ps`, doctor).
        """
        remote = [host for host in hosts if not host.is_local]
        local = [host for host in hosts if host.is_local]
        problems: dict[str, Problem] = {}
        lock = threading.Lock()

        def start_local(host: Host) -> None:
            problem = self._start_agent(host)
            if problem is not None:
                with lock:
                    problems[host.key] = problem

        starting_here = threading.Thread(target=in_parallel, args=(local, start_local))
        starting_here.start()
        if remote:
            found = self.ssh.try_connect_all(remote, then=self._start_agent)
            with lock:
                problems.update(found)
        starting_here.join()
        sessions = {h.key: self.sessions[h.key] for h in hosts if h.key in self.sessions}
        return sessions, problems

    def _start_agent(self, host: Host) -> Problem | None:
        """Start the agent on one (connected) host; its problem if that fails."""
        try:
            link = (
                LocalLink()
                if host.is_local
                else self.ssh.open_link(host, python=self.remote_python)
            )
            session = AgentSession(host, link, self.events, self.budget)
        except Exception as exc:  # any failure names its host
            return Problem(
                f"cannot start dtrain's agent: {exc}", host=host.display, code=AGENT_PROBLEM
            )
        with self._lock:
            self.sessions[host.key] = session
        return None

    def close(self) -> None:
        """Close every session in parallel; an unresponsive host cannot hold dtrain up."""
        in_parallel(self.sessions.values(), AgentSession.close, CLOSE_TIMEOUT_S)
        if self._ssh is not None:
            self._ssh.close()
        self.sessions.clear()
