"""The Slurm engine: one job step starts an agent on every node, and each agent connects back.

srun gives a step's tasks no stream of their own (its stdin goes to task 0 only), so the
agents connect back to the launcher (`dtrain.transport.connectback`: the listener, the key,
the handshake). What is Slurm's own is here: the one `srun` that runs an agent on each node,
the allocation this shell is in (scontrol), the address its nodes reach the launcher at, what
srun's lines say while it waits, and why Slurm ended a job.
"""

from __future__ import annotations

import contextlib
import logging
import os
import shutil
import socket
import subprocess
import time
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from dtrain.errors import ConnectError, DtrainError, UsageError
from dtrain.plan import slurm
from dtrain.transport import connectback
from dtrain.transport.bootstrap import AGENT_PYTHONS
from dtrain.transport.connectback import (
    CONNECT_VAR,
    KEY_VAR,
    QUIET_NOTE_S,
    AgentIdentity,
    ConnectBack,
    ConnectBackEngine,
    StarterProcess,
)
from dtrain.transport.machine import route_address

if TYPE_CHECKING:
    from dtrain.plan.hosts import Host
    from dtrain.transport.options import SlurmOptions

__all__ = ["CONNECT_VAR", "KEY_VAR", "SlurmEngine", "SlurmStep", "agent_command"]

logger = logging.getLogger(__name__)

STARTUP_TIMEOUT_S = 120.0  # srun's own retries for a busy node take up to a minute
SCONTROL_TIMEOUT_S = 30.0

# What srun sets for the agents' own step: each task gets dtrain's ranks, and a framework that
# reads Slurm's (Lightning's SLURMEnvironment reads SLURM_NTASKS and SLURM_PROCID) must not
# take the agent's place in its step for its own. The job's SLURM_JOB_* stay.
STEP_VARS = (
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_TASK_PID",
    "SLURM_GTIDS",
    "SLURM_STEPID",
)
IDENTITY = AgentIdentity(
    name_vars=("SLURMD_NODENAME",),
    order_vars=("SLURM_NODEID",),
    job_var="SLURM_JOB_ID",
    step_var="SLURM_STEP_ID",
    scrub_vars=STEP_VARS,
    scrub_prefixes=("SLURM_STEP_",),
)


def agent_command(pythons: Sequence[str]) -> list[str]:
    """The agent as srun runs it on each node (`connectback.agent_command`)."""
    return connectback.agent_command(pythons, IDENTITY)


# ---- the allocation ---------------------------------------------------------------------------


def _slurm_command(name: str) -> str:
    """The command's path. Missing, it is this machine's environment, not the user's flags:
    exit 3, as a command missing on a host and as an srun that fails (the README's table)."""
    path = shutil.which(name)
    if path is None:
        raise DtrainError(
            f"{name} is not on PATH: dtrain starts Slurm jobs with Slurm's own commands",
            hint="run dtrain where the Slurm client commands work (srun, scontrol), "
            "or pass --launcher ssh -H hosts",
        )
    return path


