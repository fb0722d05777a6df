"""The command line's shared flags: click option bundles, and the ssh options they make."""

from __future__ import annotations

import functools
import math
import shlex
from collections.abc import Callable
from pathlib import Path
from typing import Any, TypeVar, cast

import click

from dtrain import containers
from dtrain.inputfiles import InputFile, check_input
from dtrain.launch.restarts import RestartPolicy, parse_codes
from dtrain.plan.mpi import MpiFlags
from dtrain.transport.options import DEFAULT_SETUP_TIMEOUT_S, SshOptions

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


LAUNCHERS = ("auto", "local", "ssh", "slurm", "mpi", "sge", "pbs", "lsf")


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
            "(salloc, sbatch) its nodes through Slurm; inside a Grid Engine PE job (qsub -pe) "
            "its hosts through qrsh -inherit; inside a PBS or LSF job its node file's hosts "
            "through pbsdsh or blaunch (else ssh); else this machine only. mpi: one mpirun "
            "(Open MPI or MPICH) starts them on the -H hosts.",
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


CONTAINER_FLAGS = "dtrain.container_flags"  # click context meta: the container flags given


def _keep_container_flag(ctx: click.Context, param: click.Parameter, value: Any) -> Any:
    """The container flags are not the command's parameters: `make_ssh_options` reads them
    from the context, so every command that takes them spells them once (this decorator)."""
    ctx.meta.setdefault(CONTAINER_FLAGS, {})[param.name] = value
    return value


def container_options(fresh: bool) -> Callable[[F], F]:
    """--container NAME and --container-runtime; with `fresh` (launch), --image and
    --container-arg too."""
    keep: dict[str, Any] = {"expose_value": False, "callback": _keep_container_flag}
    options = [
        click.option(
            "--container",
            metavar="NAME",
            help="Run dtrain's agent, and so every task, inside the container NAME already "
            "running on each host (podman/docker exec).",
            **keep,
        ),
        click.option(
            "--container-runtime",
            type=click.Choice(containers.RUNTIMES),
            help="The container runtime to use (default: podman, else docker with a running "
            "daemon, on each host).",
            **keep,
        ),
    ]
    if fresh:
        options += [
            click.option(
                "--image",
                metavar="IMAGE",
                help="Start a fresh container of IMAGE on each host for the job (run --rm -i "
                "--init, host network and IPC, the working directory mounted) and remove it at "
                "the end; the agent and tasks run inside it.",
                **keep,
            ),
            click.option(
                "--container-arg",
                "container_args",
                multiple=True,
                metavar="ARG",
                help="Pass ARG to the runtime's `run` for --image, e.g. "
                "--container-arg=--device=/dev/fuse (repeatable).",
                **keep,
            ),
        ]

    def decorate(func: F) -> F:
        for decorator in reversed(options):
            func = decorator(func)
        return func

    return decorate


def container_from_flags() -> containers.ContainerSpec | None:
    """The container flags the running command was given (see `_keep_container_flag`)."""
    ctx = click.get_current_context(silent=True)
    given = ctx.meta.get(CONTAINER_FLAGS, {}) if ctx is not None else {}
    return containers.from_flags(
        given.get("container"),
        given.get("image"),
        given.get("container_runtime"),
        given.get("container_args") or (),
    )


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
        container=container_from_flags(),
    )


def restart_options(func: F) -> F:
    """`dtrain launch`'s restart flags (taken out of the call's flags by `restart_policy`)."""
    for decorator in reversed(
        [
            click.option(
                "--max-restarts",
                type=click.IntRange(0, 10000),
                default=0,
                show_default=True,
                help="Start the whole job again (every task stopped first) this many times "
                "after a task fails or a host is lost; never after Ctrl-C, SIGTERM, dtrain "
                "kill, --timeout, exit 126/127 or a start-up failure.",
            ),
            click.option(
                "--restart-delay",
                type=Seconds(min=0, max=DAY_S),
                default=10.0,
                show_default=True,
                help="Seconds before the first restart; doubled for each next one (with "
                "jitter), up to --max-restart-delay.",
            ),
            click.option(
                "--max-restart-delay",
                type=Seconds(min=0, max=7 * DAY_S),
                default=300.0,
                show_default=True,
                help="The longest wait before a restart.",
            ),
            click.option(
                "--restart-window",
                type=Seconds(min=0, max=DAY_S),
                default=5.0,
                show_default=True,
                help="A failure this soon after every task started is a start-up failure: "
                "never restarted.",
            ),
            click.option(
                "--no-restart-on",
                metavar="CODES",
                help="Exit codes that must never restart the job, e.g. 3,137.",
            ),
            click.option(
                "--min-hosts",
                type=click.IntRange(1, 1_000_000),
                help="With --max-restarts: restart on the hosts that answer (the plan made "
                "again over them) when at least this many do.",
            ),
            click.option(
                "--host-cooldown",
                type=Seconds(min=0, max=7 * DAY_S),
                default=300.0,
                show_default=True,
                help="With --min-hosts: seconds a dropped host sits out before it is tried again.",
            ),
        ]
    ):
        func = decorator(func)
    return func


def restart_policy(given: dict[str, Any]) -> RestartPolicy:
    """The restart flags, taken out of `given` (a command's flags as click passed them)."""
    codes = given.pop("no_restart_on")
    return RestartPolicy(
        max_restarts=given.pop("max_restarts"),
        delay_s=given.pop("restart_delay"),
        max_delay_s=given.pop("max_restart_delay"),
        window_s=given.pop("restart_window"),
        no_restart_on=parse_codes(codes) if codes is not None else frozenset(),
        min_hosts=given.pop("min_hosts"),
        host_cooldown_s=given.pop("host_cooldown"),
    )


def kill_command_for(hostfile: Path | None, ssh_config: Path | None) -> str:
    """The `dtrain kill` line that reaches the same hosts, for hints."""
    words = ["dtrain", "kill"]
    if hostfile is not None:
        words += ["-H", str(hostfile)]
    if ssh_config is not None:
        words += ["--ssh-config", str(ssh_config)]
    container = container_from_flags()
    if container is not None and container.container is not None:  # where its processes are
        words += ["--container", container.container]
    return shlex.join(words)
