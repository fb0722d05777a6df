"""Which hosts a command acts on, and how their agents start: -H, --launcher and the Slurm
allocation or Grid Engine job this shell may be in. The one place an engine is chosen."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from dtrain.errors import UsageError
from dtrain.flags import container_from_flags
from dtrain.inputfiles import InputFile, read_hosts, read_text_input
from dtrain.plan import mpi as plan_mpi
from dtrain.plan import nodefile
from dtrain.plan import sge as plan_sge
from dtrain.plan import slurm as plan_slurm
from dtrain.plan.hosts import Host
from dtrain.plan.mpi import NO_MPI, MpiFlags
from dtrain.transport.engine import EngineOptions
from dtrain.transport.options import SlurmOptions


@dataclass(frozen=True)
class Where:
    """Which hosts a command acts on, and the engine that starts their agents (None: ssh,
    and this machine's own)."""

    hosts: tuple[Host, ...]
    engine: EngineOptions | None = None
    note: str | None = None  # `inside Slurm job 1234: 4 nodes h[1-4]`

    @property
    def slurm(self) -> SlurmOptions | None:
        """The Slurm options, when Slurm is the engine."""
        return self.engine if isinstance(self.engine, SlurmOptions) else None


def srun_note(line: str) -> None:
    """That srun waits (its own lines, or dtrain's word when it is silent), on stderr as it
    happens, not only in the error once the agents' wait ends: stdout stays the result."""
    click.echo(f"dtrain: {line}", err=True)


def where_to_run(
    launcher: str,
    hostfile: Path | None,
    env: Mapping[str, str],
    allocation: SlurmOptions | None = None,
    can_allocate: bool = False,
    mpi: MpiFlags = NO_MPI,
) -> Where:
    """-H, --launcher and the Slurm allocation this shell may be in, as hosts and an engine.

    Inside an allocation with no -H, its nodes are the hosts; a node list that cannot be
    expanded is an error, never a fall back to this machine alone. Only launch has --nodes
    (`can_allocate`): the other commands act on an allocation that exists. A container
    (`--container`, `--image`) is reached over ssh or on this machine, not yet through an engine.
    """
    container = container_from_flags()
    where = _where_to_run(launcher, hostfile, env, allocation, can_allocate, mpi)
    if container is not None and where.engine is not None:
        raise UsageError(
            "--container and --image run over ssh or on this machine: not yet under Slurm, "
            "Grid Engine or mpirun",
            hint="pass -H hosts (the allocation's nodes, by the names ssh reaches them at); "
            "the README's Containers section says why",
        )
    return where


def _where_to_run(
    launcher: str,
    hostfile: Path | None,
    env: Mapping[str, str],
    allocation: SlurmOptions | None,
    can_allocate: bool,
    mpi: MpiFlags,
) -> Where:
    if allocation is not None and launcher != "slurm":
        raise UsageError(
            "--nodes and the other Slurm options make an allocation",
            hint="add --launcher slurm, or drop them",
        )
    if launcher == "slurm" and hostfile is not None:
        raise UsageError(
            "-H and --launcher slurm: Slurm chooses the nodes",
            hint="drop -H to run on the allocation's nodes, or pass --launcher ssh",
        )
    if launcher == "sge" and hostfile is not None:
        raise UsageError(
            "-H and --launcher sge: the Grid Engine job's PE_HOSTFILE names the hosts",
            hint="drop -H to run on the job's hosts, or pass --launcher ssh",
        )
    if launcher != "mpi" and mpi != NO_MPI:
        flag = "--mpirun" if mpi.mpirun is not None else "--mpi-arg"
        raise UsageError(f"{flag} is for --launcher mpi", hint="add --launcher mpi, or drop it")
    if launcher == "mpi":
        return _through_mpi(hostfile, mpi, env)
    if launcher == "ssh" and hostfile is None:
        raise UsageError("--launcher ssh needs -H hosts", hint="pass -H FILE (see hosts.example)")
    if launcher == "local" or (launcher == "auto" and hostfile is not None) or launcher == "ssh":
        return Where(read_hosts(hostfile) if launcher != "local" else ())
    if allocation is not None:
        return Where((), allocation)
    if launcher == "sge" or (
        launcher == "auto" and plan_sge.in_job(env) and not plan_slurm.in_allocation(env)
    ):
        return sge_job(env, required=launcher == "sge")
    if launcher in ("pbs", "lsf") or (launcher == "auto" and not plan_slurm.in_allocation(env)):
        job = nodefile.current_job(env)
        if job is not None and launcher in ("auto", job.scheduler.name.lower()):
            return _in_node_file_job(job)
        if launcher != "auto":
            raise UsageError(
                f"--launcher {launcher} outside a {launcher.upper()} job "
                f"(no ${nodefile.Scheduler[launcher.upper()].file_var})",
                hint="run dtrain inside the job (its batch script, or an interactive job), "
                "or pass -H hosts",
            )
    if not plan_slurm.in_allocation(env):
        if launcher == "slurm":
            inside = "run dtrain inside the allocation (salloc, sbatch, srun --pty bash)"
            raise UsageError(
                "--launcher slurm outside a Slurm allocation",
                hint=f"pass --nodes N to make one, or {inside}"
                if can_allocate
                else f"{inside}, or pass -H hosts",
            )
        return Where(())
    from dtrain.transport import slurm

    found = slurm.current_allocation(env)
    summary = f"{len(found.nodes)} node{'s' if len(found.nodes) != 1 else ''}"
    note = f"inside Slurm job {found.job_id}: {summary} {env[plan_slurm.NODELIST_VAR]}"
    return Where(found.hosts(), SlurmOptions(on_note=srun_note), note)


def _in_node_file_job(job: nodefile.Job) -> Where:
    """Inside a PBS or LSF job: the hosts and slots of its node file; the agents from pbsdsh
    or blaunch, else over ssh, said in one line (those tasks escape the job's accounting)."""
    scheduler = job.scheduler
    hosts = _node_file_hosts(job)
    from dtrain.transport import nodestart

    slots = sum(host.slot_count for host in hosts)
    where = (
        f"inside {scheduler.value} job {job.job_id or '?'}: {len(hosts)} host(s), {slots} slot(s)"
    )
    starter = nodestart.starter_path(scheduler)
    if starter is None:
        note = (
            f"{where}; no {scheduler.starter} on PATH: the agents start over ssh, and their "
            f"tasks escape {scheduler.value}'s accounting (deleting the job does not stop them)"
        )
        return Where(hosts, None, note)
    engine = nodestart.NodeStarterOptions(scheduler, starter, job.job_id, on_note=srun_note)
    return Where(hosts, engine, f"{where}; agents through {scheduler.starter}")


def _node_file_hosts(job: nodefile.Job) -> tuple[Host, ...]:
    scheduler = job.scheduler
    source = InputFile(
        Path(job.node_file),
        f"${scheduler.file_var}",
        "node file",
        f"run dtrain inside the {scheduler.value} job that wrote it, or pass -H hosts",
    )
    return nodefile.parse_node_file(read_text_input(source), job.node_file)


def _through_mpi(hostfile: Path | None, flags: MpiFlags, env: Mapping[str, str]) -> Where:
    """`--launcher mpi`: the hosts file's hosts (or, with no -H, those of the Slurm, PBS or
    LSF job this shell is in: the site's mpirun then starts the agents through the scheduler),
    their agents from one mpirun (found and recognised here: a missing or unknown mpirun is
    one line, nothing started)."""
    note = None
    if hostfile is not None:
        hosts = read_hosts(hostfile)
    elif plan_slurm.in_allocation(env):
        from dtrain.transport import slurm

        found = slurm.current_allocation(env)
        hosts, note = found.hosts(), f"inside Slurm job {found.job_id}: {found.summary()}"
    elif (job := nodefile.current_job(env)) is not None:
        hosts = _node_file_hosts(job)
        note = f"inside {job.scheduler.value} job {job.job_id or '?'}: {len(hosts)} host(s)"
    else:
        raise UsageError(
            "--launcher mpi needs -H hosts",
            hint="pass -H FILE (see hosts.example), or run inside a Slurm, PBS or LSF job",
        )
    plan_mpi.check_hosts([host for host in hosts if not host.is_local])
    from dtrain.transport import mpi

    mpirun = mpi.find_mpirun(flags.mpirun)
    options = mpi.MpiOptions(mpirun, flags.args, hostfile is None, on_note=srun_note)
    return Where(hosts, options, f"{note}; agents through {mpirun.label}" if note else None)


def sge_job(env: Mapping[str, str], required: bool) -> Where:
    """The Grid Engine PE job this shell runs in: its hosts, one qrsh -inherit each. A job
    without a PE (one slot on one host) is this machine alone, unless --launcher sge."""
    if not required and not env.get(plan_sge.HOSTFILE_VAR):
        serial = env.get(plan_sge.JOB_ID_VAR)
        note = f"inside Grid Engine job {serial} without a parallel environment: this machine only"
        return Where((), note=note)
    if not plan_sge.in_job(env):
        raise UsageError(
            "--launcher sge outside a Grid Engine job",
            hint=f"{plan_sge.SUBMIT_HINT} with dtrain launch in job.sh (README: Grid Engine), "
            "or pass -H hosts",
        )
    from dtrain.transport import sge

    job = sge.current_job(env)
    options = sge.SgeOptions(job.job_id, job.pe, on_note=srun_note)
    return Where(job.hosts, options, f"inside Grid Engine job {job.job_id}: {job.summary()}")


def allocation_from_flags(
    nodes: int | None,
    partition: str | None,
    time_limit: str | None,
    account: str | None,
    gpus_per_node: str | None,
    srun_args: Sequence[str],
) -> SlurmOptions | None:
    """The srun options of `--launcher slurm --nodes N`, or None when none was given."""
    named = [
        (f"--partition={partition}", partition),
        (f"--time={time_limit}", time_limit),
        (f"--account={account}", account),
        (f"--gpus-per-node={gpus_per_node}", gpus_per_node),
    ]
    args = (*(arg for arg, value in named if value is not None), *srun_args)
    if nodes is None:
        if args:
            raise UsageError(
                f"{args[0].split('=')[0]} is for the allocation --nodes N makes",
                hint="add --launcher slurm --nodes N",
            )
        return None
    return SlurmOptions(nodes=nodes, srun_args=args, on_note=srun_note)