def _scontrol(*args: str) -> subprocess.CompletedProcess[str]:
    """`scontrol ARGS`, bounded; a missing or hung scontrol is an error that says so."""
    try:
        return subprocess.run(
            [_slurm_command("scontrol"), *args],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ConnectError(
            f"scontrol {' '.join(args)} did not answer within {SCONTROL_TIMEOUT_S:.0f}s",
            hint="check that the Slurm controller is up (scontrol ping)",
        ) from None


def _records(text: str) -> list[dict[str, str]]:
    """`scontrol -o show ...`: one record a line, `Key=Value` words."""
    return [
        dict(word.split("=", 1) for word in line.split() if "=" in word)
        for line in text.splitlines()
    ]


def expand_nodelist(expression: str) -> tuple[str, ...]:
    """Slurm's own expansion (`scontrol show hostnames`); without scontrol, the same grammar
    here. A list neither can read is an error: never a silent fall back to this machine."""
    if shutil.which("scontrol") is None:
        return slurm.expand_hostlist(expression)
    done = _scontrol("show", "hostnames", expression)
    names = tuple(done.stdout.split())
    if done.returncode != 0 or not names:
        raise UsageError(
            f'cannot expand the Slurm node list "{expression}": '
            f"{done.stderr.strip() or 'scontrol printed no host'}",
            hint="check that this shell is inside the allocation (salloc, sbatch) "
            "and that scontrol reaches the controller",
        )
    return names


def current_allocation(env: Mapping[str, str]) -> slurm.Allocation:
    """The allocation this shell runs in (salloc, sbatch, srun --pty)."""
    nodes = expand_nodelist(env.get(slurm.NODELIST_VAR, ""))
    return slurm.allocation_from(env, nodes)


def node_addresses(nodes: Sequence[str]) -> dict[str, str]:
    """Each node's NodeAddr as the controller knows it (names may not resolve here)."""
    records = _records(_scontrol("-o", "show", "node", ",".join(nodes)).stdout)
    return {r["NodeName"]: r["NodeAddr"] for r in records if "NodeName" in r and "NodeAddr" in r}


def listen_address(nodes: Sequence[str]) -> str:
    """This machine's address on the route to the nodes (the first that has one)."""
    addresses = node_addresses(nodes[:8]) if shutil.which("scontrol") else {}
    unresolved: list[str] = []
    for node in nodes[:8]:
        target = addresses.get(node, node)
        try:
            target = str(socket.getaddrinfo(target, None, socket.AF_INET)[0][4][0])
        except OSError as exc:
            unresolved.append(f"{target} ({exc.strerror or exc})")
            continue
        address = route_address(target)
        if address is not None:
            return address
    shown = f"{', '.join(nodes[:3])}{'...' if len(nodes) > 3 else ''}"
    if len(unresolved) == len(nodes[:8]):
        raise ConnectError(
            f"the Slurm nodes' names do not resolve on this machine: {'; '.join(unresolved[:3])}",
            hint="run dtrain on a node of the allocation, or give the nodes a NodeAddr that "
            "resolves here (scontrol show node shows it)",
        )
    raise ConnectError(
        f"no route from this machine to the Slurm nodes ({shown})",
        hint="run dtrain on a node of the allocation, or on a login node that reaches them",
    )


# What srun says while it waits, shown as it comes: the job in the queue, a step that cannot
# start yet (a suspended job, busy nodes: "step creation temporarily disabled, retrying"),
# the controller away; and that the wait is over.
_WAITING = (
    "queued and waiting",
    "has been allocated",
    "step creation",
    "step created",
    "slurm is busy",
    "not responding",
)


def is_waiting(line: str) -> bool:
    """Whether one of srun's lines says it waits (or stopped waiting)."""
    lowered = line.lower()
    return any(mark in lowered for mark in _WAITING)


# ---- the starter and the engine ------------------------------------------------------------


@dataclass(frozen=True)
class SrunStarter:
    """One `srun` step: one agent task per node (`plan.slurm.agent_step_argv`)."""

    job_name: str = "dtrain"
    srun_args: tuple[str, ...] = ()
    name = "srun"
    identity = IDENTITY
    names_by_order = False

    def processes(
        self, command: Sequence[str], nodes: Sequence[str] | None, count: int, address: str
    ) -> list[StarterProcess]:
        argv = slurm.agent_step_argv(nodes, count, command, self.job_name, self.srun_args)
        argv[0] = _slurm_command("srun")
        return [StarterProcess(argv)]

    def note(self, line: str) -> str | None:
        return line.removeprefix("srun: ") if is_waiting(line) else None

    def quiet_note(self, nodes: Sequence[str] | None, timeout_s: float | None) -> str | None:
        """That the step has not started, and the job's state when it tells why (SUSPENDED):
        srun itself is silent while a step waits inside an allocation."""
        if nodes is None:
            return None  # making an allocation: srun says "queued and waiting" itself
        job = os.environ.get(slurm.JOB_ID_VAR, "")
        state = ""
        if job.isdigit():
            with contextlib.suppress(OSError, DtrainError):
                records = _records(_scontrol("-o", "show", "job", job).stdout)
                state = records[0].get("JobState", "") if records else ""
        why = f" (Slurm job {job} is {state})" if state and state != "RUNNING" else ""
        limit = f"; waiting up to {timeout_s:.0f}s" if timeout_s is not None else ""
        return (
            f"Slurm has not started dtrain's agents on {len(nodes)} node(s) after "
            f"{QUIET_NOTE_S:.0f}s{why}{limit}"
        )

    def ended_why(self, job_id: str, returncodes: Sequence[int | None]) -> str | None:
        return _ended_why(job_id) if job_id.isdigit() else None


class SlurmStep(ConnectBack):
    """One srun step with an agent on each node, and the connections they made back."""

    def __init__(
        self,
        nodes: Sequence[str] | None,
        count: int,
        *,
        pythons: Sequence[str] = AGENT_PYTHONS,
        job_name: str = "dtrain",
        srun_args: Sequence[str] = (),
        on_note: Callable[[str], None] | None = None,
    ) -> None:
        super().__init__(
            SrunStarter(job_name, tuple(srun_args)),
            nodes,
            count,
            pythons=pythons,
            on_note=on_note,
        )


class SlurmEngine(ConnectBackEngine):
    """Agents from one srun step: in this shell's allocation, or in one srun makes."""

    startup_timeout_s = STARTUP_TIMEOUT_S

    def __init__(self, options: SlurmOptions, pythons: Sequence[str]) -> None:
        super().__init__(pythons, options.on_note)
        self.options = options

    def new_step(self, nodes: Sequence[str] | None, count: int) -> ConnectBack:
        return SlurmStep(
            nodes,
            count,
            pythons=self.pythons,
            job_name=self.options.job_name,
            srun_args=self.options.srun_args,
            on_note=self.on_note,
        )

    def listen_address(self, nodes: Sequence[str]) -> str:
        return listen_address(nodes)

    def allocation_address(self) -> str:
        return controller_route()

    def label(self) -> str:
        return f"Slurm job {self.step.job_id if self.step is not None else '?'}"

    def record(self) -> dict[str, Any] | None:
        if self.step is None:
            return None
        return {"name": "slurm", "job_id": self.step.job_id, "step_id": self.step.step_id}


def starter_command(options: SlurmOptions, hosts: Sequence[Host]) -> list[str]:
    """The srun that would start the agents on `hosts` (or make the allocation)."""
    nodes = None if options.nodes is not None else [h.name for h in hosts]
    count = options.nodes if options.nodes is not None else len(hosts)
    command = agent_command(AGENT_PYTHONS)
    return slurm.agent_step_argv(nodes, count, command, options.job_name, options.srun_args)


# Job states that mean Slurm itself ended the job, as `scontrol show job` spells them.
_ENDED_BY_SLURM = {
    "CANCELLED": "Slurm cancelled job {job} (scancel, or an administrator)",
    "TIMEOUT": "Slurm job {job} reached its time limit",
    "NODE_FAIL": "Slurm job {job} lost a node (NODE_FAIL)",
    "PREEMPTED": "Slurm job {job} was preempted",
    "DEADLINE": "Slurm job {job} reached its deadline",
    "OUT_OF_MEMORY": "Slurm job {job} ran out of memory",
}
_STATE_WAIT_S = 3.0  # a job being torn down shows COMPLETING for a moment before its state


def _ended_why(job_id: str) -> str:
    """The sentence for a job Slurm ended, or "" (still running, or scontrol cannot say)."""
    deadline = time.monotonic() + _STATE_WAIT_S
    while True:
        try:
            records = _records(_scontrol("-o", "show", "job", job_id).stdout)
        except (OSError, DtrainError):
            return ""
        state = records[0].get("JobState", "") if records else ""
        if state != "COMPLETING" or time.monotonic() > deadline:
            return _ENDED_BY_SLURM.get(state, "").format(job=job_id)
        time.sleep(0.2)


def controller_route() -> str:
    """This machine's address towards the Slurm controller: where the nodes of an allocation
    not made yet can reach the launcher (they all talk to the controller)."""
    done = _scontrol("show", "config")
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip().startswith("SlurmctldHost"):
            name, _, address = value.strip().partition("(")
            target = address.rstrip(")") or name
            with contextlib.suppress(OSError):
                target = str(socket.getaddrinfo(target, None, socket.AF_INET)[0][4][0])
            if (found := route_address(target)) is not None:
                return found
    raise ConnectError(
        "cannot tell which address Slurm's nodes reach this machine at: "
        f"`scontrol show config` {'failed' if done.returncode else 'names no SlurmctldHost'}",
        hint=done.stderr.strip() or "run dtrain where scontrol reaches the controller",
    )
