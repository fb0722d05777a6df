"""Which hosts a command acts on, and how their agents start: -H, --launcher and the Slurm
allocation this shell may be in."""

from __future__ import annotations

from collections.abc import Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

import click

from dtrain.errors import UsageError
from dtrain.flags import container_from_flags
from dtrain.inputfiles import read_hosts
from dtrain.plan import slurm as plan_slurm
from dtrain.plan.hosts import Host
from dtrain.transport.options import SlurmOptions


@dataclass(frozen=True)
class Where:
    """Which hosts a command acts on, and whether their agents start through Slurm."""

    hosts: tuple[Host, ...]
    slurm: SlurmOptions | None = None
    note: str | None = None  # `inside Slurm job 1234: 4 nodes h[1-4]`


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
) -> Where:
    """-H, --launcher and the Slurm allocation this shell may be in, as hosts and an engine.

    Inside an allocation with no -H, its nodes are the hosts; a node list that cannot be
    expanded is an error, never a fall back to this machine alone. Only launch has --nodes
    (`can_allocate`): the other commands act on an allocation that exists. A container
    (`--container`, `--image`) is reached over ssh only, for now.
    """
    container = container_from_flags()
    where = _where_to_run(launcher, hostfile, env, allocation, can_allocate)
    if container is not None and (where.slurm is not None or not where.hosts):
        engine = "through Slurm" if where.slurm is not None else "on this machine"
        raise UsageError(
            f"--container and --image run over ssh only: not yet {engine}",
            hint="pass -H hosts (this machine too, by the name ssh reaches it at); "
            "the README's Containers section says why",
        )
    return where


def _where_to_run(
    launcher: str,
    hostfile: Path | None,
    env: Mapping[str, str],
    allocation: SlurmOptions | None,
    can_allocate: bool,
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
    if launcher == "ssh" and hostfile is None:
        raise UsageError("--launcher ssh needs -H hosts", hint="pass -H FILE (see hosts.example)")
    if launcher == "local" or (launcher == "auto" and hostfile is not None) or launcher == "ssh":
        return Where(read_hosts(hostfile) if launcher != "local" else ())
    if allocation is not None:
        return Where((), allocation)
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
