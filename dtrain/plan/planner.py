"""Plans a job: which task runs on which host, at which address and port, with what environment.

Placement (deterministic, documented in the README):

* parameter-server frameworks (dmlc, tf, paddle with servers): servers and workers are each
  spread round-robin over the hosts, starting from the first host; a host with `slots=N`
  appears N times in the cycle (interleaved), so it gets N times the tasks. The dmlc scheduler
  runs on the launching machine unless `--scheduler-host` names a host.
* collective frameworks (torch, paddle without servers): each host takes `slots` ranks (or
  `--nproc-per-host`, or one per `--gpus` entry), hosts in file order, so ranks on one host are
  contiguous: rank = ranks on earlier hosts + local rank.

Pure: facts about the world (addresses, free ports, the job id) come in through `Facts`.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from datetime import datetime

from dtrain.errors import DtrainError, UsageError
from dtrain.plan import frameworks
from dtrain.plan.hosts import MAX_SLOTS, Host, is_loopback, named, require_named
from dtrain.plan.spec import Endpoint, Framework, JobPlan, PlacedTask, Role, TaskSpec
from dtrain.remote import proto

# What CUDA_VISIBLE_DEVICES accepts: an index, or a GPU/MIG UUID (a prefix of one is enough).
GPU_ID = re.compile(r"\d+|(?:GPU|MIG)-[0-9A-Za-z][0-9A-Za-z/-]*")
MAX_ENV_STRING = 128 * 1024  # Linux's MAX_ARG_STRLEN
MAX_TASKS = 1_000_000  # a job is bounded so that a typo cannot plan for minutes (100k tasks: ~4 s)
ENV_HINT = "write --env KEY=VALUE, or --env KEY to pass KEY from this shell"
TASKS_PER_CORE = 4  # more local tasks than this per core earn a note, never a refusal


@dataclass(frozen=True)
class JobRequest:
    """What the user asked for, flags resolved, nothing looked up yet."""

    command: tuple[str, ...]
    local_host: Host
    framework: Framework = Framework.DMLC
    num_workers: int | None = None
    num_servers: int | None = None
    hosts: tuple[Host, ...] = ()
    scheduler_host: str | None = None
    host_ip: str | None = None
    interface: str | None = None
    port: int | None = None
    env: Mapping[str, str] = field(default_factory=dict)
    role_env: Mapping[Role, Mapping[str, str]] = field(default_factory=dict)
    shell_env: Mapping[str, str] = field(default_factory=dict)
    workdir: str = "."
    sync_dst: str | None = None
    chief: bool = False
    nproc_per_host: int | None = None
    gpus: tuple[str, ...] = ()
    ps_gpus: bool = False
    local_cores: int | None = None  # this machine's usable CPU cores, when the caller knows
    allow_env_override: bool = False  # --env may replace what dtrain computes (on purpose)
    restart_count: int = 0  # which restart of the job this plan is for (0: the first attempt)
    max_restarts: int = 0  # --max-restarts: with any, every task learns its attempt

    @property
    def is_local_only(self) -> bool:
        return not self.hosts

    @property
    def effective_interface(self) -> str | None:
        return self.interface or self.shell_env.get("DMLC_INTERFACE") or None


@dataclass(frozen=True)
class HostFacts:
    """What dtrain learned about one host before planning.

    `address` is the IP its peers reach it at (never an alias: ZMQ binds it).
    """

    address: str
    interfaces: Mapping[str, str] = field(default_factory=dict)
    free_ports: tuple[int, ...] = ()


@dataclass(frozen=True)
class Facts:
    job_id: str
    hosts: Mapping[str, HostFacts]  # by Host.key


def make_job_id(now: datetime, token: str) -> str:
    """Sortable and readable: `20261122-143005-3fa2`."""
    return f"{now:%Y%m%d-%H%M%S}-{token}"


def parse_env_assignments(
    items: Sequence[str], shell_env: Mapping[str, str], flag: str
) -> dict[str, str]:
    """`KEY=VALUE` sets a value; a bare `KEY` passes this shell's value through."""
    env: dict[str, str] = {}
    for item in items:
        key, sep, value = item.partition("=")
        if not key or not (key[0].isalpha() or key[0] == "_") or not key.replace("_", "").isalnum():
            raise UsageError(f'{flag} "{item}": "{key}" is not a variable name', hint=ENV_HINT)
        if not sep:
            if key not in shell_env:
                raise UsageError(
                    f"{flag} {key}: {key} is not set in this shell",
                    hint=f"export {key} first, or write {flag} {key}=VALUE",
                )
            value = shell_env[key]
        env[key] = value
    return env


