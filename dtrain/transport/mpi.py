"""The MPI engine: one mpirun starts an agent on every host, and each agent connects back.

mpirun is only the starter here (`dtrain.transport.connectback` does the rest): it runs the
agent once per host over ssh, as it would run rank i on host i, with the key and the
launcher's address in two variables it forwards by name. Placement, roles, environment and
supervision stay dtrain's. What is MPI's own: which MPI an mpirun is (`--version`), the
mpirun line (`plan.mpi`), the ssh it runs (the options dtrain was given, as a script), the
variables its ranks carry (dropped before any task starts), and what its end means.
"""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from dtrain.errors import ConnectError, DtrainError, UsageError
from dtrain.plan import mpi
from dtrain.plan.hosts import Host
from dtrain.plan.mpi import Mpirun
from dtrain.transport.bootstrap import AGENT_PYTHONS
from dtrain.transport.connectback import (
    CONNECT_VAR,
    KEY_VAR,
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

VERSION_TIMEOUT_S = 10.0
# ssh's own connect bound plus the agents' start; MPICH's hydra waits forever on an ssh that
# cannot log in, so this bound is what ends that wait.
STARTUP_MARGIN_S = 20.0
RSH_SHOWN = "<ssh wrapper>"

# The rank each MPI gives its processes (the host's place in -H), and what else of theirs the
# agent drops: tasks get dtrain's ranks, and mpi4py or Horovod in a task must not find the
# agent's one-process-per-host world in its environment.
IDENTITY = AgentIdentity(
    order_vars=("OMPI_COMM_WORLD_RANK", "PMI_RANK", "PMIX_RANK"),
    scrub_prefixes=("OMPI_", "PMIX_", "PMI_", "OPAL_", "HYDRA_", "MPI_LOCAL"),
)


def find_mpirun(path: str | None) -> Mpirun:
    """The mpirun to use (`--mpirun PATH`, else `mpirun` or `mpiexec` on PATH) and which MPI
    it is; one line, nothing started, when there is none or it is neither MPI dtrain knows."""
    found = shutil.which(path) if path is not None else None
    if path is not None and found is None:
        raise UsageError(
            f"--mpirun {path}: no such program", hint="pass the path of an mpirun or mpiexec"
        )
    found = found or shutil.which("mpirun") or shutil.which("mpiexec")
    if found is None:
        raise DtrainError(
            "--launcher mpi: no mpirun or mpiexec on PATH",
            hint="install Open MPI or MPICH (Debian: openmpi-bin, mpich), or pass --mpirun PATH",
        )
    try:
        done = subprocess.run(
            [found, "--version"],
            stdin=subprocess.DEVNULL,
            capture_output=True,
            text=True,
            errors="replace",
            timeout=VERSION_TIMEOUT_S,
            check=False,
        )
        said = done.stdout + done.stderr
    except subprocess.TimeoutExpired:
        said = f"nothing within {VERSION_TIMEOUT_S:.0f}s"
    except OSError as exc:
        said = exc.strerror or str(exc)
    flavor = mpi.flavor_of(found, said)
    if flavor is None:
        first = next((line.strip() for line in said.splitlines() if line.strip()), "nothing")
        raise UsageError(
            f"{found} is neither Open MPI nor MPICH: `--version` says {first[:120]!r}",
            hint="pass --mpirun PATH to Open MPI's mpirun or MPICH's mpiexec.hydra",
        )
    return flavor


@dataclass(frozen=True)
class MpiOptions:
    """`--launcher mpi`: the mpirun (found and recognised) and the site's own options."""

    mpirun: Mpirun
    mpi_args: tuple[str, ...] = ()
    from_allocation: bool = False  # the hosts are a scheduler's job's, not a hosts file's
    on_note: Callable[[str], None] | None = field(default=None, compare=False, repr=False)

    @property
    def allocate_count(self) -> int | None:
        return None

    @property
    def owns_hosts(self) -> bool:
        return self.from_allocation  # else the hosts file chose them, as over ssh

    def make_engine(self, pythons: Sequence[str], ssh: SshOptions) -> Engine:
        return MpiEngine(self, pythons, ssh)

    def starter_command(self, hosts: Sequence[Host]) -> list[str]:
        command = agent_command(AGENT_PYTHONS, IDENTITY)
        return mpi.agents_argv(
            self.mpirun,
            [h.name for h in hosts],
            command,
            (KEY_VAR, CONNECT_VAR),
            RSH_SHOWN,
            as_root=os.geteuid() == 0,
            address="<this machine>",
            extra=self.mpi_args,
        )


@dataclass(frozen=True)
class MpirunStarter:
    """One mpirun for every host; rank i is the agent of host i."""

    options: MpiOptions
    rsh: str  # the ssh wrapper's path
    names_by_order = True
    identity = IDENTITY

    @property
    def name(self) -> str:
        return os.path.basename(self.options.mpirun.path)

    def processes(
        self, command: Sequence[str], nodes: Sequence[str] | None, count: int, address: str
    ) -> list[StarterProcess]:
        assert nodes is not None  # mpirun makes no allocation
        argv = mpi.agents_argv(
            self.options.mpirun,
            nodes,
            command,
            (KEY_VAR, CONNECT_VAR),
            self.rsh,
            as_root=os.geteuid() == 0,
            address=address,
            extra=self.options.mpi_args,
        )
        return [StarterProcess(argv)]

    def note(self, line: str) -> str | None:
        return None

    def quiet_note(self, nodes: Sequence[str] | None, timeout_s: float | None) -> str | None:
        count = len(nodes or ())
        limit = f"; waiting up to {timeout_s:.0f}s" if timeout_s is not None else ""
        return (
            f"{self.name} has not started dtrain's agents on {count} host(s) "
            f"after {QUIET_NOTE_S:.0f}s{limit}"
        )

    def ended_why(self, job_id: str, returncodes: Sequence[int | None]) -> str | None:
        code = returncodes[0] if returncodes else None
        if code is None:
            return None
        if code < 0:
            return f"{self.name} was killed by {signal.Signals(-code).name} while the job ran"
        return f"{self.name} exited with {code} while the job ran"


class MpiEngine(ConnectBackEngine):
    """Agents from one mpirun over ssh, on the hosts of the hosts file."""

    def __init__(self, options: MpiOptions, pythons: Sequence[str], ssh: SshOptions) -> None:
        super().__init__(pythons, options.on_note)
        self.options = options
        self.ssh = ssh
        connect_s = ssh.connect_timeout_s or DEFAULT_CONNECT_TIMEOUT_S
        self.startup_timeout_s = connect_s + STARTUP_MARGIN_S
        self._dir: tempfile.TemporaryDirectory[str] | None = None

    def new_step(self, nodes: Sequence[str] | None, count: int) -> ConnectBack:
        self._dir = tempfile.TemporaryDirectory(prefix="dtrain-mpi-")
        rsh = Path(self._dir.name) / "ssh"
        connect_s = self.ssh.connect_timeout_s or DEFAULT_CONNECT_TIMEOUT_S
        script = mpi.ssh_wrapper(self.ssh.config_file, connect_s, self.ssh.accept_new_host_keys)
        rsh.write_text(script)
        rsh.chmod(0o700)
        return self.connect_back(MpirunStarter(self.options, str(rsh)), nodes, count)

    def listen_address(self, nodes: Sequence[str]) -> str:
        """Towards the hosts as ssh reaches them; a Slurm allocation's nodes, as the
        controller knows them (their names may resolve only there)."""
        try:
            return address_towards(nodes, self.ssh.config_file)
        except ConnectError:
            if not self.options.from_allocation or shutil.which("scontrol") is None:
                raise
        from dtrain.transport import slurm

        return slurm.listen_address(nodes)

    def label(self) -> str:
        return self.options.mpirun.label

    def record(self) -> dict[str, Any] | None:
        mpirun = self.options.mpirun
        pid = self.step.proc.pid if self.step is not None and self.step.proc else None
        return {
            "name": "mpi",
            "mpirun": mpirun.path,
            "flavor": mpirun.flavor.value,
            "version": mpirun.version,
            "pid": pid,
        }

    def close(self) -> None:
        super().close()
        if self._dir is not None:
            self._dir.cleanup()
