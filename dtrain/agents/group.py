"""The open agents of a set of hosts, and one request to all of them.

`AgentGroup` opens the sessions in parallel (all-or-nothing with `open`, as many as it can with
`open_reachable`), owns them, and closes them all. `request_each` sends one request to many
sessions at once and returns `Replies`: each host's reply or error, by host key, which knows
what failed and can raise for callers that need every host.
"""

from __future__ import annotations

import logging
import os
import queue
import threading
import time
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, Any

from dtrain.agents.session import (
    AgentSession,
    Event,
    Heartbeat,
    Interrupt,
    OutputBudget,
    in_parallel,
)
from dtrain.agents.setup import PING_S, SetupOutput, run_setup
from dtrain.errors import ConnectError, Problem, RemoteError
from dtrain.plan.hosts import Host
from dtrain.transport.link import Link
from dtrain.transport.local import LocalLink
from dtrain.transport.machine import raise_open_file_limit
from dtrain.transport.options import SshOptions

if TYPE_CHECKING:
    from dtrain.transport.engine import Engine, EngineOptions
    from dtrain.transport.ssh import SshTransport

logger = logging.getLogger(__name__)

AGENT_PROBLEM = "agent"
SETUP_PROBLEM = "setup"
CLOSE_TIMEOUT_S = 5.0
NOTHING_STARTED = "nothing was started"

Reply = dict[str, Any] | RemoteError
FieldsFor = Callable[[AgentSession], dict[str, Any] | None]


class Replies(Mapping[str, Reply]):
    """Each asked host's reply, or the `RemoteError` it gave, by host key; with when each
    request was sent and answered (wall clock), for callers that compare clocks."""

    def __init__(
        self,
        replies: Mapping[str, Reply],
        times: Mapping[str, tuple[float, float]],
        shown: Mapping[str, str] | None = None,
    ) -> None:
        self._replies = dict(replies)
        self.times = dict(times)
        self.shown = dict(shown or {})  # host key -> the name people see (Host.display)

    def __getitem__(self, key: str) -> Reply:
        return self._replies[key]

    def __iter__(self) -> Iterator[str]:
        return iter(self._replies)

    def __len__(self) -> int:
        return len(self._replies)

    @property
    def succeeded(self) -> dict[str, dict[str, Any]]:
        return {key: r for key, r in self._replies.items() if isinstance(r, dict)}

    @property
    def failed(self) -> dict[str, RemoteError]:
        return {key: r for key, r in self._replies.items() if isinstance(r, RemoteError)}

    def raise_if_failed(
        self, what: str, outcome: str = NOTHING_STARTED
    ) -> dict[str, dict[str, Any]]:
        """The replies, if every host answered; else one `RemoteError` naming each host."""
        problems = [
            Problem(error.what, host=self.shown.get(key, key), hint=error.hint)
            for key, error in sorted(self.failed.items())
        ]
        if problems:
            raise RemoteError(
                f"{what} failed on {len(problems)} host(s); {outcome}", problems=problems
            )
        return self.succeeded


def request_each(
    sessions: Mapping[str, AgentSession],
    op: str,
    timeout_s: float,
    fields_for: FieldsFor | None = None,
    **fields: Any,
) -> Replies:
    """One request to every session at once, keyed as `sessions` is.

    `fields_for` adds per-host fields to the common ones; a session it gives None is not asked.
    Every request is sent before any reply is awaited, all from this thread: a thread per host
    per round cost ~3 ms of a round's 4 at 8 hosts (measured on local agents).
    """
    replies: dict[str, Reply] = {}
    times: dict[str, tuple[float, float]] = {}
    started = time.monotonic()
    waiting: list[tuple[str, AgentSession, float]] = []
    for key, session in sessions.items():
        extra = fields_for(session) if fields_for is not None else {}
        if extra is None:
            continue
        sent = time.time()
        try:
            session.send_request(op, **dict(fields, **extra))
        except RemoteError as exc:
            replies[key], times[key] = exc, (sent, time.time())
            continue
        waiting.append((key, session, sent))
    deadline = time.monotonic() + timeout_s
    for key, session, sent in waiting:
        try:
            reply: Reply
            reply, answered = session.reply_to(op, timeout_s, max(0.0, deadline - time.monotonic()))
        except RemoteError as exc:
            reply, answered = exc, time.time()
        replies[key], times[key] = reply, (sent, answered)
    logger.debug("%s on %d host(s): %.3fs", op, len(replies), time.monotonic() - started)
    in_order = {key: replies[key] for key in sessions if key in replies}
    return Replies(in_order, times, {key: s.host.display for key, s in sessions.items()})


