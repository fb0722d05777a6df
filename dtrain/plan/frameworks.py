"""What each framework reads: task names, success rules and the environment of every task.

The tracker decides where tasks run and on which ports; this module turns that into the
variables MXNet/ps-lite/BytePS (`dmlc`), TensorFlow (`tf`), PyTorch (`torch`) and PaddlePaddle
(`paddle`) read. Pure.
"""

from __future__ import annotations

import json
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field

from dtrain.plan.spec import Endpoint, Framework, PlacedTask, Role
from dtrain.remote import proto
from dtrain.remote.proto import JOB_ID_VAR, ROLE_VAR, TASK_VAR

# Variables forwarded from the launching shell to every task, by prefix, per framework. Narrow
# on purpose: a bare "TF_" would also carry Terraform's TF_CLI_CONFIG_FILE to every host.
FORWARD_PREFIXES: Mapping[Framework, tuple[str, ...]] = {
    Framework.DMLC: ("DMLC_", "PS_", "BYTEPS_"),
    Framework.TF: (
        "TF_CPP_",
        "TF_ENABLE_",
        "TF_FORCE_",
        "TF_XLA_",
        "TF_GPU_",
        "TF_NUM_",
        "TF_DETERMINISTIC_",
        "TF_GRPC_",
    ),
    Framework.TORCH: ("NCCL_", "GLOO_", "TORCH_"),
    Framework.PADDLE: ("FLAGS_", "PADDLE_", "GLOG_"),
}

# Variables dtrain computes, spelled once in `proto` (the agent drops them all from what a task
# inherits); a stale value in the launching shell is never forwarded either.
MANAGED_VARS: Mapping[Framework, frozenset[str]] = {
    framework: frozenset(proto.MANAGED_VARS[framework.value]) for framework in Framework
}


@dataclass(frozen=True, slots=True)
class Shape:
    """How a framework's job is laid out and when it is done.

    Parameter-server frameworks place servers and workers round-robin; collective ones fill
    each host's slots in order so ranks on one host are contiguous.
    """

    is_collective: bool
    finish_roles: frozenset[Role]
    others_exit_by_themselves: bool
    needs_scheduler: bool
    task_ports: bool


def shape_of(framework: Framework, num_servers: int, has_chief: bool) -> Shape:
    if framework is Framework.DMLC:
        return Shape(
            is_collective=False,
            finish_roles=frozenset({Role.WORKER}),
            others_exit_by_themselves=True,
            needs_scheduler=True,
            task_ports=False,
        )
    if framework is Framework.TF:
        # TF2 parameter-server jobs: the chief drives training while ps and worker tasks serve
        # forever (`server.join()`); TF1-style jobs without a chief finish when workers do.
        return Shape(
            is_collective=False,
            finish_roles=frozenset({Role.CHIEF} if has_chief else {Role.WORKER}),
            others_exit_by_themselves=False,
            needs_scheduler=False,
            task_ports=True,
        )
    if framework is Framework.PADDLE:
        return Shape(
            is_collective=num_servers == 0,
            finish_roles=frozenset({Role.WORKER}),
            others_exit_by_themselves=False,
            needs_scheduler=False,
            task_ports=True,
        )
    return Shape(
        is_collective=True,
        finish_roles=frozenset({Role.WORKER}),
        others_exit_by_themselves=True,
        needs_scheduler=False,
        task_ports=False,
    )


def default_num_servers(framework: Framework, num_workers: int) -> int:
    """launch.py's default for dmlc (as many servers as workers); one ps for TF; none else."""
    if framework is Framework.DMLC:
        return num_workers
    if framework is Framework.TF:
        return 1
    return 0


def task_name(framework: Framework, role: Role, index: int) -> str:
    if role is Role.SCHEDULER:
        return "scheduler"
    if role is Role.SERVER and framework is Framework.TF:
        return f"ps.{index}"
    return f"{role.value}.{index}"


def log_aliases(framework: Framework, role: Role, index: int) -> tuple[str, ...]:
    """Paddle users look for `workerlog.N` and `serverlog.N`; give them those names too."""
    if framework is Framework.PADDLE and role in (Role.WORKER, Role.SERVER):
        return (f"{role.value}log.{index}",)
    return ()


def forwarded_env(framework: Framework, environ: Mapping[str, str]) -> dict[str, str]:
    """The launching shell's tuning variables that every task should see."""
    prefixes = FORWARD_PREFIXES[framework]
    managed = MANAGED_VARS[framework]
    return {
        key: value
        for key, value in sorted(environ.items())
        if key.startswith(prefixes) and key not in managed
    }


