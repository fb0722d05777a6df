"""`dtrain doctor` and launch's preflight: ask every host at once, probe TCP between them.

Every host (the launching machine included: the scheduler runs there) gets an agent; each step
goes to all hosts in parallel and is bounded in time, so doctor takes about as long as its
slowest host, and a host that cannot be reached is a finding, never a hang. This module gathers
(`Survey`); `diagnosis` judges; `render` prints.
"""

from __future__ import annotations

import logging
import os
import time
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from typing import TYPE_CHECKING, Any

from dtrain.agents import ops
from dtrain.agents.group import AgentGroup, Replies, Reply
from dtrain.agents.session import AgentSession
from dtrain.agents.setup import SetupOutput
from dtrain.doctor import parity
from dtrain.doctor.judge import (
    CHECKS,
    QUICK_CHECKS,
    CheckResult,
    Connect,
    DoctorReport,
    Observed,
    Scheduler,
    Survey,
    judge,
)
from dtrain.errors import DtrainError, Problem, RemoteError
from dtrain.plan.hosts import Host, local_host, named
from dtrain.plan.planner import workdir_on
from dtrain.processes import sweep
from dtrain.processes.results import HostScan
from dtrain.remote import proto
from dtrain.transport import sshconfig
from dtrain.transport.machine import local_address, local_free_ports, local_hostname
from dtrain.transport.options import SshOptions

if TYPE_CHECKING:
    from dtrain.transport.engine import EngineOptions

logger = logging.getLogger(__name__)

WAIT_S = 2.0  # one TCP probe; LAN round trips are far shorter, a drop never answers
STEP_TIMEOUT_S = 10.0
PROBE_TIMEOUT_S = 60.0  # the interpreter lists its packages; nvidia-smi can be slow


@dataclass(frozen=True)
class DoctorRequest:
    """What to check: the hosts, and the parts of a launch that doctor should mirror."""

    hosts: tuple[Host, ...]
    command: tuple[str, ...] = ()
    workdir: str = "."
    sync_dst: str | None = None
    port: int | None = None
    scheduler_host: str | None = None  # one of `hosts` (by display or name); else this machine
    host_ip: str | None = None
    interface: str | None = None
    shell_env: Mapping[str, str] = field(default_factory=dict)
    kill_command: str = "dtrain kill"
    wait_s: float = WAIT_S


def _error_text(reply: Reply) -> str | None:
    return reply.what if isinstance(reply, RemoteError) else None


def advertised_address(
    host: Host, hello: ops.HelloFacts, interface: str | None, fallback: str
) -> str:
    """The address a task on `host` would advertise (DMLC_NODE_HOST), as launch plans it."""
    if interface and interface in hello.interfaces:
        return str(hello.interfaces[interface])
    if host.is_local:
        return fallback
    return str(hello.ssh_server_address or host.name)


def run_doctor(
    request: DoctorRequest,
    ssh: SshOptions,
    remote_python: str = "auto",
    checks: Sequence[str] = CHECKS,
    engine: EngineOptions | None = None,
    setup_output: SetupOutput | None = None,
) -> DoctorReport:
    """Every check on every host (and this machine), in parallel; never raises for a host.

    With `engine`, the hosts' agents come from that engine (this machine's stays local)."""
    started = time.monotonic()
    here = local_host(local_hostname())
    if ssh.container is not None and request.hosts and request.scheduler_host is None:
        # A container job's scheduler runs on the first host, in its container (as launch
        # puts it), and this machine runs nothing of it.
        request = replace(request, scheduler_host=request.hosts[0].display)
    # With the scheduler on one of the hosts, this machine runs nothing of the job (as in a
    # launch) and is not checked: a launcher off Linux then checks every host it needs.
    everyone = request.hosts if request.scheduler_host else (here, *request.hosts)
    over_ssh = bool(request.hosts) and engine is None
    missing = _without_openssh([h for h in request.hosts if not h.is_local]) if over_ssh else {}
    over_ssh = over_ssh and not missing
    with AgentGroup(ssh, remote_python, engine, setup_output=setup_output) as group:
        sessions, problems = group.open_reachable([h for h in everyone if h.key not in missing])
        problems = {**problems, **missing}
        logger.debug("connected and agents started: %.3fs", time.monotonic() - started)
        connect_s = dict(group.ssh.connect_times_s) if over_ssh else {}
        survey = gather(request, here, sessions, problems, connect_s, group.job_id)
        if group.engine is not None:  # the hosts were reached through an engine, not ssh
            survey = replace(survey, reached_through=group.engine.label())
    results = judge(survey, checks)
    return DoctorReport(survey.hosts, results, tuple(checks), time.monotonic() - started)