def _check_env_overrides(request: JobRequest) -> None:
    """An --env that replaces a variable dtrain computes (a rank, an address) breaks the job in
    ways that show up far from the flag: refuse it unless asked for. The job's own tag never:
    ps, kill and the no-orphan sweep find the job's processes by it."""
    tags = {proto.JOB_ID_VAR, proto.TASK_VAR}
    managed: set[str] = set()
    if not request.allow_env_override:
        managed = set(frameworks.MANAGED_VARS[request.framework])
    given = [("--env", request.env)]
    given += [(f"--env-{role.value}", env) for role, env in request.role_env.items()]
    for flag, env in given:
        if tag := sorted(tags.intersection(env)):
            raise UsageError(
                f"{flag} {tag[0]}: {tag[0]} is dtrain's tag on the job's processes",
                hint="drop it: dtrain ps and dtrain kill find the job's processes by it",
            )
        if clash := sorted(managed.intersection(env)):
            raise UsageError(
                f"{flag} {clash[0]}: dtrain sets {clash[0]} for every "
                f"{request.framework.value} task itself",
                hint="drop it, or add --allow-env-override if you mean to replace "
                "dtrain's value in every task",
            )


def validate(request: JobRequest) -> None:
    """Reject impossible requests before anything is looked up or started."""
    fw = request.framework
    if not request.command:
        raise UsageError(
            "no command to run",
            hint="put the training command after --, e.g. dtrain launch -n 2 -- python train.py",
        )
    if request.num_workers is not None and request.num_workers < 1:
        raise UsageError("-n/--num-workers must be at least 1")
    if request.num_servers is not None and request.num_servers < 0:
        raise UsageError("-s/--num-servers cannot be negative")
    for flag, count in (
        ("-n/--num-workers", request.num_workers),
        ("-s/--num-servers", request.num_servers),
    ):
        if count is not None and count > MAX_TASKS:
            raise UsageError(
                f"{flag} {count} is more than dtrain plans in one job ({MAX_TASKS})",
                hint="check the number; a job this large is several jobs",
            )
    if fw is Framework.TORCH and request.num_servers:
        raise UsageError(
            "torch jobs have no parameter servers", hint="drop -s; -n is the world size"
        )
    if request.chief and fw is not Framework.TF:
        raise UsageError("--chief is for TensorFlow jobs", hint="add --framework tf")
    _check_env_overrides(request)
    if request.sync_dst is not None and not request.sync_dst.startswith("/"):
        raise UsageError(
            f'--sync-dst-dir "{request.sync_dst}" is not an absolute path',
            hint="name the directory on every host from its root, e.g. --sync-dst-dir /tmp/job",
        )
    if request.ps_gpus and fw is not Framework.TF:
        raise UsageError("--ps-gpus is for TensorFlow jobs", hint="add --framework tf")
    for gpu in request.gpus:
        if not GPU_ID.fullmatch(gpu):
            raise UsageError(
                f'--gpus "{",".join(request.gpus)}": "{gpu}" is not a GPU index or UUID',
                hint="list GPUs as CUDA_VISIBLE_DEVICES does: --gpus 0,1 or --gpus GPU-8c1f...",
            )
    if request.scheduler_host is not None:
        if fw is not Framework.DMLC:
            raise UsageError(f"--scheduler-host is for dmlc jobs; {fw.value} jobs have none")
        require_named(request.hosts, request.scheduler_host, "--scheduler-host")
    if request.nproc_per_host is not None:
        if request.nproc_per_host < 1:
            raise UsageError("--nproc-per-host must be at least 1")
        if request.nproc_per_host > MAX_SLOTS:
            raise UsageError(f"--nproc-per-host must be at most {MAX_SLOTS}, as slots=N is")
        if not _shape(request).is_collective:
            raise UsageError(
                "--nproc-per-host is for collective jobs (torch, paddle without servers)",
                hint="use slots=N in the hosts file to weight parameter-server placement",
            )
        if request.gpus:
            raise UsageError("give either --gpus or --nproc-per-host, not both")
    if len(set(request.gpus)) != len(request.gpus):
        raise UsageError(f"--gpus lists a GPU twice: {','.join(request.gpus)}")
    if request.host_ip is not None:
        try:
            ipaddress.ip_address(request.host_ip)
        except ValueError:
            raise UsageError(
                f'--host-ip "{request.host_ip}" is not an IP address',
                hint="ps-lite binds this address: give an IP, not a host name",
            ) from None


