"""The Grid Engine engine: inside a parallel-environment job, `qrsh -inherit` starts an agent
on each granted host, and each agent connects back (`dtrain.transport.connectback`).

`qrsh -inherit HOST CMD` is how a PE job with `control_slaves TRUE` starts work on its hosts:
the host's sge_execd runs CMD under a shepherd of its own, so the agent and every task it
starts are accounted to the job and end with `qdel`. One qrsh per host; `-V` passes the
launcher's environment, which holds the key and the address (never argv) and the job
script's PATH (the Python and venv the job set up). The host the job script runs on (the
first of `$PE_HOSTFILE`, where dtrain runs) is this machine: its agent is a local child, as
the job script's own descendants are the job's too (see `dtrain.where`).

What this module adds to the connect-back is Grid Engine's own: the qrsh command per host,
what a refused task means (a PE without `control_slaves`, or no slot left on that host), the
address the hosts reach the launcher at. qrsh is no guard of liveness: a host that dies
leaves its qrsh exiting 0 while the job runs on, so a lost host is the agent link's to
notice, as over ssh.
"""

from __future__ import annotations

import logging
import shutil
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

from dtrain.errors import ConnectError, DtrainError, Problem, UsageError
from dtrain.plan import sge
from dtrain.plan.hosts import Host
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
from dtrain.transport.link import Link
from dtrain.transport.machine import local_hostname, route_address
from dtrain.transport.options import SshOptions

logger = logging.getLogger(__name__)

HOST_VAR = "DTRAIN_AGENT_HOST"  # the PE_HOSTFILE name its qrsh was given: the agent's name
STARTUP_TIMEOUT_S = 60.0  # qrsh -inherit does not queue: the execd starts the task or refuses
QCONF_TIMEOUT_S = 10.0
# The agent leaves the shepherd's process group, which qdel SIGKILLs (for a job of root's, that
# is all it kills): it outlives it long enough to stop its tasks and their descendants, as it
# does when the launcher's link closes, which qdel's kill of the launcher does at once. Killed
# by group id instead (ENABLE_ADDGRP_KILL, not root), all go at once. -w: qrsh waits for it.
AGENT_SESSION = ("setsid", "-w")
REFUSED = "didn't accept task"  # qrsh -inherit, when the PE does not let the job start tasks
IDENTITY = AgentIdentity(
    name_vars=(HOST_VAR,),
    order_vars=(ORDER_VAR,),
    job_var=sge.JOB_ID_VAR,
    scrub_vars=(ORDER_VAR, HOST_VAR),
)


def qrsh_path() -> str:
    """qrsh's path; missing, it is this machine's environment, not the user's flags."""
    path = shutil.which("qrsh")
    if path is None:
        raise DtrainError(
            "qrsh is not on PATH: dtrain starts its agents in a Grid Engine job with qrsh -inherit",
            hint="put Grid Engine's commands on PATH in the job script "
            "(source $SGE_ROOT/$SGE_CELL/common/settings.sh), or pass -H hosts",
        )
    return path


@dataclass(frozen=True)
class QrshStarter:
    """One `qrsh -inherit -nostdin -V HOST` per host, each told its host's name and place."""

    job_id: str
    name = "qrsh -inherit"
    identity = IDENTITY
    names_by_order = False

    def processes(
        self, command: Sequence[str], nodes: Sequence[str] | None, count: int, address: str
    ) -> list[StarterProcess]:
        if nodes is None:
            raise ConnectError("a Grid Engine job's hosts come from its PE_HOSTFILE")
        qrsh = qrsh_path()
        started = []
        for order, node in enumerate(nodes):
            argv = sge.inherit_argv(node, [*AGENT_SESSION, *command])
            argv[0] = qrsh
            started.append(StarterProcess(argv, {HOST_VAR: node, ORDER_VAR: str(order)}, node))
        return started

    def note(self, line: str) -> str | None:
        return None  # qrsh -inherit does not wait: it starts the task or says why not

    def quiet_note(self, nodes: Sequence[str] | None, timeout_s: float | None) -> str | None:
        count = len(nodes) if nodes is not None else 0
        limit = f"; waiting up to {timeout_s:.0f}s" if timeout_s is not None else ""
        return (
            f"Grid Engine job {self.job_id} has not started dtrain's agents on {count} "
            f"host(s) after {QUIET_NOTE_S:.0f}s{limit}"
        )

    def ended_why(self, job_id: str, returncodes: Sequence[int | None]) -> str | None:
        return None  # qdel ends the launcher too: nobody is left to be told