def _without_openssh(hosts: Sequence[Host]) -> dict[str, Problem]:
    """Each host as unreachable when this machine has no OpenSSH client (dtrain reads the ssh
    config through `ssh -G`): the doctor still checks this machine, and says why per host."""
    try:
        sshconfig.openssh_client()
    except DtrainError as exc:
        return {
            h.key: Problem(
                f"{h.display}: {exc.what}", host=h.display, hint=exc.hint, code="no_openssh"
            )
            for h in hosts
        }
    return {}


def gather(
    request: DoctorRequest,
    here: Host,
    sessions: dict[str, AgentSession],
    problems: Mapping[str, Problem],
    connect_s: Mapping[str, float],
    this_job: str | None = None,
) -> Survey:
    """Ask the open agents everything doctor judges; a host that stops answering is named.

    Maps here are by `Host.key`; what is judged and shown names hosts by `Host.display`.
    """
    home = named(request.hosts, request.scheduler_host) if request.scheduler_host else None
    everyone = request.hosts if home is not None else (here, *request.hosts)
    home = home or here  # where the scheduler would listen
    shown = {h.key: h.display for h in everyone}
    hello, failed = _hello(sessions, shown, problems, scheduler_host=home.key)
    remote_addresses = [
        str(hello[h.key].ssh_server_address or h.name) for h in request.hosts if h.key in hello
    ]
    here_address = request.host_ip or local_address(remote_addresses)
    advertised = {
        h.key: advertised_address(h, hello[h.key], request.interface, here_address)
        for h in everyone
        if h.key in hello
    }
    free = hello[home.key].free_ports if home.key in hello else ()
    port = request.port or (free[0] if free else local_free_ports(1)[0])
    scheduler = Scheduler(home.key, request.host_ip or advertised.get(home.key, ""), port)
    scheduler, connects, listen_errors = probe_network(
        sessions, advertised, scheduler, request.wait_s
    )
    scans = scan(sessions, this_job)
    probes = ops.probe(
        sessions, PROBE_TIMEOUT_S, lambda s: _probe_fields(request, s.host, scheduler)
    )
    if request.port is not None and home.key in probes:
        reply = probes[home.key]
        answered = probes.times[home.key][1]
        if isinstance(reply, dict):
            scheduler = replace(
                scheduler, holders=tuple(reply.get(proto.PROBE_PORT_HOLDERS) or ()), now=answered
            )
    blocked = {c.dst for c in connects if not c.is_ok} | {c.src for c in connects if not c.is_ok}
    tools = ops.probe(
        sessions,
        STEP_TIMEOUT_S,
        lambda s: {"environment": False, "firewall_tools": True} if s.host.key in blocked else None,
    )
    observed = [
        _observed(
            host,
            probes,
            tools,
            hello.get(host.key),
            problem=failed.get(host.key),
            connect_s=connect_s.get(host.key),
            advertised=advertised.get(host.key),
            listen_error=listen_errors.get(host.key),
            scan=scans.get(host.key),
        )
        for host in everyone
    ]
    return Survey(
        hosts=tuple(observed),
        connects=_as_shown(connects, shown),
        scheduler=replace(
            scheduler, host=shown[scheduler.host], is_port_given=request.port is not None
        ),
        command=request.command,
        workdir=request.workdir,
        sync_dst=request.sync_dst,
        forwarded_env=frozenset(
            key for key in request.shell_env if key.startswith(("DMLC_", "PS_", "BYTEPS_"))
        ),
        kill_command=request.kill_command,
        wait_s=request.wait_s,
    )


