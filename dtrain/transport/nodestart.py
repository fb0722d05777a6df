"""PBS/Torque's `pbsdsh` and LSF's `blaunch`: a scheduler's own command starts the agent on each
host of the job, and each agent connects back.

Tasks started this way run under the scheduler's daemon on their host: they are accounted to
the job and die with `qdel`/`bkill`, which tasks started over ssh escape. One starter process
per host (`pbsdsh -h HOST`, `blaunch HOST`), each with the key, the launcher's address and the
host's place in the job's host list in its environment, which both commands hand to the task.
"""

from __future__ import annotations

import os
import shutil
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import Any

from dtrain.errors import DtrainError
from dtrain.plan.hosts import Host
from dtrain.plan.nodefile import Scheduler
from dtrain.transport.bootstrap import AGENT_PYTHONS
from dtrain.transport.connectback import (
    ORDER_VAR,
    QUIET_NOTE_S,
    AgentIdentity,
    ConnectBack,
    ConnectBackEngine,
    StarterProcess,
    agent_command,
)
from dtrain.transport.engine import Engine
from dtrain.transport.options import DEFAULT_CONNECT_TIMEOUT_S, SshOptions
from dtrain.transport.routes import address_towards

STARTUP_MARGIN_S = 50.0  # the scheduler's daemons start each task: more than an ssh login
IDENTITY = AgentIdentity()  # each agent's place comes from ORDER_VAR: one starter per host


def starter_path(scheduler: Scheduler) -> str | None:
    """The scheduler's per-host starter on PATH, or None (the agents then start over ssh)."""
    return shutil.which(scheduler.starter)


def starter_argv(scheduler: Scheduler, path: str, host: str, command: Sequence[str]) -> list[str]:
    """`pbsdsh -h HOST -- CMD` (Torque; OpenPBS names the host by index with -n) or
    `blaunch HOST CMD`: `command` once on `host`, under the scheduler's daemon there."""
    if scheduler is Scheduler.PBS:
        return [path, "-h", host, "--", *command]
    return [path, host, *command]


@dataclass(frozen=True)
class NodeStarterOptions:
    """Inside a PBS or LSF job: its hosts' agents from the scheduler's own starter."""

    scheduler: Scheduler
    starter: str  # the path of pbsdsh or blaunch
    job_id: str
    on_note: Callable[[str], None] | None = field(default=None, compare=False, repr=False)

    @property
    def allocate_count(self) -> int | None:
        return None

    @property
    def owns_hosts(self) -> bool:
        return True

    def make_engine(self, pythons: Sequence[str], ssh: SshOptions) -> Engine:
        return NodeStarterEngine(self, pythons, ssh)

    def starter_command(self, hosts: Sequence[Host]) -> list[str]:
        first = hosts[0].name if hosts else "HOST"
        command = agent_command(AGENT_PYTHONS, IDENTITY)
        return starter_argv(self.scheduler, self.starter, f"{first} (one per host)", command)


@dataclass(frozen=True)
class NodeStarter:
    """One starter process per host; the i-th names the i-th host asked for."""

    options: NodeStarterOptions
    names_by_order = True
    identity = IDENTITY

    @property
    def name(self) -> str:
        return os.path.basename(self.options.starter)

    def processes(
        self, command: Sequence[str], nodes: Sequence[str] | None, count: int, address: str
    ) -> list[StarterProcess]:
        if nodes is None:
            raise DtrainError(f"{self.name} cannot make an allocation")
        options = self.options
        return [
            StarterProcess(
                starter_argv(options.scheduler, options.starter, node, command),
                {ORDER_VAR: str(order)},
                node,
            )
            for order, node in enumerate(nodes)
        ]

    def note(self, line: str) -> str | None:
        return None

    def quiet_note(self, nodes: Sequence[str] | None, timeout_s: float | None) -> str | None:
        limit = f"; waiting up to {timeout_s:.0f}s" if timeout_s is not None else ""
        return (
            f"{self.name} has not started dtrain's agents on {len(nodes or ())} host(s) "
            f"after {QUIET_NOTE_S:.0f}s{limit}"
        )

    def ended_why(self, job_id: str, returncodes: Sequence[int | None]) -> str | None:
        ended = [code for code in returncodes if code is not None]
        if not ended or all(code == 0 for code in ended):
            return None
        return (
            f"{self.name} ended with {ended[0]} while the job ran "
            f"({self.options.scheduler.value} job {job_id or self.options.job_id} ended?)"
        )


class NodeStarterEngine(ConnectBackEngine):
    """The agents of a PBS or LSF job's hosts, each from the scheduler's own starter."""

    def __init__(
        self, options: NodeStarterOptions, pythons: Sequence[str], ssh: SshOptions
    ) -> None:
        super().__init__(pythons, options.on_note)
        self.options = options
        self.ssh = ssh
        self.startup_timeout_s = (ssh.connect_timeout_s or DEFAULT_CONNECT_TIMEOUT_S) + (
            STARTUP_MARGIN_S
        )

    def new_step(self, nodes: Sequence[str] | None, count: int) -> ConnectBack:
        return self.connect_back(NodeStarter(self.options), nodes, count)

    def listen_address(self, nodes: Sequence[str]) -> str:
        return address_towards(nodes, self.ssh.config_file)

    def label(self) -> str:
        return f"{self.options.scheduler.value} job {self.options.job_id} ({self.options.starter})"

    def record(self) -> dict[str, Any] | None:
        scheduler = self.options.scheduler
        return {"name": scheduler.value.lower(), "job_id": self.options.job_id}
