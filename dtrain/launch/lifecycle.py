"""`dtrain launch` from request to result: connect, learn the hosts, plan, start, supervise.

Order matters: every host is connected and every agent has answered before the plan is made
(the plan needs each host's real address and free ports), and every host has accepted its
tasks (working directory there, command found) before any task starts anywhere. A failure at
any step before that starts nothing.
"""

from __future__ import annotations

import contextlib
import logging
import queue
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtrain import containers
from dtrain.agents.group import AgentGroup
from dtrain.agents.session import OUTPUT_KINDS, AgentEvent, AgentSession, Heartbeat, LinkClosed
from dtrain.errors import ConnectError, DtrainError, PreflightFailed
from dtrain.launch import DEFAULT_EXCLUDES, joblog, restarts
from dtrain.launch.results import JobState
from dtrain.launch.signals import forward_signals
from dtrain.plan import planner
from dtrain.plan.hosts import Host
from dtrain.plan.spec import Framework, JobPlan, PlacedTask
from dtrain.remote import proto
from dtrain.transport.machine import (
    TASKS_ELSEWHERE_HINT,
    local_address,
    local_free_ports,
    local_hostname,
    local_interfaces,
    resolve_address,
    tasks_here_refused,
)
from dtrain.transport.options import SshOptions

if TYPE_CHECKING:
    from dtrain.launch.results import JobResult
    from dtrain.launch.supervise import Console, StackTaker
    from dtrain.transport.engine import EngineOptions

logger = logging.getLogger(__name__)

REQUEST_TIMEOUT_S = 30.0
DEFAULT_LEASE_S = 15.0  # a host silent this long is lost, unless told otherwise
MIN_LEASE_S = 2.0  # two heartbeats: a shorter lease loses healthy hosts
LEFTOVER_WAIT_S = 5.0  # beyond the grace: an earlier attempt's tasks going by themselves
LEFTOVER_POLL_S = 0.2


@dataclass(frozen=True)
class LaunchOptions:
    log_root: Path = Path("dtrain-logs")
    grace_s: float = 5.0
    timeout_s: float | None = None
    heartbeat_s: float = 1.0
    lease_s: float | None = None  # None: each host's ssh ServerAlive limit, else DEFAULT_LEASE_S
    traceback_timeout_s: float = 10.0
    ssh: SshOptions = field(default_factory=SshOptions)
    remote_python: str = "auto"
    sync_excludes: tuple[str, ...] = DEFAULT_EXCLUDES
    preflight: bool = True
    kill_command: str = "dtrain kill"  # with the flags that reach these hosts, for hints
    engine: EngineOptions | None = None  # start the agents through Slurm, mpirun (AgentGroup)
    take_stacks: bool = True  # a job stopped because it hung: every task's stack first
    restart: restarts.RestartPolicy = field(default_factory=restarts.RestartPolicy)


class StacksOnDemand:
    """The stack taker, imported when a hung job first needs it: its modules (10-15 ms) are
    needed by few jobs, and loading them during every launch, even in a thread, delayed the
    first requests of a 1-host launch (the threads compete for the interpreter's lock)."""

    def __init__(
        self, sessions: Mapping[str, AgentSession], job: str, job_dir: Path, budget_s: float
    ) -> None:
        self._args = (dict(sessions), job, job_dir, budget_s)
        self._taker: StackTaker | None = None
        self._failure: str | None = None

    def start(self) -> None:
        try:
            from dtrain.processes import stacks
        except (ImportError, OSError) as exc:  # a broken install: the job still stops
            self._failure = f"cannot load dtrain's stack taker ({exc}): reinstall dtrain"
            return
        self._taker = stacks.Background(*self._args)
        self._taker.start()

    def is_done(self) -> bool:
        return self._failure is not None or (self._taker is not None and self._taker.is_done())

    def summary(self) -> list[str]:
        if self._failure is not None:
            return [self._failure]
        return self._taker.summary() if self._taker is not None else []