def _hello(
    sessions: dict[str, AgentSession],
    shown: Mapping[str, str],
    problems: Mapping[str, Problem],
    scheduler_host: str | None = None,
) -> tuple[dict[str, ops.HelloFacts], dict[str, Problem]]:
    """Each agent's hello (the scheduler's host with a free port for it), and the problems so
    far plus those of agents that did not answer (whose sessions are dropped: nothing more is
    asked of them)."""
    hellos = ops.hello(
        sessions, STEP_TIMEOUT_S, ports_for=lambda s: int(s.host.key == scheduler_host)
    )
    failed = dict(problems)
    for key, error in hellos.failed.items():
        failed[key] = Problem(
            f"connected, but dtrain's agent did not answer: {error.what}",
            host=shown[key],
            hint=error.hint or "rerun with --debug to see what the login shell printed",
        )
        sessions.pop(key, None)
    return {key: ops.HelloFacts.from_reply(r) for key, r in hellos.succeeded.items()}, failed


def _observed(
    host: Host,
    probes: Replies,
    tools: Replies,
    hello: ops.HelloFacts | None,
    **found: Any,
) -> Observed:
    """What doctor learned of one host: its probe (and the clock skew the probe's round trip
    shows), the firewall tools of a host a probe could not reach, and what was `found` before."""
    reply = probes.get(host.key, RemoteError("no answer"))
    sent, answered = probes.times.get(host.key, (0.0, 0.0))
    probe = reply if isinstance(reply, dict) else {}
    skew = None
    if probe.get(proto.REPLY_TIME) is not None:
        skew = float(probe[proto.REPLY_TIME]) - (sent + answered) / 2
    tool_reply = tools.get(host.key, {})
    return Observed(
        name=host.display,
        is_local=host.is_local,
        interfaces=hello.interfaces if hello is not None else {},
        probe=probe,
        probe_error=_error_text(reply),
        clock_skew_s=skew,
        firewall_tools=tuple(
            tool_reply.get(proto.PROBE_FIREWALL_TOOLS) or () if isinstance(tool_reply, dict) else ()
        ),
        **found,
    )


def _probe_fields(request: DoctorRequest, host: Host, scheduler: Scheduler) -> dict[str, Any]:
    fields: dict[str, Any] = {
        "interpreter": parity.interpreter_of(request.command),
        "workdir": workdir_on(host.is_local, request.workdir, request.sync_dst),
        "script": parity.script_of(request.command),
        "synced": request.sync_dst is not None and not host.is_local,
    }
    if host.key == scheduler.host and request.port is not None:
        fields["port"] = request.port
    return fields


def _as_shown(connects: Sequence[Connect], shown: Mapping[str, str]) -> tuple[Connect, ...]:
    """Probes between hosts by key, renamed to how people see the hosts."""
    return tuple(replace(c, src=shown[c.src], dst=shown[c.dst]) for c in connects)


def scan(sessions: Mapping[str, AgentSession], this_job: str | None = None) -> dict[str, HostScan]:
    """The stale-process scan `dtrain kill` uses, on every open agent; without `this_job`'s
    own processes (what its --setup left running is not stale)."""
    found = sweep.scan_sessions(sessions)
    return {
        name: _without_job(_this_network_only(s) if s.is_local else s, this_job)
        for name, s in found.items()
    }


def _without_job(scan: HostScan, job: str | None) -> HostScan:
    kept = tuple(p for p in scan.processes if job is None or p.job_id != job)
    return replace(scan, processes=kept)


def _this_network_only(scan: HostScan) -> HostScan:
    """This machine's scan without processes in other network namespaces: to the network,
    a container or a test cluster's host is another machine (and is checked as one)."""
    mine = _net_namespace(os.getpid())
    kept = tuple(p for p in scan.processes if _net_namespace(p.pid) in (mine, None))
    return replace(scan, processes=kept)


def _net_namespace(pid: int) -> str | None:
    try:
        return os.readlink(f"/proc/{pid}/ns/net")
    except OSError:
        return None