@dataclass(frozen=True, slots=True)
class JobContext:
    """The placed job, addresses and ports decided: everything env builders read.

    What every task's environment shares (each role's tasks, their joined endpoints, how many
    hosts they span) is computed once here, so building all the environments stays linear.
    """

    framework: Framework
    job_id: str
    tasks: tuple[PlacedTask, ...]
    rendezvous: Endpoint | None
    ps_gpus: bool = False
    user_sets: frozenset[str] = frozenset()
    restarts: tuple[int, int] = (0, 0)  # this attempt's restart count, and --max-restarts
    by_role: Mapping[Role, tuple[PlacedTask, ...]] = field(init=False, repr=False)
    joined: Mapping[Role, str] = field(init=False, repr=False)  # endpoints, comma-separated
    node_counts: Mapping[Role, int] = field(init=False, repr=False)
    tf_cluster: str = field(init=False, repr=False)  # TF_CONFIG's "cluster", as JSON

    def __post_init__(self) -> None:
        by_role: dict[Role, list[PlacedTask]] = {role: [] for role in Role}
        for task in self.tasks:
            by_role[task.role].append(task)
        frozen = {role: tuple(tasks) for role, tasks in by_role.items()}
        endpoints = {role: [str(t.endpoint) for t in tasks] for role, tasks in frozen.items()}
        cluster = {
            _tf_type(role): endpoints[role]
            for role in (Role.CHIEF, Role.WORKER, Role.SERVER)
            if endpoints[role]
        }
        set_ = object.__setattr__  # frozen: derived fields are set once, here
        set_(self, "by_role", frozen)
        set_(self, "joined", {role: ",".join(e) for role, e in endpoints.items()})
        set_(self, "node_counts", {r: len({t.node_rank for t in ts}) for r, ts in frozen.items()})
        set_(self, "tf_cluster", json.dumps(cluster, separators=(",", ":")))

    def of_role(self, role: Role) -> tuple[PlacedTask, ...]:
        return self.by_role[role]

    def endpoints(self, role: Role) -> list[str]:
        return [str(task.endpoint) for task in self.by_role[role]]


def task_env(ctx: JobContext, task: PlacedTask) -> dict[str, str]:
    """The framework's variables for one task, plus dtrain's own job tag."""
    builders = {
        Framework.DMLC: _dmlc_env,
        Framework.TF: _tf_env,
        Framework.TORCH: _torch_env,
        Framework.PADDLE: _paddle_env,
    }
    env = builders[ctx.framework](ctx, task)
    if task.gpu is not None:
        env["CUDA_VISIBLE_DEVICES"] = task.gpu
    env[JOB_ID_VAR] = ctx.job_id
    env[TASK_VAR] = task_name(ctx.framework, task.role, task.index)
    if ctx.restarts[1]:
        env.update(restart_env(ctx.framework, *ctx.restarts))
    return env


RESTART_COUNT_VAR = "DTRAIN_RESTART_COUNT"
MAX_RESTARTS_VAR = "DTRAIN_MAX_RESTARTS"


def restart_env(framework: Framework, restart_count: int, max_restarts: int) -> dict[str, str]:
    """Which attempt this is, the same for every task, so a script knows to resume from its
    checkpoint; torch scripts read torchrun's names for it (TORCHELASTIC_*)."""
    env = {RESTART_COUNT_VAR: str(restart_count), MAX_RESTARTS_VAR: str(max_restarts)}
    if framework is Framework.TORCH:
        env["TORCHELASTIC_RESTART_COUNT"] = str(restart_count)
        env["TORCHELASTIC_MAX_RESTARTS"] = str(max_restarts)
    return env


def task_argv(ctx: JobContext, task: PlacedTask, command: Sequence[str]) -> tuple[str, ...]:
    """The user's command, untouched except TF's documented placeholders in TF jobs."""
    if ctx.framework is not Framework.TF:
        return tuple(command)
    values = {
        "{ps_hosts}": ctx.joined[Role.SERVER],
        "{worker_hosts}": ctx.joined[Role.WORKER],
        "{chief_hosts}": ctx.joined[Role.CHIEF],
        "{job_name}": _tf_type(task.role),
        "{task_index}": str(task.index),
    }
    argv = []
    for arg in command:
        if "{" in arg:
            for placeholder, value in values.items():
                arg = arg.replace(placeholder, value)
        argv.append(arg)
    return tuple(argv)


def _dmlc_env(ctx: JobContext, task: PlacedTask) -> dict[str, str]:
    assert ctx.rendezvous is not None, "dmlc jobs always have a scheduler"
    env = {
        ROLE_VAR: task.role.value,
        "DMLC_PS_ROOT_URI": ctx.rendezvous.address,
        "DMLC_PS_ROOT_PORT": str(ctx.rendezvous.port),
        "DMLC_NUM_WORKER": str(len(ctx.by_role[Role.WORKER])),
        "DMLC_NUM_SERVER": str(len(ctx.by_role[Role.SERVER])),
        "DMLC_NODE_HOST": task.address,
    }
    if task.role is Role.SERVER:
        env["DMLC_SERVER_ID"] = str(task.index)
    elif task.role is Role.WORKER:
        env["DMLC_WORKER_ID"] = str(task.index)
    return env