class AgentGroup:
    """Agent sessions to a set of hosts, by host key: opened in parallel, closed together,
    whatever happens.

    This machine's agent is a child process; remote hosts' come over ssh, or, given `engine`
    (chosen by `where.where_to_run`), from that engine (`dtrain.transport.engine`): Slurm's
    step, mpirun, a scheduler's own task starter.
    """

    def __init__(
        self,
        options: SshOptions,
        remote_python: str = "auto",
        engine: EngineOptions | None = None,
        job_id: str | None = None,
        setup_output: SetupOutput | None = None,
    ) -> None:
        raise_open_file_limit()
        self.ssh_options = options
        # what the setup's processes are tagged with: the job's id, or one of this command's
        self.job_id = job_id or f"setup-{os.getpid()}-{os.urandom(2).hex()}"
        self.setup_output = setup_output
        self._ssh: SshTransport | None = None
        self.remote_python = remote_python
        self.engine_options = engine
        self.engine: Engine | None = None  # made on first use
        self.events: queue.SimpleQueue[Event | Interrupt] = queue.SimpleQueue()
        self.budget = OutputBudget()
        self.sessions: dict[str, AgentSession] = {}  # by Host.key: name and port
        self._lock = threading.Lock()

    def __enter__(self) -> AgentGroup:
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

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
            unreached = [
                p for p in problems.values() if p.code not in (AGENT_PROBLEM, SETUP_PROBLEM)
            ]
            if unreached:
                remote = sum(1 for h in hosts if not h.is_local)
                raise ConnectError(
                    f"cannot reach {len(unreached)} of {remote} "
                    f"host{'s' if remote > 1 else ''}; {NOTHING_STARTED}",
                    problems=unreached,
                )
            raise RemoteError(
                f"could not start on every host; {NOTHING_STARTED}",
                problems=list(problems.values()),
            )
        return sessions

    def open_reachable(
        self, hosts: Sequence[Host]
    ) -> tuple[dict[str, AgentSession], dict[str, Problem]]:
        """Like `open`, but a host that cannot be reached is a problem, not an error.

        For commands that must act on every host they can (`dtrain kill`, `ps`, doctor).
        """
        if self.engine_options is not None:
            return self._open_through_engine(hosts)
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
        if self.ssh_options.setup:
            problems.update(self._setup_all(sessions))
        return sessions, problems

    def silence_limit_s(self, host: Host) -> float | None:
        """How long `host` may be silent before it counts as lost, when its ssh config says
        (ServerAliveInterval * ServerAliveCountMax, as OpenSSH would give up); None otherwise:
        this machine, and hosts reached through another engine."""
        if host.is_local or self.engine_options is not None or self._ssh is None:
            return None
        return self._ssh.target(host).silence_limit_s

    def _start_agent(self, host: Host) -> Problem | None:
        """Start the agent on one (connected) host; its problem if that fails."""
        try:
            link: Link = (
                LocalLink(container=self.ssh_options.container)
                if host.is_local
                else self.ssh.open_link(host, python=self.remote_python)
            )
        except RemoteError as exc:  # the engine said what went wrong, and what to do
            return Problem(
                f"cannot start dtrain's agent: {exc.what}",
                host=host.display,
                hint=exc.hint,
                code=AGENT_PROBLEM,
            )
        except Exception as exc:  # any failure names its host
            return Problem(
                f"cannot start dtrain's agent: {exc}", host=host.display, code=AGENT_PROBLEM
            )
        self._adopt(host, link)
        return None

    def _setup_all(self, sessions: dict[str, AgentSession]) -> dict[str, Problem]:
        """Run --setup on every host at once; a host whose setup fails is closed (which stops
        whatever its setup left there) and dropped from `sessions`, its problem naming it.

        Not in the pool that connects: Ctrl-C must not wait for a setup to end (this thread
        stops waiting, and closing the sessions stops the setups)."""
        options = self.ssh_options
        problems: dict[str, Problem] = {}

        def one(session: AgentSession) -> None:
            try:
                run_setup(
                    session, options.setup, self.job_id, options.setup_timeout_s, self.setup_output
                )
            except RemoteError as exc:
                host = session.host
                problems[host.key] = Problem(
                    exc.what, host=host.display, hint=exc.hint, code=SETUP_PROBLEM
                )

        started = time.monotonic()
        with Heartbeat(sessions.values(), PING_S):  # a host done early must not lose us
            in_parallel(sessions.values(), one)
        logger.debug("setup on %d host(s): %.3fs", len(sessions), time.monotonic() - started)
        for key in problems:
            with self._lock:
                self.sessions.pop(key, None)
            sessions.pop(key).close()
        return problems

    def _adopt(self, host: Host, link: Link) -> AgentSession:
        session = AgentSession(host, link, self.events, self.budget)
        with self._lock:
            self.sessions[host.key] = session
        return session

    def _engine(self) -> Engine:
        from dtrain.transport.bootstrap import AGENT_PYTHONS

        assert self.engine_options is not None
        if self.engine is None:
            auto = self.remote_python == "auto"
            pythons = AGENT_PYTHONS if auto else (self.remote_python,)
            self.engine = self.engine_options.make_engine(pythons, self.ssh_options)
        return self.engine

    def allocate(self, count: int) -> tuple[Host, ...]:
        """Make an allocation of `count` nodes with an agent on each (the engine's own way);
        its nodes, in the scheduler's order, become the hosts `open` then takes."""
        return self._engine().allocate(count)

    def _open_through_engine(
        self, hosts: Sequence[Host]
    ) -> tuple[dict[str, AgentSession], dict[str, Problem]]:
        """Every remote host's agent from the engine; this machine's stays a child process
        (doctor's view from here)."""
        local = [host for host in hosts if host.is_local]
        remote = [host for host in hosts if not host.is_local]
        problems = {h.key: p for h in local if (p := self._start_agent(h)) is not None}
        if remote or self.engine is not None:
            links, found = self._engine().open_links(remote)
            problems |= found
            for host in remote:
                if host.key in links:
                    self._adopt(host, links[host.key])
        everyone = [*local, *remote]
        sessions = {h.key: self.sessions[h.key] for h in everyone if h.key in self.sessions}
        if self.ssh_options.setup:
            problems.update(self._setup_all(sessions))
        return sessions, problems

    def close(self) -> None:
        """Close every session in parallel; an unresponsive host cannot hold dtrain up."""
        with self._lock:  # a connection stopped by Ctrl-C may still be adopting its agent
            sessions = list(self.sessions.values())
        in_parallel(sessions, AgentSession.close, CLOSE_TIMEOUT_S)
        if self._ssh is not None:
            self._ssh.close()
        if self.engine is not None:
            self.engine.close()
        self.sessions.clear()