def probe_network(
    sessions: Mapping[str, AgentSession],
    advertised: Mapping[str, str],
    scheduler: Scheduler,
    wait_s: float,
) -> tuple[Scheduler, list[Connect], dict[str, str]]:
    """A listener on every host (the scheduler's endpoint on its host, a random high port at
    the advertised address elsewhere), a connect from every host to every other's, then the
    listeners closed. Returns the scheduler (with its listen error), the probes, and the
    hosts whose advertised address could not be bound."""

    def endpoint(session: AgentSession) -> tuple[str, int] | None:
        key = session.host.key
        if key == scheduler.host:
            return (scheduler.address, scheduler.port)
        if key in advertised:
            return (advertised[key], 0)
        return None

    listened = ops.listen(sessions, STEP_TIMEOUT_S, endpoint)
    endpoints: dict[str, tuple[str, int]] = {}
    listen_errors: dict[str, str] = {}
    for name, reply in listened.items():
        if isinstance(reply, RemoteError):
            listen_errors[name] = reply.what
        elif reply.get("error"):
            listen_errors[name] = str(reply["error"])
        else:
            endpoints[name] = (str(reply[proto.LISTEN_ADDRESS]), int(reply[proto.LISTEN_PORT]))
    if scheduler.host in listen_errors:
        scheduler = replace(scheduler, listen_error=listen_errors.pop(scheduler.host))
        if "in use" in (scheduler.listen_error or ""):
            endpoints[scheduler.host] = (scheduler.address, scheduler.port)  # still probe it

    def targets(session: AgentSession) -> list[dict[str, Any]]:
        return [
            {"to": name, "address": address, "port": port}
            for name, (address, port) in endpoints.items()
            if name != session.host.key
        ]

    try:
        tried = ops.connect(sessions, wait_s * 2 + STEP_TIMEOUT_S, targets, wait_s)
    finally:
        ops.unlisten(
            sessions,
            STEP_TIMEOUT_S,
            lambda s: (
                [endpoints[s.host.key][1]]
                if s.host.key in endpoints and s.host.key in listened
                else None
            ),
        )
    connects = []
    for src, reply in tried.items():
        if isinstance(reply, RemoteError):
            continue
        for result in reply.get(proto.CONNECT_RESULTS, ()):
            connects.append(
                Connect(
                    src=src,
                    dst=str(result["to"]),
                    address=str(result["address"]),
                    port=int(result["port"]),
                    is_ok=bool(result.get("ok")),
                    error=result.get("error"),
                    elapsed_s=float(result.get("elapsed_s", 0.0)),
                )
            )
    return scheduler, connects, listen_errors


def preflight(
    sessions: Mapping[str, AgentSession],
    scheduler_host: str | None,
    endpoint: tuple[str, int] | None,
    kill_command: str,
    wait_s: float = WAIT_S,
    this_job: str | None = None,
) -> tuple[CheckResult, ...]:
    """Launch's quick subset on agents that are already up: stale processes, and whether every
    host reaches the scheduler's endpoint (ssh already worked, or there would be no agents)."""
    scheduler = None
    connects: list[Connect] = []
    if scheduler_host is not None and endpoint is not None and scheduler_host in sessions:
        scheduler = Scheduler(scheduler_host, endpoint[0], endpoint[1])
        listen_only = {scheduler_host: sessions[scheduler_host]}
        scheduler, connects, _ = probe_network(
            {**listen_only, **{n: s for n, s in sessions.items() if n != scheduler_host}},
            {},
            scheduler,
            wait_s,
        )
    scans = scan(sessions, this_job)
    observed = tuple(
        Observed(name=session.host.display, is_local=session.host.is_local, scan=scans.get(key))
        for key, session in sessions.items()
    )
    shown = {key: session.host.display for key, session in sessions.items()}
    survey = Survey(
        hosts=observed,
        connects=_as_shown(connects, shown),
        scheduler=replace(scheduler, host=shown[scheduler.host]) if scheduler else None,
        kill_command=kill_command,
        wait_s=wait_s,
    )
    return judge(survey, [c for c in QUICK_CHECKS if c != "ssh"])