def _scheduler_host(request: JobRequest) -> Host | None:
    """The host --scheduler-host names, if any."""
    if request.scheduler_host is None:
        return None
    return named(request.hosts, request.scheduler_host)


def _shape(request: JobRequest) -> frameworks.Shape:
    servers = request.num_servers if request.num_servers is not None else 0
    return frameworks.shape_of(request.framework, servers, request.chief)


def _run_hosts(request: JobRequest) -> tuple[Host, ...]:
    return request.hosts or (request.local_host,)


def place(request: JobRequest) -> tuple[PlacedTask, ...]:
    """Decide every task's role, index and host (see the module docstring for the rules)."""
    validate(request)
    fw = request.framework
    hosts = _run_hosts(request)
    shape = _shape(request)
    placed: list[PlacedTask] = []
    if shape.needs_scheduler:
        where = _scheduler_host(request) or request.local_host
        placed.append(_placed(Role.SCHEDULER, 0, where, _node_ranks(hosts), 0, 1))
    if shape.is_collective:
        placed += _place_collective(request, hosts)
        return tuple(placed)
    workers = _num_workers_ps(request, hosts)
    servers = (
        request.num_servers
        if request.num_servers is not None
        else frameworks.default_num_servers(fw, workers)
    )
    placed += _round_robin(Role.SERVER, servers, hosts)
    if request.chief:
        placed += _round_robin(Role.CHIEF, 1, hosts)
    if request.gpus:
        placed += _place_per_gpu(workers, hosts, request.gpus)
    else:
        placed += _round_robin(Role.WORKER, workers, hosts, offset=1 if request.chief else 0)
    return tuple(placed)


def _num_workers_ps(request: JobRequest, hosts: Sequence[Host]) -> int:
    if not request.gpus:
        return request.num_workers if request.num_workers is not None else 1
    expected = len(hosts) * len(request.gpus)
    if request.num_workers is not None and request.num_workers != expected:
        raise UsageError(
            f"--gpus {','.join(request.gpus)} on {len(hosts)} host(s) starts {expected} workers, "
            f"but -n says {request.num_workers}",
            hint=f"drop -n, or pass -n {expected}",
        )
    return expected


def _placed(
    role: Role, index: int, host: Host, ranks: Mapping[str, int], local_rank: int, local_size: int
) -> PlacedTask:
    return PlacedTask(
        role=role,
        index=index,
        host=host,
        node_rank=ranks.get(host.key, 0),
        local_rank=local_rank,
        local_size=local_size,
    )


def _node_ranks(hosts: Sequence[Host]) -> dict[str, int]:
    """Each host's position among the job's hosts (the first, if a name repeats)."""
    ranks: dict[str, int] = {}
    for rank, host in enumerate(hosts):
        ranks.setdefault(host.key, rank)
    return ranks


def slot_cycle(hosts: Sequence[Host]) -> list[Host]:
    """Hosts repeated by slots and interleaved: a(2), b(1) -> [a, b, a]."""
    levels: list[list[Host]] = []
    for host in hosts:
        levels.extend([] for _ in range(host.slot_count - len(levels)))
        for level in range(host.slot_count):
            levels[level].append(host)
    return [host for level in levels for host in level]


