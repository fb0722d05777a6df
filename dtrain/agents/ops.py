"""The agent protocol's requests as typed calls: one function per op.

Each takes the sessions to ask (by host key) or one session, and the op's own arguments; the
op names and fields come from `dtrain.remote.proto`, so nothing outside proto, this module and
the agent spells them. Fan-out ops return `Replies` (raise with `.raise_if_failed` for
all-or-nothing steps).
"""

from __future__ import annotations

from collections.abc import Callable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from dtrain.agents.group import Replies, request_each
from dtrain.agents.session import AgentSession
from dtrain.plan.spec import TaskSpec
from dtrain.remote import proto

Sessions = Mapping[str, AgentSession]


@dataclass(frozen=True, slots=True)
class HelloFacts:
    """What a hello reply tells the launcher about a host."""

    ssh_server_address: str | None = None
    interfaces: Mapping[str, str] = field(default_factory=dict)
    free_ports: tuple[int, ...] = ()

    @classmethod
    def from_reply(cls, reply: Mapping[str, Any]) -> HelloFacts:
        return cls(
            ssh_server_address=reply.get(proto.HELLO_SSH_SERVER_ADDRESS),
            interfaces=reply.get(proto.HELLO_INTERFACES, {}),
            free_ports=tuple(reply.get(proto.HELLO_FREE_PORTS, ())),
        )


def hello(
    sessions: Sessions,
    timeout_s: float,
    *,
    ports_for: Callable[[AgentSession], int] | None = None,
    heartbeat_s: float | None = None,
    lease_s: float | None = None,
    leases: Mapping[str, float] | None = None,
    grace_s: float | None = None,
) -> Replies:
    """The agents' settings (those given; the others keep the agent's defaults) in, each
    host's facts (`HelloFacts.from_reply`) and `ports_for(session)` free ports out.
    `leases` (by host key) gives a host its own lease instead of `lease_s`."""
    settings = {"heartbeat_s": heartbeat_s, "lease_s": lease_s, "grace_s": grace_s}
    given = {name: value for name, value in settings.items() if value is not None}

    def per_host(session: AgentSession) -> dict[str, Any]:
        extra: dict[str, Any] = {}
        if ports_for is not None:
            extra["ports"] = ports_for(session)
        if leases is not None and session.host.key in leases:
            extra["lease_s"] = leases[session.host.key]
        return extra

    return request_each(sessions, proto.OP_HELLO, timeout_s, per_host, **given)


def task_fields(
    task_id: int, task: TaskSpec, script: tuple[str, bool] | None = None
) -> dict[str, Any]:
    """A task as the stage request carries it; `task_id` tags its frames, and `script` (the
    file its command runs, and whether its program may find it on PATH too) is checked to
    exist before anything starts."""
    return {
        proto.TASK_ID: task_id,
        proto.TASK_NAME: task.name,
        proto.TASK_ARGV: list(task.argv),
        proto.TASK_ENV: dict(task.env),
        proto.TASK_CWD: task.workdir,
        proto.TASK_SCRIPT: script[0] if script else None,
        proto.TASK_SCRIPT_ON_PATH: bool(script and script[1]),
    }


def stage(
    sessions: Sessions,
    job_id: str,
    tasks: Mapping[int, TaskSpec],
    timeout_s: float,
    *,
    grace_s: float,
    traceback_timeout_s: float,
    script_of: Callable[[Sequence[str]], tuple[str, bool] | None] = lambda argv: None,
) -> Replies:
    """Hand each host its tasks (by id) to check and keep; nothing starts."""
    by_host: dict[str, list[dict[str, Any]]] = {}
    for task_id, task in tasks.items():
        fields = task_fields(task_id, task, script_of(task.argv))
        by_host.setdefault(task.host.key, []).append(fields)
    return request_each(
        sessions,
        proto.OP_STAGE,
        timeout_s,
        lambda s: {proto.STAGE_TASKS: by_host.get(s.host.key, [])},
        job_id=job_id,
        grace_s=grace_s,
        traceback_timeout_s=traceback_timeout_s,
    )


def start(sessions: Sessions, timeout_s: float) -> Replies:
    """Start every staged task."""
    return request_each(sessions, proto.OP_START, timeout_s)


