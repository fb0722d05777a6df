"""Find and stop job processes on every host at once: `dtrain ps`, `dtrain kill`, doctor's check.

The one implementation of "what did jobs leave behind, and stop it". Each host's agent finds the
processes by their environment (`dtrain.remote.procs`: DTRAIN_JOB_ID or DMLC_ROLE, this user
only, never the agent or its ssh session) and stops them itself: SIGTERM to each process group,
SIGKILL after the grace, verify. This module asks every host in parallel, so a sweep takes about
as long as the slowest host, and turns the replies into `HostScan`/`HostKill` results. A host that
cannot be reached is a result with an error, never an exception: the others are still handled.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Callable, Iterator, Mapping, Sequence
from typing import TYPE_CHECKING, TypeVar

from dtrain.agents import ops
from dtrain.agents.group import AgentGroup, Reply
from dtrain.agents.session import AgentSession
from dtrain.errors import Problem, RemoteError
from dtrain.plan.hosts import Host, local_host
from dtrain.processes.results import HostKill, HostScan, JobProcess, Survivor
from dtrain.remote import proto
from dtrain.transport.machine import local_hostname
from dtrain.transport.options import SshOptions

if TYPE_CHECKING:
    from dtrain.transport.engine import EngineOptions

__all__ = [
    "HostKill",
    "HostScan",
    "JobProcess",
    "kill",
    "kill_sessions",
    "open_agents",
    "scan",
    "scan_sessions",
    "this_machine",
]

logger = logging.getLogger(__name__)
R = TypeVar("R")

SCAN_TIMEOUT_S = 30.0
PS_CPU_WINDOW_S = 0.5  # ps's CPU %: long enough to tell spinning from idle, short to wait for
KILL_MARGIN_S = 30.0  # beyond the grace: SIGKILL, verify, and late joiners take a few seconds


def this_machine() -> tuple[Host, ...]:
    """The hosts to act on without -H: this machine, through a local agent."""
    return (local_host(local_hostname()),)


@contextlib.contextmanager
def open_agents(
    hosts: Sequence[Host],
    ssh_options: SshOptions,
    remote_python: str = "auto",
    engine: EngineOptions | None = None,
) -> Iterator[tuple[dict[str, AgentSession], dict[str, Problem]]]:
    """Agents on every host that can be reached (in parallel), and the problems of the others."""
    with AgentGroup(ssh_options, remote_python, engine) as group:
        yield group.open_reachable(hosts)


def scan(
    hosts: Sequence[Host],
    ssh_options: SshOptions,
    job: str | None = None,
    *,
    include_dmlc: bool = True,
    remote_python: str = "auto",
    engine: EngineOptions | None = None,
    cpu_window_s: float = 0.0,
) -> dict[str, HostScan]:
    """The job processes on each host (no hosts: this machine), by `Host.key`, in host order.

    With `job`, only that dtrain job's processes; `include_dmlc=False` leaves out DMLC_ROLE
    processes that dtrain did not start; `cpu_window_s` measures each one's CPU % that long.
    """
    hosts = tuple(hosts) or this_machine()
    with open_agents(hosts, ssh_options, remote_python, engine) as (sessions, problems):
        found = scan_sessions(sessions, job, include_dmlc=include_dmlc, cpu_window_s=cpu_window_s)
    return _in_order(hosts, found, problems, lambda s: s)


def scan_sessions(
    sessions: Mapping[str, AgentSession],
    job: str | None = None,
    *,
    include_dmlc: bool = True,
    cpu_window_s: float = 0.0,
) -> dict[str, HostScan]:
    """`scan` over agents that are already running (doctor has them open anyway)."""
    replies = ops.scan(
        sessions, SCAN_TIMEOUT_S, job=job, include_dmlc=include_dmlc, cpu_window_s=cpu_window_s
    )
    return {key: _host_scan(sessions[key], reply) for key, reply in replies.items()}


def kill(
    hosts: Sequence[Host],
    ssh_options: SshOptions,
    job: str | None = None,
    *,
    grace_s: float = 5.0,
    dry_run: bool = False,
    include_dmlc: bool = True,
    remote_python: str = "auto",
    engine: EngineOptions | None = None,
) -> dict[str, HostKill]:
    """Stop the job processes on every host in parallel (no hosts: this machine).

    SIGTERM to each process group, SIGKILL to what is left after `grace_s`, then verify; with
    `dry_run`, only list. By `Host.key`, in host order; unreachable hosts carry their error.
    """
    hosts = tuple(hosts) or this_machine()
    with open_agents(hosts, ssh_options, remote_python, engine) as (sessions, problems):
        done = kill_sessions(
            sessions, job, grace_s=grace_s, dry_run=dry_run, include_dmlc=include_dmlc
        )
    return _in_order(hosts, done, problems, lambda s: HostKill(s, grace_s, dry_run))


def kill_sessions(
    sessions: Mapping[str, AgentSession],
    job: str | None = None,
    *,
    grace_s: float = 5.0,
    dry_run: bool = False,
    include_dmlc: bool = True,
) -> dict[str, HostKill]:
    """`kill` over agents that are already running."""
    replies = ops.kill(
        sessions,
        grace_s + KILL_MARGIN_S,
        job=job,
        include_dmlc=include_dmlc,
        grace_s=grace_s,
        dry_run=dry_run,
    )
    results = {}
    for name, session in sessions.items():
        reply = replies.get(session.host.key)
        if reply is None:
            continue
        found = _host_scan(session, reply)
        if isinstance(reply, RemoteError):
            results[name] = HostKill(found, grace_s, dry_run)
            continue
        results[name] = HostKill(
            found,
            grace_s,
            dry_run,
            by_term=frozenset(reply.get(proto.KILL_TERM, ())),
            by_kill=frozenset(reply.get(proto.KILL_KILL, ())),
            already_gone=frozenset(reply.get(proto.KILL_GONE, ())),
            survivors=tuple(
                Survivor(int(s["pid"]), str(s["reason"]))
                for s in reply.get(proto.KILL_SURVIVORS, ())
            ),
        )
    return results


def _host_scan(session: AgentSession, reply: Reply) -> HostScan:
    host = session.host
    if isinstance(reply, RemoteError):
        return HostScan(
            host.display,
            error=Problem(reply.what, host=host.display, hint=reply.hint, code=reply.code),
            is_local=host.is_local,
        )
    now = float(reply.get(proto.REPLY_TIME, 0.0))
    found = reply.get(proto.SCAN_PROCESSES, ())
    processes = tuple(JobProcess.from_agent(entry, now) for entry in found)
    return HostScan(
        host.display, processes, user=reply.get(proto.SCAN_USER), is_local=host.is_local
    )


def _in_order(
    hosts: Sequence[Host],
    results: Mapping[str, R],
    problems: Mapping[str, Problem],
    unreached: Callable[[HostScan], R],
) -> dict[str, R]:
    """Every host's result in the order given; a host never reached gets its problem."""
    ordered: dict[str, R] = {}
    for host in hosts:
        if host.key in results:
            ordered[host.key] = results[host.key]
        else:
            problem = problems.get(host.key) or Problem("no answer", host=host.display)
            ordered[host.key] = unreached(
                HostScan(host.display, error=problem, is_local=host.is_local)
            )
    return ordered