class SgeEngine(ConnectBackEngine):
    """Agents on the hosts of this shell's PE job, one `qrsh -inherit` each."""

    startup_timeout_s = STARTUP_TIMEOUT_S

    def __init__(self, options: SgeOptions, pythons: Sequence[str]) -> None:
        super().__init__(pythons, options.on_note)
        self.options = options

    def new_step(self, nodes: Sequence[str] | None, count: int) -> ConnectBack:
        return self.connect_back(QrshStarter(self.options.job_id), nodes, count)

    def listen_address(self, nodes: Sequence[str]) -> str:
        return listen_address(nodes)

    def label(self) -> str:
        return f"Grid Engine job {self.options.job_id}"

    def record(self) -> dict[str, Any] | None:
        return {"name": "sge", "job_id": self.options.job_id, "pe": self.options.pe}

    def open_links(self, hosts: Sequence[Host]) -> tuple[dict[str, Link], dict[str, Problem]]:
        """As every connect-back engine. An execd that refused the task ("didn't accept
        task") because the PE does not let jobs start tasks is the job's setup, said once;
        one that refused it with control_slaves TRUE ran out of the job's slots there (a
        second qrsh beside the launch's agent: ps, kill) and is that host's problem."""
        links, problems = super().open_links(hosts)
        refused = [key for key, problem in problems.items() if REFUSED in (problem.hint or "")]
        if refused and pe_allows_tasks(self.options.pe) is not True:
            raise UsageError(
                f"Grid Engine job {self.options.job_id}'s parallel environment \""
                f'{self.options.pe}" does not let it start tasks on its hosts '
                f"(qrsh -inherit: {REFUSED}); nothing was started",
                hint=f"submit with a PE whose control_slaves is TRUE (qconf -sp "
                f"{self.options.pe or 'NAME'} shows it), or pass -H hosts to use ssh",
            )
        for key in refused:
            problems[key] = replace(
                problems[key],
                hint="its execd runs as many of the job's tasks as the job has slots there, "
                "and dtrain's launch holds one: submit with more slots per host, or pass "
                "-H hosts to reach the hosts over ssh",
            )
        return links, problems


def pe_allows_tasks(pe: str) -> bool | None:
    """The PE's control_slaves as `qconf -sp PE` shows it; None when qconf cannot say."""
    qconf = shutil.which("qconf")
    if not pe or qconf is None:
        return None
    try:
        shown = subprocess.run(
            [qconf, "-sp", pe],
            capture_output=True,
            text=True,
            timeout=QCONF_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    for line in shown.stdout.splitlines():
        words = line.split()
        if len(words) == 2 and words[0] == "control_slaves":
            return words[1].upper() == "TRUE"
    return None


@dataclass(frozen=True)
class SgeOptions:
    """The PE job this shell runs in, as the engine that starts its hosts' agents."""

    job_id: str
    pe: str = ""
    on_note: Callable[[str], None] | None = None

    @property
    def allocate_count(self) -> int | None:
        return None  # a job is submitted with qsub -pe; dtrain runs inside it

    @property
    def owns_hosts(self) -> bool:
        return True

    def make_engine(self, pythons: Sequence[str], ssh: SshOptions) -> SgeEngine:
        return SgeEngine(self, pythons)

    def starter_command(self, hosts: Sequence[Host]) -> list[str]:
        """The qrsh of the first host (the others differ only in the host's name)."""
        first = hosts[0].name if hosts else "HOST"
        return sge.inherit_argv(first, agent_command(AGENT_PYTHONS, IDENTITY))


def listen_address(nodes: Sequence[str]) -> str:
    """This machine's address on the route to the job's other hosts (the first that has
    one): the job's hosts resolve each other's names, as Grid Engine itself needs."""
    tried: list[str] = []
    for node in nodes[:8]:
        try:
            target = str(socket.getaddrinfo(node, None, socket.AF_INET)[0][4][0])
        except OSError as exc:
            tried.append(f"{node} ({exc.strerror or exc})")
            continue
        address = route_address(target)
        if address is not None:
            return address
        tried.append(f"{node} (no route)")
    raise ConnectError(
        f"no route from this host ({socket.gethostname()}) to the job's hosts: "
        f"{'; '.join(tried[:3])}",
        hint="run dtrain in the job script (on the job's first host)",
    )


def current_job(env: Mapping[str, str]) -> sge.PeJob:
    """The PE job this shell runs in, its hosts from `$PE_HOSTFILE`; the one this machine is
    (the job script's host) marked local: its agent is a child of dtrain, no qrsh."""
    path = sge.hostfile_path(env)
    try:
        with open(path, encoding="utf-8", errors="replace") as file:
            text = file.read(1 << 20)
    except OSError as exc:
        raise UsageError(
            f"cannot read {sge.HOSTFILE_VAR}={path}: {exc.strerror or exc}",
            hint="run dtrain inside the Grid Engine job this file belongs to (its job script)",
        ) from None
    job = sge.job_from(env, text)
    here = sge.local_name(local_hostname(), [h.name for h in job.hosts])
    hosts = tuple(replace(h, is_local=True) if h.name == here else h for h in job.hosts)
    return replace(job, hosts=hosts)