def host_leases(
    group: AgentGroup, sessions: Mapping[str, AgentSession], lease_s: float | None
) -> dict[str, float]:
    """Each host's lease: --heartbeat-timeout when given, else the limit its ssh config gives
    OpenSSH (ServerAliveInterval * ServerAliveCountMax; at least MIN_LEASE_S), else
    DEFAULT_LEASE_S."""
    if lease_s is not None:
        return {key: lease_s for key in sessions}
    leases = {}
    for key, session in sessions.items():
        limit = group.silence_limit_s(session.host)
        leases[key] = DEFAULT_LEASE_S if limit is None else max(limit, MIN_LEASE_S)
    return leases


def gather_facts(
    request: planner.JobRequest,
    job_id: str,
    sessions: Mapping[str, AgentSession],
    options: LaunchOptions,
    placed: Sequence[PlacedTask] | None = None,
    leases: Mapping[str, float] | None = None,
) -> planner.Facts:
    """Ask every agent about its host; addresses are the ones ssh reached them at. Facts are
    of the hosts with agents, which are the hosts with tasks: the plan asks of no other."""
    from dtrain.agents import ops

    ports = planner.ports_needed(request, placed)
    replies = ops.hello(
        sessions,
        REQUEST_TIMEOUT_S,
        ports_for=lambda s: ports.get(s.host.key, 0),
        heartbeat_s=options.heartbeat_s,
        lease_s=options.lease_s or DEFAULT_LEASE_S,
        leases=leases,
        grace_s=options.grace_s,
    ).raise_if_failed("contacting the agents")
    hosts: dict[str, planner.HostFacts] = {}
    remote_addresses = []
    for key, reply in replies.items():
        host = sessions[key].host
        if host.is_local:
            continue
        hello = ops.HelloFacts.from_reply(reply)
        address = hello.ssh_server_address or resolve_address(host.name) or host.name
        remote_addresses.append(address)
        hosts[key] = planner.HostFacts(
            address=address, interfaces=hello.interfaces, free_ports=hello.free_ports
        )
    for key, reply in replies.items():
        host = sessions[key].host
        if host.is_local:  # tasks here: this machine's agent answered too
            hello = ops.HelloFacts.from_reply(reply)
            hosts[key] = planner.HostFacts(
                address=local_address(remote_addresses),
                interfaces=hello.interfaces,
                free_ports=hello.free_ports,
            )
    return planner.Facts(job_id=job_id, hosts=hosts)


def dry_run_facts(
    request: planner.JobRequest, job_id: str, ssh: SshOptions, through_engine: bool = False
) -> tuple[planner.Facts, list[str]]:
    """Facts without connecting anywhere: names resolved here, ports chosen here.

    Also the hosts whose names do not resolve from here (a launch learns their addresses
    from ssh itself, so they stay names in the dry run's plan). An engine's hosts (Slurm's
    nodes, mpirun's) stay names: their agents tell their addresses at launch.
    """
    ports = planner.ports_needed(request)
    if through_engine or not request.hosts:
        names = [host.name for host in request.hosts]
    else:
        from dtrain.transport.ssh import SshTransport

        names = [t.hostname for t in SshTransport(ssh).distinct_targets(request.hosts)]
    hosts: dict[str, planner.HostFacts] = {}
    resolved = []
    unresolved = []
    for host, name in zip(request.hosts, names, strict=True):
        address = None if through_engine else resolve_address(name)
        if address is None:
            unresolved.append(host.display)
        else:
            resolved.append(address)
        hosts[host.key] = planner.HostFacts(
            address=address or name,
            interfaces={},
            free_ports=tuple(local_free_ports(ports.get(host.key, 0))),
        )
    here = local_interfaces()
    hosts[request.local_host.key] = planner.HostFacts(
        address=local_address(resolved, here if request.hosts else None),
        interfaces=here,
        free_ports=tuple(local_free_ports(ports.get(request.local_host.key, 0))),
    )
    return planner.Facts(job_id=job_id, hosts=hosts), unresolved


