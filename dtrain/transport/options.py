"""How to reach remote hosts: options read by `dtrain.transport.ssh`.

Kept apart from ssh so that planning and the CLI need no paramiko."""

from __future__ import annotations

import os
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from dtrain.plan.hosts import Host
    from dtrain.transport.engine import Engine

from dtrain.containers import ContainerSpec

DEFAULT_CONNECT_TIMEOUT_S = 10.0
DEFAULT_SETUP_TIMEOUT_S = 300.0


@dataclass(frozen=True)
class SshOptions:
    """How to reach remote hosts (ssh config file, host keys, connect timeout), what each
    host's agent runs first (`--setup`), and the container it runs in (`--container`)."""

    config_file: str | None = None
    accept_new_host_keys: bool = False
    connect_timeout_s: float | None = None
    user_config_dir: str = field(default_factory=lambda: os.path.expanduser("~/.ssh"))
    # shell commands each host's agent runs in $SHELL before it starts anything (`--setup`)
    setup: tuple[str, ...] = ()
    setup_timeout_s: float = DEFAULT_SETUP_TIMEOUT_S
    container: ContainerSpec | None = None


@dataclass(frozen=True)
class SlurmOptions:
    """How to start the agents through Slurm: in this shell's allocation (`nodes` None), or
    in one srun makes for `nodes` nodes with the user's own srun options."""

    nodes: int | None = None
    srun_args: tuple[str, ...] = ()
    job_name: str = "dtrain"
    # where srun's lines that say it waits go, as they come (the queue, a suspended job)
    on_note: Callable[[str], None] | None = field(default=None, compare=False, repr=False)

    @property
    def allocate_count(self) -> int | None:
        return self.nodes

    @property
    def owns_hosts(self) -> bool:
        return True

    def make_engine(self, pythons: Sequence[str], ssh: SshOptions) -> Engine:
        from dtrain.transport.slurm import SlurmEngine

        return SlurmEngine(self, pythons)

    def starter_command(self, hosts: Sequence[Host]) -> list[str]:
        from dtrain.transport.slurm import starter_command

        return starter_command(self, hosts)