def scan(
    sessions: Sessions,
    timeout_s: float,
    *,
    job: str | None,
    include_dmlc: bool,
    cpu_window_s: float = 0.0,
) -> Replies:
    """The job processes on each host (`job` None: every job's); with `cpu_window_s`, each
    one's CPU % over that many seconds."""
    window = {proto.SCAN_CPU_WINDOW_S: cpu_window_s} if cpu_window_s else {}
    return request_each(
        sessions, proto.OP_SCAN, timeout_s, None, job=job, include_dmlc=include_dmlc, **window
    )


def kill(
    sessions: Sessions,
    timeout_s: float,
    *,
    job: str | None,
    include_dmlc: bool,
    grace_s: float,
    dry_run: bool,
) -> Replies:
    """Stop the job processes on each host: TERM, KILL after `grace_s`, verify."""
    return request_each(
        sessions,
        proto.OP_KILL,
        timeout_s,
        job=job,
        include_dmlc=include_dmlc,
        grace_s=grace_s,
        dry_run=dry_run,
    )


def probe(
    sessions: Sessions,
    timeout_s: float,
    fields_for: Callable[[AgentSession], dict[str, Any] | None],
) -> Replies:
    """The facts doctor compares, with each host's probe options (None: not asked)."""
    return request_each(sessions, proto.OP_PROBE, timeout_s, fields_for)


def listen(
    sessions: Sessions,
    timeout_s: float,
    endpoint_for: Callable[[AgentSession], tuple[str, int] | None],
) -> Replies:
    """A TCP listener at each host's (address, port) (port 0: any; None: not asked)."""

    def fields(session: AgentSession) -> dict[str, Any] | None:
        endpoint = endpoint_for(session)
        if endpoint is None:
            return None
        return {proto.LISTEN_ADDRESS: endpoint[0], proto.LISTEN_PORT: endpoint[1]}

    return request_each(sessions, proto.OP_LISTEN, timeout_s, fields)


def unlisten(
    sessions: Sessions,
    timeout_s: float,
    ports_for: Callable[[AgentSession], Sequence[int] | None],
) -> Replies:
    """Close the listeners `listen` opened (None: not asked)."""

    def fields(session: AgentSession) -> dict[str, Any] | None:
        ports = ports_for(session)
        return None if ports is None else {"ports": list(ports)}

    return request_each(sessions, proto.OP_UNLISTEN, timeout_s, fields)


def connect(
    sessions: Sessions,
    timeout_s: float,
    targets_for: Callable[[AgentSession], list[dict[str, Any]]],
    wait_s: float,
) -> Replies:
    """From each host, a TCP connect to each of its targets (none: not asked)."""

    def fields(session: AgentSession) -> dict[str, Any] | None:
        targets = targets_for(session)
        return {proto.CONNECT_TARGETS: targets, "wait_s": wait_s} if targets else None

    return request_each(sessions, proto.OP_CONNECT, timeout_s, fields)


def sync_plan(
    session: AgentSession,
    dst: str,
    dirs: Sequence[str],
    files: Sequence[Sequence[Any]],
    links: Sequence[Sequence[str]],
    timeout_s: float,
) -> list[int]:
    """Which of `files` the host needs (indexes), after making `dirs` and `links` under dst."""
    reply = session.request(
        proto.OP_SYNC_PLAN,
        timeout_s,
        dst=dst,
        dirs=list(dirs),
        files=[list(f) for f in files],
        links=[list(link) for link in links],
    )
    need: list[int] = reply[proto.SYNC_NEED]
    return need


def sync_put(
    session: AgentSession,
    dst: str,
    files: Sequence[Sequence[Any]],
    data: Iterable[bytes],
    timeout_s: float,
) -> None:
    """Send `files`' contents, concatenated in order, to dst on the host."""
    session.request(
        proto.OP_SYNC_PUT, timeout_s, data=data, dst=dst, files=[list(f) for f in files]
    )


def stacks(
    sessions: Sessions,
    timeout_s: float,
    *,
    job: str | None,
    native: bool,
    per_process_s: float,
) -> Replies:
    """Every job process's stack on each host (`job` None: every dtrain job's), each process
    bounded by `per_process_s`; answered while the host's tasks keep running."""
    return request_each(
        sessions,
        proto.OP_STACKS,
        timeout_s,
        None,
        **{
            proto.STACKS_JOB: job,
            proto.STACKS_NATIVE: native,
            proto.STACKS_PER_PROCESS_S: per_process_s,
        },
    )
