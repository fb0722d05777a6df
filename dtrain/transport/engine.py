"""The engine seam: what starts one agent per host and hands back a link to each.

ssh and this machine's own agent are `AgentGroup`'s defaults; every other engine (Slurm, MPI,
a scheduler's own task starter) is an `Engine` made from the `EngineOptions` a command was
given. `AgentGroup` asks an engine for links and nothing else, so a new engine is a module of
its own plus the line in `where.py` that chooses it. No paramiko, no subprocess here.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any, Protocol

from dtrain.errors import Problem
from dtrain.plan.hosts import Host
from dtrain.transport.link import Link
from dtrain.transport.options import SshOptions


class Engine(Protocol):
    """A running engine: links to agents it started, until `close`."""

    def open_links(self, hosts: Sequence[Host]) -> tuple[dict[str, Link], dict[str, Problem]]:
        """An agent on each of `hosts` (none of them this machine), its link by `Host.key`;
        each host that did not get one, its problem by `Host.key`."""
        ...

    def allocate(self, count: int) -> tuple[Host, ...]:
        """Make an allocation of `count` nodes with an agent on each (engines that can);
        its nodes, in the scheduler's order, are the hosts `open_links` then takes."""
        ...

    def label(self) -> str:
        """What reached the hosts, for people: `Slurm job 7`, `mpirun (Open MPI 4.1.4)`."""
        ...

    def record(self) -> dict[str, Any] | None:
        """job.json's note of what started the agents (the scheduler's ids), or None."""
        ...

    def close(self) -> None:
        """Once every link is closed: the starter ends (or is stopped), nothing left behind."""
        ...


class EngineOptions(Protocol):
    """What a command was told about its engine; starts nothing until `make_engine`."""

    @property
    def allocate_count(self) -> int | None:
        """Nodes to allocate before anything else (`--launcher slurm --nodes N`), or None."""
        ...

    @property
    def owns_hosts(self) -> bool:
        """Whether the scheduler chose the hosts: every task, the dmlc scheduler too, then
        runs on them (the launcher may sit on a login node)."""
        ...

    def make_engine(self, pythons: Sequence[str], ssh: SshOptions) -> Engine:
        """The engine, with the agent run under the first of `pythons` a host has; `ssh`
        is how dtrain was told to reach hosts (a starter that runs ssh itself follows it)."""
        ...

    def starter_command(self, hosts: Sequence[Host]) -> list[str]:
        """The command that would start the agents on `hosts`, for `--dry-run` (the agent's
        code shown as `<agent>`); nothing is run to make it."""
        ...