@dataclass(frozen=True)
class KeptAgents:
    """An attempt's agents kept open for the next one: reconnecting every host (ssh, Slurm's
    step) is most of what a restart would cost at many hosts."""

    group: AgentGroup
    sessions: dict[str, AgentSession]
    leases: dict[str, float]


@dataclass
class Launch:
    """One `dtrain launch`: its plan (once made) and its result (once finished)."""

    request: planner.JobRequest
    job_id: str
    options: LaunchOptions
    console: Console
    plan: JobPlan | None = None
    log_dir: Path | None = None
    on_planned: Callable[[JobPlan, Path], None] | None = None
    job_file: joblog.JobFile | None = None  # once set, the job's directory stays
    tasks_started_at: float | None = None  # when every task of the attempt had started
    dropped: dict[str, restarts.DroppedHost] = field(default_factory=dict)  # by host key
    kept: KeptAgents | None = None  # a failed attempt's agents, for the next attempt

    def run(self) -> JobResult:
        engine = self.options.engine
        allocating = engine is not None and engine.allocate_count is not None
        planner.validate(self.request)  # bad requests fail before any connection
        policy = self.options.restart
        restarts.validate(policy, len(self.request.hosts) or None, allocating)
        placed = () if allocating else planner.place(self.request)
        _check_tasks_here(placed)
        self._job_ssh()  # a directory --image cannot mount fails here
        paths = joblog.create(self.options.log_root, self.job_id)  # and a bad --log-dir
        try:
            if not policy.restarts:
                return self.run_attempt(paths, placed, None)
            from dtrain.launch.attempts import Attempts

            return Attempts(self, paths).run(placed)
        finally:
            self.release()
            if self.job_file is None:
                joblog.remove(paths)

    def run_attempt(
        self, paths: joblog.JobPaths, placed: Sequence[PlacedTask], attempt: int | None
    ) -> JobResult:
        """One start of the whole job, to its end (`attempt` None: a job that never restarts,
        its logs at the top of its directory)."""
        kept = self._take_kept(placed)
        hosts = kept.group if kept is not None else self._agent_group()
        self.tasks_started_at = None
        keep = False
        try:
            phase = _PhaseClock()
            if kept is not None:  # the last attempt's agents, every one still there
                sessions, leases = kept.sessions, kept.leases
            else:
                sessions, placed = self._connect(hosts, placed, attempt, phase)
                leases = host_leases(hosts, sessions, self.options.lease_s)
            phase("connected and agents started")
            with Heartbeat(sessions.values(), self.options.heartbeat_s):
                if attempt is not None and attempt > 1:
                    self._clear_leftovers(sessions, attempt)
                facts = gather_facts(
                    self.request, self.job_id, sessions, self.options, placed, leases
                )
                self.plan = planner.plan_job(self.request, facts, placed)
                phase("facts gathered and plan made")
                if self.options.preflight:
                    self._preflight(sessions)
                    phase("preflight")
                if self.plan.sync_dst is not None:
                    self._sync(sessions, self.plan.sync_dst)
                    phase("sync")
                self._hand_out_tasks(sessions)
                phase("tasks checked on every host")
                job_file = self._prepare_log_dir(paths, _engine_record(hosts), attempt)
                phase("log dir and job.json")
                self.log_dir = paths.dir
                from dtrain.agents import ops
                from dtrain.launch.supervise import Supervisor, SupervisorOptions

                with forward_signals(hosts.events):
                    supervisor = Supervisor(
                        self.plan,
                        sessions,
                        hosts.events,
                        joblog.attempt_dir(paths, attempt),
                        self.console,
                        SupervisorOptions(
                            grace_s=self.options.grace_s,
                            timeout_s=self.options.timeout_s,
                            lease_s=self.options.lease_s or DEFAULT_LEASE_S,
                            host_leases=leases,
                            linger_s=self.options.grace_s,
                        ),
                        stacks=self._stack_taker(sessions),
                    )
                    self.job_file = job_file  # from here on the job's directory stays
                    if self.on_planned is not None:
                        self.on_planned(self.plan, self.log_dir)
                    ops.start(sessions, REQUEST_TIMEOUT_S).raise_if_failed(
                        "starting the tasks", outcome="the tasks that did start were stopped"
                    )
                    job_file.tasks_started()
                    self.tasks_started_at = time.time()
                    phase("tasks started")
                    result = supervisor.run()
                keep = self._may_keep(result, attempt)
                if keep:
                    self.kept = KeptAgents(hosts, sessions, leases)
                else:
                    hosts.close()  # every agent done with its tasks (closing again is a no-op)
                    self._sweep_lost(result)
                if attempt is None:
                    self._record(job_file, result)
                return result
        finally:
            if not keep:
                hosts.close()

    def _connect(
        self,
        hosts: AgentGroup,
        placed: Sequence[PlacedTask],
        attempt: int | None,
        phase: Callable[[str], None],
    ) -> tuple[dict[str, AgentSession], Sequence[PlacedTask]]:
        """Every host's agent, started for this attempt (an allocation made first if asked)."""
        engine = self.options.engine
        if self.request.hosts and engine is None:  # a host listed twice is a mistake
            hosts.ssh.distinct_targets(self.request.hosts)
        if engine is not None and engine.allocate_count is not None:
            placed = self._allocate(hosts)
            phase("allocation made, agents started")
        return self._open(hosts, placed, attempt)

    def _may_keep(self, result: JobResult, attempt: int | None) -> bool:
        """Whether the next attempt may use this one's agents: a failure that may restart,
        every host still there (none lost, none left unconfirmed), no --setup to run again."""
        return (
            attempt is not None
            and self.options.restart.restarts
            and not self.options.ssh.setup
            and result.state is JobState.FAILED
            and not restarts.lost_hosts(result)
        )

    def _take_kept(self, placed: Sequence[PlacedTask]) -> KeptAgents | None:
        """The last attempt's agents, if they serve exactly this attempt's hosts and every
        one is still there; else they are closed (and the attempt connects afresh)."""
        kept, self.kept = self.kept, None
        if kept is None:
            return None
        closed = False
        while True:  # what came after the last attempt ended: late output, a closed link
            try:
                event = kept.group.events.get_nowait()
            except queue.Empty:
                break
            if isinstance(event, LinkClosed):
                closed = True
            elif (
                isinstance(event, AgentEvent)
                and event.kind in OUTPUT_KINDS
                and event.session.budget is not None
            ):
                event.session.budget.give_back(len(event.payload))
        wanted = {h.key for h in _hosts_of(placed)}
        gone = any(s.is_closed for s in kept.sessions.values())
        if closed or gone or wanted != set(kept.sessions):
            kept.group.close()
            return None
        return kept

    def keep_alive(self) -> contextlib.AbstractContextManager[object]:
        """While a restart waits: heartbeats to the agents kept for it, so they stay."""
        if self.kept is None:
            return contextlib.nullcontext()
        return Heartbeat(self.kept.sessions.values(), self.options.heartbeat_s)

    def release(self) -> None:
        """Close the agents kept for a next attempt that will not come."""
        kept, self.kept = self.kept, None
        if kept is not None:
            kept.group.close()

    def _open(
        self, hosts: AgentGroup, placed: Sequence[PlacedTask], attempt: int | None
    ) -> tuple[dict[str, AgentSession], Sequence[PlacedTask]]:
        """Every planned host's agent; a restart with --min-hosts goes on without the hosts
        that do not answer (if enough do), the tasks placed again over the others."""
        policy = self.options.restart
        wanted = _hosts_of(placed)
        if attempt is None or attempt == 1 or policy.min_hosts is None or not self.request.hosts:
            return hosts.open(wanted), placed
        sessions, problems = hosts.open_reachable(wanted)
        if not problems:
            return sessions, placed
        answering = tuple(h for h in self.request.hosts if h.key in sessions)
        if not restarts.enough_hosts(policy, len(answering)):
            raise ConnectError(
                f"only {len(answering)} of {len(self.request.hosts)} hosts answer for attempt "
                f"{attempt}, fewer than --min-hosts {policy.min_hosts}; nothing was started",
                problems=list(problems.values()),
            )
        for host in self.request.hosts:
            problem = problems.get(host.key)
            if problem is not None:
                self.drop_host(host, problem.message, attempt)
        self.request = replace(self.request, hosts=answering)
        placed = planner.place(self.request)
        keep = {h.key for h in _hosts_of(placed)}
        return {k: s for k, s in sessions.items() if k in keep}, placed

    def drop_host(self, host: Host, why: str, attempt: int) -> None:
        """Leave `host` out until its cool-down has passed; the console and job.json say why."""
        policy = self.options.restart
        self.dropped[host.key] = restarts.DroppedHost(host.key, host.display, why, time.monotonic())
        self.console.note(
            f"{host.display} dropped from attempt {attempt}: {why}; the job goes on without it "
            f"(--min-hosts {policy.min_hosts}), and tries it again after "
            f"{policy.host_cooldown_s:g}s"
        )

    def _clear_leftovers(self, sessions: Mapping[str, AgentSession], attempt: int) -> None:
        """No task of an earlier attempt may still run when the next starts (its ports, its
        GPUs): wait for them to go, then stop what is left; one that survives ends the job."""
        from dtrain.processes import sweep

        deadline = time.monotonic() + self.options.grace_s + LEFTOVER_WAIT_S
        while True:
            scans = sweep.scan_sessions(sessions, self.job_id, include_dmlc=False)
            left = {k: s.host for k, s in scans.items() if any(p.task for p in s.processes)}
            if not left or time.monotonic() >= deadline:
                break
            time.sleep(LEFTOVER_POLL_S)
        if not left:
            return
        self.console.note(
            f"tasks of attempt {attempt - 1} still run on {', '.join(left.values())}: "
            f"stopping them before attempt {attempt} starts"
        )
        kills = sweep.kill_sessions(
            {k: sessions[k] for k in left},
            self.job_id,
            grace_s=self.options.grace_s,
            include_dmlc=False,
        )
        survivors = [kill.host for kill in kills.values() if kill.survivors or kill.error]
        if survivors:
            raise DtrainError(
                f"tasks of attempt {attempt - 1} survive on {', '.join(survivors)}; "
                f"attempt {attempt} was not started",
                hint=f"stop them with `{self.options.kill_command} --job {self.job_id}`",
            )

    def _job_ssh(self) -> SshOptions:
        """How this job reaches its hosts: with --container or --image, its container named
        after the job and the job's directories mounted (a bad mount fails here)."""
        ssh = self.options.ssh
        if ssh.container is None:
            return ssh
        mounts = (self.request.workdir, self.request.sync_dst or "")
        return replace(ssh, container=containers.for_job(ssh.container, self.job_id, mounts))

    def _agent_group(self) -> AgentGroup:
        """The job's agents, whose --setup processes carry the job's tag."""
        options = self.options
        return AgentGroup(
            self._job_ssh(),
            options.remote_python,
            options.engine,
            job_id=self.job_id,
            setup_output=self.console.setup_output,
        )

    def _sweep_lost(self, result: JobResult) -> None:
        """--container: a host whose agent died (SIGKILL) still has what its tasks started in
        sessions of their own, orphaned to the container's init; stop it there by the job's
        tag. (--image needs none of this: its init takes the whole container down.)"""
        container = self.options.ssh.container
        if container is None or container.is_fresh or self.plan is None:
            return
        lost = {e.host for e in result.exits if e.reason == proto.REASON_LOST}
        hosts = [h for h in self.plan.hosts if lost & {h.display, h.name, h.key}]
        if not hosts:
            return
        from dtrain.processes import sweep

        ssh = replace(self.options.ssh, setup=())
        done = sweep.kill(hosts, ssh, self.job_id, grace_s=self.options.grace_s)
        for key, outcome in done.items():
            if outcome.error is not None or outcome.survivors:
                self.console.note(
                    f"could not stop what the job left in {container.shown} on {key}: "
                    f"{outcome.error.message if outcome.error else 'processes survived'}; "
                    f"{self.options.kill_command} --job {self.job_id}"
                )

    def _allocate(self, hosts: AgentGroup) -> tuple[PlacedTask, ...]:
        """`--launcher slurm --nodes N`: the allocation's nodes become the job's hosts."""
        assert self.options.engine is not None
        count = self.options.engine.allocate_count
        assert count is not None
        nodes = hosts.allocate(count)
        self.request = with_slurm_hosts(self.request, nodes)
        assert hosts.engine is not None
        self.console.note(
            f"{hosts.engine.label()}: {len(nodes)} node{'s' if len(nodes) != 1 else ''} "
            f"{', '.join(h.name for h in nodes)}"
        )
        return planner.place(self.request)

    def _prepare_log_dir(
        self,
        paths: joblog.JobPaths,
        engine: dict[str, Any] | None = None,
        attempt: int | None = None,
    ) -> joblog.JobFile:
        """Log aliases, `latest`, and job.json saying running (with who runs it); a later
        attempt only its own directory and its plan in job.json."""
        assert self.plan is not None
        host = local_hostname()
        previous = joblog.populate(paths, self.plan, host, attempt)
        if self.job_file is not None and attempt is not None and attempt > 1:
            self.job_file.update(plan=self.plan.to_dict(), attempt=attempt, engine=engine)
            return self.job_file
        if previous is not None:
            self.console.note(
                f"the previous job {previous.job_id} never recorded its end: launcher died "
                f"(pid {previous.launcher.pid}); its job.json now says launcher_died"
            )
        job_file = joblog.JobFile(paths)
        try:
            job_file.start(self.plan, joblog.this_launcher(host), engine)
        except OSError as exc:
            raise joblog.log_dir_error(paths.dir, exc, "write") from None
        if attempt is not None:
            job_file.update(attempt=attempt, max_restarts=self.options.restart.max_restarts)
        return job_file

    def _stack_taker(self, sessions: Mapping[str, AgentSession]) -> StackTaker | None:
        if not self.options.take_stacks or self.plan is None or self.log_dir is None:
            return None
        from dtrain.launch.supervise import SupervisorOptions

        budget_s = SupervisorOptions.stacks_budget_s
        return StacksOnDemand(sessions, self.plan.job_id, self.log_dir, budget_s)

    def _record(self, job_file: joblog.JobFile, result: JobResult) -> None:
        """The final state into job.json; a disk that refuses even that costs a warning only."""
        try:
            job_file.finish(result.state.value, result.to_dict())
        except OSError as exc:
            self.console.note(
                f"cannot write {job_file.paths.job_file}: {exc.strerror or exc}; "
                f"it still says the job is running"
            )

    def _preflight(self, sessions: Mapping[str, AgentSession]) -> None:
        """doctor's quick subset (stale processes, the scheduler's port free on its host and
        reachable from every other) before anything is copied or started; this machine too."""
        assert self.plan is not None
        from dtrain.doctor import gather  # imported when used: a dry run never needs it
        from dtrain.doctor.judge import Status

        started = time.monotonic()
        rendezvous = self.plan.rendezvous
        first = self.plan.tasks[0].host.key if self.plan.tasks else None
        results = gather.preflight(
            sessions,
            first if rendezvous is not None else None,
            (rendezvous.address, rendezvous.port) if rendezvous is not None else None,
            self.options.kill_command,
            this_job=self.job_id,
        )
        logger.info("preflight took %.3fs", time.monotonic() - started)
        for result in results:
            if result.status is Status.WARN:
                self.console.note(f"preflight: {result.host}: {result.detail}")
        failures = [r.to_problem() for r in results if r.status is Status.FAIL]
        if failures:
            raise PreflightFailed(
                f"preflight failed on {len({p.host for p in failures})} host(s); "
                "nothing was started",
                problems=failures,
                hint="fix the above, or pass --no-preflight to start anyway; "
                "`dtrain doctor -H HOSTS` gather everything",
            )

    def _sync(self, sessions: Mapping[str, AgentSession], dst: str) -> None:
        assert self.plan is not None
        remote = {name: s for name, s in sessions.items() if not s.host.is_local}
        if not remote:
            return
        from dtrain.launch import sync

        excludes = (*self.options.sync_excludes, self.options.log_root.name)
        started = time.monotonic()
        manifest = sync.build_manifest(Path(self.plan.workdir), excludes)
        reports = sync.sync_all(remote, manifest, dst)
        sent = sum(r.bytes_sent for r in reports)
        self.console.note(
            f"synced {self.plan.workdir} to {dst} on {len(reports)} host(s): "
            f"{len(manifest.files)} files, {sent / 1e6:.1f} MB sent, "
            f"in {time.monotonic() - started:.1f}s"
        )

    def _hand_out_tasks(self, sessions: Mapping[str, AgentSession]) -> None:
        from dtrain.agents import ops
        from dtrain.doctor import parity

        assert self.plan is not None
        ops.stage(
            sessions,
            self.plan.job_id,
            self.plan.tasks_by_id(),
            REQUEST_TIMEOUT_S,
            grace_s=self.options.grace_s,
            traceback_timeout_s=self.options.traceback_timeout_s,
            script_of=parity.launched_script,
        ).raise_if_failed("checking the tasks")


