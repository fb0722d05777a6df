"""`dtrain launch`'s flags as what to run (the request planning reads) and how (the launch's
options): where the hosts come from, the environment flags, the ssh and engine options."""

from __future__ import annotations

import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from dtrain.flags import kill_command_for, make_ssh_options
from dtrain.inputfiles import read_setup
from dtrain.launch import DEFAULT_EXCLUDES, joblog
from dtrain.launch.lifecycle import LaunchOptions, with_slurm_hosts
from dtrain.plan import planner
from dtrain.plan.hosts import local_host
from dtrain.plan.mpi import MpiFlags
from dtrain.plan.spec import Framework, Role
from dtrain.transport.machine import local_hostname, usable_cores
from dtrain.where import allocation_from_flags, where_to_run

ROLE_ENV_FLAGS = {
    Role.SCHEDULER: "--env-scheduler",
    Role.SERVER: "--env-server",
    Role.WORKER: "--env-worker",
}


@dataclass(frozen=True)
class LaunchFlags:
    """`dtrain launch`'s flags as click parsed them (one field per option)."""

    num_workers: int | None
    num_servers: int | None
    hostfile: Path | None
    launcher: str
    mpi: MpiFlags
    nodes: int | None
    partition: str | None
    time_limit: str | None
    account: str | None
    gpus_per_node: str | None
    srun_args: Sequence[str]
    framework: str
    scheduler_host: str | None
    host_ip: str | None
    interface: str | None
    port: int | None
    env_all: Sequence[str]
    env_scheduler: Sequence[str]
    env_server: Sequence[str]
    env_worker: Sequence[str]
    allow_env_override: bool
    workdir: Path | None
    log_dir: str
    grace: float
    timeout: float | None
    traceback_timeout: float
    no_stacks: bool
    heartbeat_timeout: float | None
    chief: bool
    ps_gpus: bool
    nproc_per_host: int | None
    gpus: str | None
    sync_dst_dir: str | None
    sync_exclude: Sequence[str]
    setup: Sequence[str]
    setup_file: Path | None
    setup_timeout: float
    remote_python: str
    ssh_config: Path | None
    accept_new_host_keys: bool
    connect_timeout: float | None
    dry_run: bool
    no_preflight: bool
    as_json: bool
    command: tuple[str, ...]


def config_from_flags(flags: LaunchFlags) -> tuple[planner.JobRequest, LaunchOptions]:
    """The flags as what to run (the request planning reads) and how (the launch options)."""
    shell_env = dict(os.environ)
    allocation = allocation_from_flags(
        flags.nodes,
        flags.partition,
        flags.time_limit,
        flags.account,
        flags.gpus_per_node,
        flags.srun_args,
    )
    where = where_to_run(
        flags.launcher, flags.hostfile, shell_env, allocation, can_allocate=True, mpi=flags.mpi
    )
    role_env = {
        role: planner.parse_env_assignments(items, shell_env, ROLE_ENV_FLAGS[role])
        for role, items in (
            (Role.SCHEDULER, flags.env_scheduler),
            (Role.SERVER, flags.env_server),
            (Role.WORKER, flags.env_worker),
        )
        if items
    }
    request = planner.JobRequest(
        command=flags.command,
        local_host=local_host(local_hostname()),
        framework=Framework.parse(flags.framework),
        num_workers=flags.num_workers,
        num_servers=flags.num_servers,
        hosts=where.hosts,
        scheduler_host=flags.scheduler_host,
        host_ip=flags.host_ip,
        interface=flags.interface,
        port=flags.port,
        env=planner.parse_env_assignments(flags.env_all, shell_env, "--env"),
        role_env=role_env,
        allow_env_override=flags.allow_env_override,
        shell_env=shell_env,
        workdir=str((flags.workdir or Path.cwd()).absolute()),
        sync_dst=flags.sync_dst_dir,
        chief=flags.chief,
        nproc_per_host=flags.nproc_per_host,
        gpus=tuple(g.strip() for g in flags.gpus.split(",")) if flags.gpus is not None else (),
        ps_gpus=flags.ps_gpus,
        local_cores=usable_cores(),
    )
    options = LaunchOptions(
        # a dry run writes no logs, so it does not judge --log-dir
        log_root=Path(flags.log_dir) if flags.dry_run else joblog.check_root(flags.log_dir),
        grace_s=flags.grace,
        timeout_s=flags.timeout,
        lease_s=flags.heartbeat_timeout,
        traceback_timeout_s=flags.traceback_timeout,
        ssh=make_ssh_options(
            flags.ssh_config,
            flags.accept_new_host_keys,
            flags.connect_timeout,
            read_setup(flags.setup, flags.setup_file),
            flags.setup_timeout,
        ),
        remote_python=flags.remote_python,
        sync_excludes=(*DEFAULT_EXCLUDES, *flags.sync_exclude),
        preflight=not flags.no_preflight,
        kill_command=kill_command_for(flags.hostfile, flags.ssh_config),
        engine=where.engine,
        take_stacks=not flags.no_stacks,
    )
    if where.hosts and (
        (where.engine is not None and where.engine.owns_hosts) or options.ssh.container is not None
    ):
        request = with_slurm_hosts(request, where.hosts)  # the scheduler on the first host
    if where.note is not None and not flags.dry_run:
        click.echo(f"dtrain: {where.note}", err=True)
    return request, options
