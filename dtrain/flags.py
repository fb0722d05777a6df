"""The command line's shared flags: click option bundles, and the ssh options they make."""

from __future__ import annotations

import functools
import math
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import click

from dtrain.inputfiles import InputFile, check_input
from dtrain.transport.options import DEFAULT_SETUP_TIMEOUT_S, SshOptions
from dtrain.where import MpiFlags

F = TypeVar("F", bound=Callable[..., Any])


DAY_S = 86400.0


class Seconds(click.FloatRange):
    """A duration in seconds: finite (nan and inf are not durations) and within its range."""

    name = "seconds"

    def convert(self, value: Any, param: click.Parameter | None, ctx: click.Context | None) -> Any:
        number = super().convert(value, param, ctx)
        if not math.isfinite(number):
            self.fail(f"{value!r} is not a number of seconds", param, ctx)
        return number


def remote_python_option(func: F) -> F:
    return click.option(
        "--remote-python",
        default="auto",
        show_default=True,
        help="The python that runs dtrain's small agent on each host (standard library only, "
        ">= 3.6; auto tries /usr/bin/python3, /usr/local/bin/python3, then python3 on the "
        "login PATH). Your command still runs with the login environment's own python.",
    )(func)


def hosts_option(func: F) -> F:
    return click.option(
        "-H",
        "--hostfile",
        "hostfile",
        type=click.Path(path_type=Path),
        help="Hosts file: one [user@]host[:port] [slots=N] per line (see hosts.example). "
        "Without it, everything runs on this machine.",
    )(func)


def ssh_options(func: F) -> F:
    for decorator in reversed(
        [
            click.option(
                "--ssh-config",
                type=click.Path(path_type=Path),  # checked by `inputfiles`, as -H is
                help="Use only this ssh config file, like ssh -F "
                "(default: ~/.ssh/config, then /etc/ssh/ssh_config).",
            ),
            click.option(
                "--accept-new-host-keys",
                is_flag=True,
                help="Record host keys seen for the first time in known_hosts "
                "(OpenSSH's accept-new). A changed key always fails.",
            ),
            click.option(
                "--connect-timeout",
                type=Seconds(min=0.1, max=DAY_S),
                help="Seconds to wait for each host's ssh connection "
                "(default: ConnectTimeout from ssh config, else 10).",
            ),
        ]
    ):
        func = decorator(func)
    return func


def setup_options(func: F) -> F:
    for decorator in reversed(
        [
            click.option(
                "--setup",
                multiple=True,
                metavar="SHELL",
                help="Run this in each host's login shell ($SHELL here) before its tasks' "
                "environment is taken (e.g. 'source /shared/venv/bin/activate'); repeatable, "
                "in order. The job's own variables still win.",
            ),
            click.option(
                "--setup-file",
                type=click.Path(path_type=Path),
                help="Like --setup, with the commands of this file (after any --setup).",
            ),
            click.option(
                "--setup-timeout",
                type=Seconds(min=0.1, max=DAY_S),
                default=DEFAULT_SETUP_TIMEOUT_S,
                show_default=True,
                help="Seconds the setup may take on each host; then it is stopped and "
                "nothing starts.",
            ),
        ]
    ):
        func = decorator(func)
    return func


LAUNCHERS = ("auto", "local", "ssh", "slurm", "mpi", "pbs", "lsf")


def launcher_option(func: F) -> F:
    """`--launcher`, and `--launcher mpi`'s own flags, which reach the command as one
    `mpi: MpiFlags` argument."""
    options = [
        click.option(
            "--launcher",
            type=click.Choice(LAUNCHERS),
            default="auto",
            show_default=True,
            help="How the hosts' agents start. auto: ssh with -H; inside a Slurm allocation "
            "(salloc, sbatch) its nodes through Slurm; inside a PBS or LSF job its node file's "
            "hosts through pbsdsh or blaunch (else ssh); else this machine only. mpi: one "
            "mpirun (Open MPI or MPICH) starts them on the -H hosts.",
        ),
        click.option(
            "--mpirun",
            metavar="PATH",
            help="mpi: the mpirun to start the agents with (mpirun.openmpi, mpiexec.hydra, a "
            "site's wrapper; default: mpirun, else mpiexec, on PATH).",
        ),
        click.option(
            "--mpi-arg",
            "mpi_args",
            multiple=True,
            metavar="ARG",
            help="mpi: pass ARG to mpirun, e.g. --mpi-arg=--mca --mpi-arg=btl_tcp_if_include "
            "--mpi-arg=eth0 (repeatable).",
        ),
    ]

    @functools.wraps(func)
    def command(*args: Any, mpirun: str | None, mpi_args: tuple[str, ...], **kwargs: Any) -> Any:
        return func(*args, mpi=MpiFlags(mpirun, mpi_args), **kwargs)

    for decorator in reversed(options):
        command = decorator(command)
    return cast(F, command)


def allocation_options(func: F) -> F:
    """`--launcher slurm --nodes N` and the srun options the allocation is made with."""
    options = [
        click.option("--nodes", type=click.IntRange(1, 100_000), help="slurm: allocate N nodes."),
        click.option("--partition", help="slurm: the partition (srun --partition)."),
        click.option("--time", "time_limit", help="slurm: the time limit (srun --time)."),
        click.option("--account", help="slurm: the account to charge (srun --account)."),
        click.option("--gpus-per-node", help="slurm: GPUs on each node (srun --gpus-per-node)."),
        click.option(
            "--srun-arg",
            "srun_args",
            multiple=True,
            metavar="ARG",
            help="slurm: pass ARG to the srun that makes the allocation, e.g. "
            "--srun-arg=--constraint=a100 (repeatable).",
        ),
    ]
    for decorator in reversed(options):
        func = decorator(func)
    return func


def _workdir(ctx: click.Context, param: click.Parameter, value: str | None) -> Path | None:
    if value == "":  # click would read '' as '.', silently this directory
        raise click.BadParameter("is empty; leave it out to use this directory", ctx, param)
    return Path(value) if value is not None else None


def workdir_option(func: F) -> F:
    return click.option(
        "--workdir",
        type=click.Path(file_okay=False),
        callback=_workdir,
        help="Working directory of every task (default: this directory).",
    )(func)


def log_dir_option(help_text: str) -> Callable[[F], F]:
    """--log-dir as typed: checked by `joblog.check_root`, so that '' is an error, not `.`."""
    return click.option(
        "--log-dir", type=click.Path(), default="dtrain-logs", show_default=True, help=help_text
    )


def json_option(func: F) -> F:
    return click.option(
        "--json", "as_json", is_flag=True, help="Print exactly one JSON document on stdout."
    )(func)


def job_option(func: F) -> F:
    return click.option(
        "--job", metavar="ID", help="Only this dtrain job (its id, as `dtrain launch` printed it)."
    )(func)


def make_ssh_options(
    ssh_config: Path | None,
    accept_new_host_keys: bool,
    connect_timeout: float | None,
    setup: tuple[str, ...] = (),
    setup_timeout: float = DEFAULT_SETUP_TIMEOUT_S,
) -> SshOptions:
    if ssh_config is not None:  # `ssh -G -F FILE` would read a FIFO or /dev/zero forever
        hint = "pass --ssh-config FILE, an ssh config file (as ssh -F takes)"
        check_input(InputFile(ssh_config, "--ssh-config", "ssh config", hint))
    return SshOptions(
        config_file=str(ssh_config) if ssh_config else None,
        accept_new_host_keys=accept_new_host_keys,
        connect_timeout_s=connect_timeout,
        setup=setup,
        setup_timeout_s=setup_timeout,
    )