def _round_robin(
    role: Role, count: int, hosts: Sequence[Host], offset: int = 0
) -> list[PlacedTask]:
    cycle = slot_cycle(hosts)
    chosen = [cycle[(offset + i) % len(cycle)] for i in range(count)]
    totals: dict[str, int] = {}
    for host in chosen:
        totals[host.key] = totals.get(host.key, 0) + 1
    seen: dict[str, int] = {}
    ranks = _node_ranks(hosts)
    result = []
    for index, host in enumerate(chosen):
        local_rank = seen.get(host.key, 0)
        seen[host.key] = local_rank + 1
        result.append(_placed(role, index, host, ranks, local_rank, totals[host.key]))
    return result


def _place_per_gpu(count: int, hosts: Sequence[Host], gpus: Sequence[str]) -> list[PlacedTask]:
    per_host = len(gpus)
    ranks = _node_ranks(hosts)
    result = []
    for index in range(count):
        host = hosts[index // per_host]
        local = index % per_host
        task = _placed(Role.WORKER, index, host, ranks, local, per_host)
        result.append(replace(task, gpu=gpus[local]))
    return result


def _capacity(request: JobRequest, host: Host) -> int:
    if request.gpus:
        return len(request.gpus)
    if request.nproc_per_host is not None:
        return request.nproc_per_host
    return host.slot_count


def _place_collective(request: JobRequest, hosts: Sequence[Host]) -> list[PlacedTask]:
    if request.is_local_only and not request.gpus and request.nproc_per_host is None:
        world = request.num_workers if request.num_workers is not None else 1
        ranks = _node_ranks(hosts)
        return [_placed(Role.WORKER, rank, hosts[0], ranks, rank, world) for rank in range(world)]
    capacity = sum(_capacity(request, host) for host in hosts)
    world = request.num_workers if request.num_workers is not None else capacity
    if world > capacity:
        raise UsageError(
            f"-n {world} ranks do not fit: the hosts provide {capacity} "
            f"({' + '.join(str(_capacity(request, h)) for h in hosts)})",
            hint="add slots=N to hosts-file lines, pass --nproc-per-host N, or lower -n",
        )
    result: list[PlacedTask] = []
    ranks = _node_ranks(hosts)
    for host in hosts:
        take = min(_capacity(request, host), world - len(result))
        if take <= 0:
            break
        for local in range(take):
            task = _placed(Role.WORKER, len(result), host, ranks, local, take)
            if request.gpus:
                task = replace(task, gpu=request.gpus[local])
            result.append(task)
    return result


def ports_needed(request: JobRequest, placed: Sequence[PlacedTask] | None = None) -> dict[str, int]:
    """How many free ports each host must offer (by `Host.key`) before the plan can be made.

    `placed` is `place(request)` when the caller has it already (placing twice costs time at
    100000 tasks)."""
    placed = place(request) if placed is None else placed
    shape = _shape(request)
    needed: dict[str, int] = {}
    if request.port is not None:
        return needed
    if shape.task_ports:
        for task in placed:
            needed[task.host.key] = needed.get(task.host.key, 0) + 1
    elif placed:
        rendezvous_task = placed[0]
        needed[rendezvous_task.host.key] = 1
    return needed


def plan_job(
    request: JobRequest, facts: Facts, placed: Sequence[PlacedTask] | None = None
) -> JobPlan:
    """Turn a request and the facts looked up for it into a complete plan (`placed`: as for
    `ports_needed`)."""
    placed = place(request) if placed is None else placed
    shape = _shape(request)
    where: dict[str, tuple[str, str | None]] = {}  # per host: the address, the interface
    for t in placed:
        if t.host.key not in where:
            where[t.host.key] = (
                _task_address(request, facts, t.host),
                None if request.is_local_only else _interface_of(request, facts, t.host),
            )
    addressed = [
        replace(t, address=where[t.host.key][0], interface=where[t.host.key][1]) for t in placed
    ]
    _check_no_loopback(request, addressed)
    addressed = _assign_endpoints(request, facts, addressed, shape)
    rendezvous: Endpoint | None = None
    if shape.needs_scheduler or request.framework is Framework.TORCH:
        first = addressed[0]
        address = request.host_ip or first.address
        port = request.port if request.port is not None else _free_port(facts, first.host, 0)
        rendezvous = Endpoint(address, port)
        if shape.needs_scheduler:
            addressed[0] = replace(first, address=address)
    ctx = frameworks.JobContext(
        framework=request.framework,
        job_id=facts.job_id,
        tasks=tuple(addressed),
        rendezvous=rendezvous,
        ps_gpus=request.ps_gpus,
        user_sets=frozenset(request.shell_env) | frozenset(request.env),
        restarts=(request.restart_count, request.max_restarts),
    )
    forwarded = frameworks.forwarded_env(request.framework, request.shell_env)
    is_multi_host = not request.is_local_only
    specs = []
    for task in addressed:
        name = frameworks.task_name(request.framework, task.role, task.index)
        env = dict(forwarded)
        env.update(frameworks.task_env(ctx, task))
        env.update(request.env)
        env.update(request.role_env.get(task.role, {}))
        specs.append(
            TaskSpec(
                role=task.role,
                index=task.index,
                name=name,
                host=task.host,
                address=task.address,
                argv=frameworks.task_argv(ctx, task, request.command),
                env=env,
                label=f"{name}@{task.host.display}" if is_multi_host else name,
                log_name=f"{name}.log",
                workdir=_task_workdir(request, task.host),
                endpoint=task.endpoint,
                gpu=task.gpu,
                log_aliases=frameworks.log_aliases(request.framework, task.role, task.index),
            )
        )
    _check_env_fits(specs)
    extra_files: dict[str, str] = {}
    if request.framework is Framework.PADDLE:
        endpoints = "\n".join(ctx.endpoints(Role.WORKER) + ctx.endpoints(Role.SERVER))
        extra_files["endpoints.log"] = f"PADDLE_TRAINER_ENDPOINTS:\n{endpoints}\n"
    return JobPlan(
        notes=_notes(request, specs),
        job_id=facts.job_id,
        framework=request.framework,
        tasks=tuple(specs),
        workdir=request.workdir,
        sync_dst=request.sync_dst,
        rendezvous=rendezvous,
        finish_roles=shape.finish_roles,
        others_exit_by_themselves=shape.others_exit_by_themselves,
        extra_files=extra_files,
    )


def _check_env_fits(specs: Sequence[TaskSpec]) -> None:
    """Linux refuses to start a process with any one environment string of 128 KiB or more
    ("Argument list too long"): say so before anything starts, not once per task after."""
    for spec in specs:
        for key, value in spec.env.items():
            if len(key) + len(value) + 2 > MAX_ENV_STRING:
                raise UsageError(
                    f"{spec.name}'s {key} would be {len(value)} bytes; Linux starts no process "
                    f"with an environment string of {MAX_ENV_STRING} bytes or more",
                    hint="fewer tasks per job (TF and Paddle put every task's address in every "
                    "task's environment), or a shorter --env value",
                )


def _notes(request: JobRequest, specs: Sequence[TaskSpec]) -> tuple[str, ...]:
    """Things a person should know about the plan before it runs."""
    notes = []
    servers = sum(1 for t in specs if t.role is Role.SERVER)
    if request.framework is Framework.TF and servers and not request.chief:
        notes.append(
            "TensorFlow 2's ParameterServerStrategy trains only in a chief: add --chief, "
            "unless the workers themselves train (TF1 style)"
        )
    if (
        any(
            t.env.get("OMP_NUM_THREADS") == "1" and "OMP_NUM_THREADS" not in request.env
            for t in specs
        )
        and request.framework is Framework.TORCH
    ):
        notes.append(
            "OMP_NUM_THREADS=1 for every rank (several ranks share each host), as torchrun "
            "does; set it yourself to tune"
        )
    if request.sync_dst is not None and all(t.host.is_local for t in specs):
        notes.append("--sync-dst-dir: no task runs on another host, so nothing is copied")
    if request.framework is Framework.DMLC and not any(t.role is Role.SERVER for t in specs):
        notes.append(
            "no parameter servers (-s 0): right for rabit/XGBoost-style jobs; MXNet's dist "
            "kvstore, ps-lite and BytePS wait forever for a server, so give them -s N"
        )
    cores = request.local_cores
    local = sum(1 for t in specs if t.host.is_local)
    if cores and local > TASKS_PER_CORE * cores:
        notes.append(
            f"{local} tasks share this machine's {cores} CPU core{'s' if cores != 1 else ''} "
            f"(more than {TASKS_PER_CORE} per core): they will start, but compete for CPU; "
            "spread them over machines with -H, or lower -n/-s"
        )
    return tuple(notes)


def _task_workdir(request: JobRequest, host: Host) -> str:
    return workdir_on(host.is_local, request.workdir, request.sync_dst)


def workdir_on(is_local: bool, workdir: str, sync_dst: str | None) -> str:
    """Where a host's tasks run: remote ones in the synced copy when there is one, local ones
    in the original (launch, doctor's probe and doctor's judgement all ask this)."""
    return sync_dst if sync_dst and not is_local else workdir


def _host_facts(facts: Facts, host: Host) -> HostFacts:
    try:
        return facts.hosts[host.key]
    except KeyError:
        raise DtrainError(f"no address known for host {host.display}") from None


def _task_address(request: JobRequest, facts: Facts, host: Host) -> str:
    """The IP a task's peers reach it at: the interface's address when one is named."""
    host_facts = _host_facts(facts, host)
    interface = request.effective_interface
    if interface is None:
        return host_facts.address
    try:
        return host_facts.interfaces[interface]
    except KeyError:
        have = ", ".join(sorted(host_facts.interfaces)) or "none with IPv4"
        raise DtrainError(
            f"host {host.display} has no IPv4 address on interface {interface}",
            hint=f"its interfaces are: {have}; pass --interface NAME or unset DMLC_INTERFACE",
        ) from None


def _interface_of(request: JobRequest, facts: Facts, host: Host) -> str | None:
    """The name of the host's interface that carries its task address (for GLOO_SOCKET_IFNAME)."""
    if request.effective_interface is not None:
        return request.effective_interface
    host_facts = _host_facts(facts, host)
    for name, address in sorted(host_facts.interfaces.items()):
        if address == host_facts.address:
            return name
    return None


def _check_no_loopback(request: JobRequest, tasks: Sequence[PlacedTask]) -> None:
    addresses = {t.address for t in tasks} | ({request.host_ip} if request.host_ip else set())
    # Hosts that all are this machine (localhost, 127.0.0.1, ::ffff:127.0.0.1): a local job.
    if request.is_local_only or all(is_loopback(a) for a in addresses):
        return
    for address in addresses:
        # A name a dry run could not resolve here is not loopback: launch uses the real IP.
        if is_loopback(address):
            raise UsageError(
                f"the job spans several machines, but {address} is a loopback address "
                "that other machines cannot reach",
                hint="pass --host-ip with this machine's address on the hosts' network, "
                "or --interface NAME",
            )


def _free_port(facts: Facts, host: Host, position: int) -> int:
    ports = _host_facts(facts, host).free_ports
    if position >= len(ports):
        raise DtrainError(f"host {host.display} offered too few free ports ({len(ports)})")
    return ports[position]


def _assign_endpoints(
    request: JobRequest, facts: Facts, tasks: list[PlacedTask], shape: frameworks.Shape
) -> list[PlacedTask]:
    if not shape.task_ports:
        return tasks
    used: dict[str, int] = {}
    result = []
    for task in tasks:
        position = used.get(task.host.key, 0)
        used[task.host.key] = position + 1
        if request.port is not None:
            port = request.port + position
            if port > 65535:
                raise UsageError(f"--port {request.port} leaves no room for {position + 1} tasks")
        else:
            port = _free_port(facts, task.host, position)
        result.append(replace(task, endpoint=Endpoint(task.address, port)))
    return result