def _tf_type(role: Role) -> str:
    return {Role.SERVER: "ps", Role.WORKER: "worker", Role.CHIEF: "chief"}[role]


def _tf_env(ctx: JobContext, task: PlacedTask) -> dict[str, str]:
    # As json.dumps({"cluster": ..., "task": ...}) writes it, with the shared part built once.
    this = json.dumps({"type": _tf_type(task.role), "index": task.index}, separators=(",", ":"))
    env = {"TF_CONFIG": f'{{"cluster":{ctx.tf_cluster},"task":{this}}}'}
    if task.role is Role.SERVER and not ctx.ps_gpus:
        env["CUDA_VISIBLE_DEVICES"] = ""
    return env


def _torch_env(ctx: JobContext, task: PlacedTask) -> dict[str, str]:
    assert ctx.rendezvous is not None, "torch jobs always have a master"
    workers = len(ctx.by_role[Role.WORKER])
    nodes = ctx.node_counts[Role.WORKER]
    env = {
        "MASTER_ADDR": ctx.rendezvous.address,
        "MASTER_PORT": str(ctx.rendezvous.port),
        "RANK": str(task.index),
        "WORLD_SIZE": str(workers),
        "LOCAL_RANK": str(task.local_rank),
        "LOCAL_WORLD_SIZE": str(task.local_size),
        "GROUP_RANK": str(task.node_rank),
        "GROUP_WORLD_SIZE": str(nodes),
        "ROLE_RANK": str(task.index),
        "ROLE_WORLD_SIZE": str(workers),
        "ROLE_NAME": "default",
    }
    # As torchrun does: several ranks on one host each running a full OpenMP pool thrash.
    if task.local_size > 1 and "OMP_NUM_THREADS" not in ctx.user_sets:
        env["OMP_NUM_THREADS"] = "1"
    # gloo binds the address the host name resolves to, often 127.0.1.1 on Debian: name the
    # interface that carries the task's address instead.
    if task.interface is not None and "GLOO_SOCKET_IFNAME" not in ctx.user_sets:
        env["GLOO_SOCKET_IFNAME"] = task.interface
    return env


def _paddle_env(ctx: JobContext, task: PlacedTask) -> dict[str, str]:
    trainers = ctx.by_role[Role.WORKER]
    servers = ctx.by_role[Role.SERVER]
    assert task.endpoint is not None, "paddle tasks always have an endpoint"
    if not servers:
        env = {
            "PADDLE_TRAINER_ID": str(task.index),
            "PADDLE_TRAINERS_NUM": str(len(trainers)),
            "PADDLE_TRAINER_ENDPOINTS": ctx.joined[Role.WORKER],
            "PADDLE_CURRENT_ENDPOINT": str(task.endpoint),
            "PADDLE_LOCAL_RANK": str(task.local_rank),
            "PADDLE_RANK_IN_NODE": str(task.local_rank),
            "PADDLE_LOCAL_SIZE": str(task.local_size),
            "PADDLE_NNODES": str(ctx.node_counts[Role.WORKER]),
            # The collective store lives here; without it Paddle uses the first endpoint too,
            # but says "trainer_endpoints should not be null" when given only MASTER_*.
            "PADDLE_MASTER": str(trainers[0].endpoint),
        }
        if task.gpu is not None:
            env["FLAGS_selected_gpus"] = task.gpu
        elif "PADDLE_DISTRI_BACKEND" not in ctx.user_sets:
            # Paddle's "auto" backend is NCCL-only: CPU collectives need gloo, as its launcher sets.
            env["PADDLE_DISTRI_BACKEND"] = "gloo"
        return env
    role = "PSERVER" if task.role is Role.SERVER else "TRAINER"
    env = {
        "TRAINING_ROLE": role,
        "PADDLE_ROLE": role,
        "PADDLE_PSERVERS_IP_PORT_LIST": ctx.joined[Role.SERVER],
        "PADDLE_TRAINER_ENDPOINTS": ctx.joined[Role.WORKER],
        "PADDLE_TRAINERS_NUM": str(len(trainers)),
        "POD_IP": task.address,
        "PADDLE_PORT": str(task.endpoint.port),
    }
    if task.role is Role.SERVER:
        env["PADDLE_PSERVER_ID"] = str(task.index)
    else:
        env["PADDLE_TRAINER_ID"] = str(task.index)
        if task.gpu is not None:
            env["FLAGS_selected_gpus"] = task.gpu
    return env
