"""`--launcher mpi`: which MPI an mpirun is, and the one mpirun line that starts the agents (pure).

MPI only starts dtrain's agents, one per host, each of which connects back; placement, roles,
environment and supervision stay dtrain's. Open MPI (`mpirun`, `mpirun.openmpi`) and MPICH's
hydra (`mpiexec.hydra`, `mpiexec`) are told apart by what `--version` prints.
"""

from __future__ import annotations

import enum
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from dtrain.errors import UsageError
from dtrain.plan.hosts import Host


@dataclass(frozen=True)
class MpiFlags:
    """`--mpirun PATH` and `--mpi-arg ARG`: for `--launcher mpi` only."""

    mpirun: str | None = None
    args: tuple[str, ...] = ()


NO_MPI = MpiFlags()  # neither flag given


class Flavor(enum.Enum):
    OPEN_MPI = "Open MPI"
    MPICH = "MPICH"


@dataclass(frozen=True)
class Mpirun:
    """An mpirun this machine has: its path, which MPI it is, and its version."""

    path: str
    flavor: Flavor
    version: str

    @property
    def label(self) -> str:
        return f"{self.path} ({self.flavor.value} {self.version})".replace(" )", ")")


_OPEN_MPI = re.compile(r"\((?:Open MPI|OpenRTE)\)\s*(\S+)")
_HYDRA_VERSION = re.compile(r"^\s*Version:\s*(\S+)", re.MULTILINE)


def flavor_of(path: str, version_text: str) -> Mpirun | None:
    """What `PATH --version` says it is: `mpirun (Open MPI) 4.1.4` (Debian: `(OpenRTE)`), or
    hydra's `HYDRA build details: ... Version: 4.0.2`; None for anything else."""
    if (found := _OPEN_MPI.search(version_text)) is not None:
        return Mpirun(path, Flavor.OPEN_MPI, found.group(1))
    if "HYDRA build details" in version_text:
        version = _HYDRA_VERSION.search(version_text)
        return Mpirun(path, Flavor.MPICH, version.group(1) if version else "")
    return None


def check_hosts(hosts: Sequence[Host]) -> None:
    """mpirun takes host names only, each once: a user or a port in the hosts file (the ssh
    config can say them), or a host listed twice, is refused here, before anything starts."""
    seen: dict[str, Host] = {}
    for host in hosts:
        if host.name in seen:  # rank i is the i-th host: each once
            first = seen[host.name].origin
            where = f"{host.origin.path}:{host.origin.line}: " if host.origin else ""
            raise UsageError(
                f'{where}"{host.name}" is listed twice'
                + (f" (first on line {first.line})" if first else ""),
                hint="list each host once, with slots=N for more tasks on it",
            )
        seen[host.name] = host
        if host.user is not None or host.port is not None:
            where = f"{host.origin.path}:{host.origin.line}: " if host.origin else ""
            written = f"{host.user}@{host.name}" if host.user else host.name
            written += f":{host.port}" if host.port is not None else ""
            raise UsageError(
                f'{where}"{written}": mpirun takes host names only, no user or port',
                hint="set User and Port for that host in the ssh config (--ssh-config FILE)",
            )


def agents_argv(
    mpirun: Mpirun,
    hosts: Sequence[str],
    command: Sequence[str],
    forward: Sequence[str],
    rsh: str,
    *,
    as_root: bool,
    address: str,
    extra: Sequence[str] = (),
) -> list[str]:
    """The one mpirun that runs `command` (an agent) once on each of `hosts`, rank i on
    hosts[i], with the variables named in `forward` (their values stay in the environment)
    and `rsh` as the remote shell (`ssh_wrapper`: ssh with the options dtrain was given).

    Open MPI: one process per node (`ppr:1:node`), named `-x`, no tree spawn (only this
    machine needs ssh to the hosts), `--allow-run-as-root` only as root. MPICH: `-ppn 1`,
    hydra's ssh launcher, its proxies told this machine's `address` (they would look up its
    hostname, which the hosts may not resolve), only `forward` passed on (as Open MPI does).
    `extra` (--mpi-arg)
    comes last before the command, so a site's option can override dtrain's.
    """
    count = str(len(hosts))
    names = ",".join(hosts)
    if mpirun.flavor is Flavor.OPEN_MPI:
        argv = [mpirun.path, "-n", count, "-H", names, "--map-by", "ppr:1:node"]
        argv += ["--mca", "plm_rsh_no_tree_spawn", "1", "--mca", "plm_rsh_agent", rsh]
        if as_root:
            argv.append("--allow-run-as-root")
        for name in forward:
            argv += ["-x", name]
    else:
        argv = [mpirun.path, "-n", count, "-hosts", names, "-ppn", "1", "-localhost", address]
        argv += ["-launcher", "ssh", "-launcher-exec", rsh]
        argv += ["-genvlist", ",".join(forward)]
    return [*argv, *extra, *command]


def ssh_wrapper(config_file: str | None, connect_timeout_s: float, accept_new: bool) -> str:
    """The remote shell mpirun runs, as a script: ssh with the config dtrain was given, never
    a prompt (no one can answer it), a bounded connect, host keys checked as dtrain checks
    them. A script, because hydra's -launcher-exec takes one path, and a config path with
    spaces survives no MPI's own word splitting."""
    words = ["ssh"]
    if config_file is not None:
        words += ["-F", config_file]
    words += ["-o", "BatchMode=yes", "-o", f"ConnectTimeout={max(1, round(connect_timeout_s))}"]
    if accept_new:
        words += ["-o", "StrictHostKeyChecking=accept-new"]
    return "#!/bin/sh\nexec " + " ".join(shlex.quote(w) for w in words) + ' "$@"\n'