class _PhaseClock:
    """Logs how long each step of a launch took (`dtrain --debug launch`)."""

    def __init__(self) -> None:
        self.last = time.monotonic()

    def __call__(self, what: str) -> None:
        now = time.monotonic()
        logger.debug("%s in %.3fs", what, now - self.last)
        self.last = now


def with_slurm_hosts(request: planner.JobRequest, nodes: Sequence[Host]) -> planner.JobRequest:
    """The request run on an allocation's nodes: every task, the scheduler too, on a node
    (the launcher may sit on a login node), the scheduler on the first unless told."""
    scheduler = request.scheduler_host
    if scheduler is None and request.framework is Framework.DMLC and nodes:
        scheduler = nodes[0].name
    return replace(request, hosts=tuple(nodes), scheduler_host=scheduler)


def _engine_record(hosts: AgentGroup) -> dict[str, Any] | None:
    """job.json's note of what started the agents (Slurm's job and step ids), or None (ssh)."""
    return hosts.engine.record() if hosts.engine is not None else None


def _check_tasks_here(placed: Sequence[PlacedTask]) -> None:
    """Tasks placed on this machine when it cannot run them: one line, before any connection."""
    here = sum(1 for task in placed if task.host.is_local)
    refused = tasks_here_refused() if here else None
    if refused is not None:
        what = f"{here} task{'s' if here != 1 else ''} would run on this machine: {refused}"
        raise DtrainError(what, hint=TASKS_ELSEWHERE_HINT)


def _hosts_of(placed: Sequence[PlacedTask]) -> list[Host]:
    """The hosts the tasks were placed on, each once, in order of first use."""
    seen: dict[str, Host] = {}
    for task in placed:
        seen.setdefault(task.host.key, task.host)
    return list(seen.values())
