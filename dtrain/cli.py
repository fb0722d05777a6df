"""The `dtrain` command: parse flags, call the library, render, exit. The only place that prints.

stdout carries results (plans, task output, reports; with --json exactly one document);
stderr carries dtrain's own progress and errors, prefixed `dtrain:`, and the tasks' stderr.
"""

from __future__ import annotations

import contextlib
import functools
import io
import json
import logging
import os
import signal
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any, NoReturn

import click

from dtrain import __version__, render
from dtrain.errors import DtrainError, ExitCode, Problem, one_line
from dtrain.flags import (
    DAY_S,
    F,
    Seconds,
    allocation_options,
    container_options,
    hosts_option,
    job_option,
    json_option,
    kill_command_for,
    launcher_option,
    log_dir_option,
    make_ssh_options,
    remote_python_option,
    restart_options,
    restart_policy,
    setup_options,
    ssh_options,
    workdir_option,
)
from dtrain.inputfiles import read_setup
from dtrain.launch import joblog
from dtrain.launch.lifecycle import Launch, dry_run_facts, with_slurm_hosts
from dtrain.launchflags import LaunchFlags, config_from_flags
from dtrain.plan import planner
from dtrain.plan.hosts import Host, require_named
from dtrain.plan.mpi import MpiFlags
from dtrain.plan.spec import JobPlan
from dtrain.render.console import TerminalConsole
from dtrain.transport.machine import local_hostname
from dtrain.transport.options import SshOptions
from dtrain.where import where_to_run

if TYPE_CHECKING:
    from dtrain.processes import results
    from dtrain.transport.engine import EngineOptions

CONTEXT = {"help_option_names": ["-h", "--help"], "max_content_width": 100}


class JsonFailure(Exception):
    """Already reported as a JSON document; exit with this code."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(exit_code)
        self.exit_code = exit_code


# ---- output: errors under --json, documents, dtrain's own lines ------------------------------


def reports_errors_as_json(command: str) -> Callable[[F], F]:
    """With --json, an error is still exactly one JSON document on stdout."""

    def decorate(func: F) -> F:
        @functools.wraps(func)
        def wrapper(*args: Any, **kwargs: Any) -> Any:
            try:
                return func(*args, **kwargs)
            except DtrainError as exc:
                if not kwargs.get("as_json"):
                    raise
                emit_json(render.envelope(command, exc.exit_code, None, exc.to_problems()))
                raise JsonFailure(exc.exit_code) from exc

        return wrapper  # type: ignore[return-value]

    return decorate


def new_job_id() -> str:
    # os.urandom is what secrets.token_hex reads; the secrets module would bring random along.
    return planner.make_job_id(datetime.now(), os.urandom(2).hex())


def emit_json(document: dict[str, Any]) -> None:
    with contextlib.suppress(BrokenPipeError):  # a reader that went away changes no exit code
        click.echo(json.dumps(document, indent=2))


def say(text: str) -> None:
    """dtrain's own text on stderr; a reader that went away (`2>&1 | head -n 1`) changes
    nothing, least of all the exit code, which is the job's."""
    with contextlib.suppress(OSError, ValueError):
        sys.stderr.write(text)
        sys.stderr.flush()


# ---- the group ------------------------------------------------------------------------------


@click.group(context_settings=CONTEXT)
@click.version_option(__version__, "-V", "--version", prog_name="dtrain")
@click.option("--debug", is_flag=True, help="Show tracebacks and debug logs.")
@click.pass_context
def cli(ctx: click.Context, debug: bool) -> None:
    """Launch distributed training jobs over ssh, and never leave a process behind.

    \b
    Examples:
      dtrain launch -n 2 -s 2 -- python examples/ps_sum.py      # on this machine
      dtrain launch -n 4 -s 2 -H hosts -- python train.py --kv-store dist_sync
    """
    ctx.ensure_object(dict)
    ctx.obj["debug"] = debug
    configure_logging(debug)


def configure_logging(debug: bool) -> None:
    """Warnings read as dtrain's own lines (`dtrain: HOST KEY CHANGED ...`); with --debug,
    every line also names the module that wrote it."""
    logging.basicConfig(
        level=logging.DEBUG if debug else logging.WARNING,
        format="dtrain: %(name)s: %(message)s" if debug else "dtrain: %(message)s",
    )
    # paramiko logs a traceback for each failed handshake that dtrain reports in one line
    logging.getLogger("paramiko").setLevel(logging.DEBUG if debug else logging.CRITICAL + 1)


@cli.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@click.option("-n", "--num-workers", type=int, help="Workers (collective jobs: world size).")
@click.option(
    "-s",
    "--num-servers",
    type=int,
    help="Parameter servers (dmlc: default -n, as launch.py; tf: default 1).",
)
@hosts_option
@launcher_option
@allocation_options
@click.option(
    "--framework",
    default="dmlc",
    show_default=True,
    help="dmlc (MXNet, ps-lite, BytePS), tf, torch or paddle; "
    "mxnet, tensorflow, pytorch are accepted too.",
)
@click.option("--scheduler-host", help="Run the dmlc scheduler on this host of the hosts file.")
@click.option("--host-ip", help="The scheduler's address as every host reaches it.")
@click.option("--interface", help="Network interface whose address tasks use (DMLC_INTERFACE).")
@click.option(
    "--port", type=click.IntRange(1, 65535), help="Scheduler/master port (default: free)."
)
@click.option("--env", "env_all", multiple=True, metavar="KEY[=VALUE]", help="Set for every task.")
@click.option(
    "--env-scheduler", multiple=True, metavar="KEY[=VALUE]", help="Set for the scheduler."
)
@click.option("--env-server", multiple=True, metavar="KEY[=VALUE]", help="Set for servers.")
@click.option("--env-worker", multiple=True, metavar="KEY[=VALUE]", help="Set for workers.")
@click.option(
    "--allow-env-override",
    is_flag=True,
    help="Let --env replace a variable dtrain computes (a rank, an address, TF_CONFIG).",
)
@workdir_option
@log_dir_option("Per-task logs and job.json go to LOG_DIR/<job-id>/ (mode 0700).")
@click.option(
    "--grace",
    type=Seconds(min=0, max=DAY_S),
    default=5.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL when stopping tasks.",
)
@click.option("--timeout", type=Seconds(min=0.1, max=365 * DAY_S), help="Job deadline in seconds.")
@click.option(
    "--traceback-timeout",
    type=Seconds(min=0, max=DAY_S),
    default=10.0,
    show_default=True,
    help="A task that printed an unhandled Python traceback and then sits idle this long "
    "is treated as failed (MXNet workers hang at exit). 0 turns it off.",
)
@click.option(
    "--no-stacks",
    is_flag=True,
    help="When the job hangs (--timeout, --traceback-timeout, a Ctrl-C after a long silence), "
    "stop it without first taking every task's stack into the log directory.",
)
@click.option(
    "--heartbeat-timeout",
    type=Seconds(min=2, max=DAY_S),
    help="A host silent this long is lost; its tasks stop themselves after the same time. "
    "Default: what the host's ssh config gives OpenSSH (ServerAliveInterval * "
    "ServerAliveCountMax), else 15s.",
)
@click.option("--chief", is_flag=True, help="tf: add a chief task (TF2 parameter-server jobs).")
@click.option("--ps-gpus", is_flag=True, help="tf: let ps tasks see the GPUs.")
@click.option("--nproc-per-host", type=int, help="torch/paddle: ranks per host (default: slots).")
@click.option("--gpus", help="One process per listed GPU on each host, e.g. 0,1,2,3.")
@click.option(
    "--sync-dst-dir",
    help="Copy the working directory to this directory on every host before starting "
    "(changed files only); remote tasks run there.",
)
@click.option(
    "--sync-exclude",
    multiple=True,
    metavar="PATTERN",
    help="Leave matching names out of --sync-dst-dir (besides .git, __pycache__, *.pyc).",
)
@restart_options
@remote_python_option
@ssh_options
@container_options(fresh=True)
@setup_options
@click.option("--dry-run", is_flag=True, help="Print the plan and start nothing.")
@click.option(
    "--no-preflight",
    is_flag=True,
    help="Skip the quick gather (stale processes, scheduler reachable from every host) "
    "that run before anything starts on other machines.",
)
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@reports_errors_as_json("launch")
def launch(**given: Any) -> None:
    """Start a job: a scheduler, servers and workers (or collective ranks), and supervise it.

    Everything after -- is the training command, passed on untouched. Output lines are
    prefixed [task@host]; each task's log is in --log-dir. The first task to fail stops the
    job, and dtrain exits with that task's exit code.

    \b
    Examples:
      dtrain launch -n 2 -s 2 -- python examples/ps_sum.py
      dtrain launch -n 4 -s 2 -H hosts -- python train.py --kv-store dist_sync
      dtrain launch --framework torch -n 4 -H hosts -- python examples/torch_ddp.py
      dtrain launch -n 2 --dry-run -- python train.py
      dtrain launch -n 4 -H hosts --max-restarts 3 --min-hosts 3 -- python train.py
    """
    policy = restart_policy(given)
    flags = LaunchFlags(**given)
    request, options = config_from_flags(flags)
    options = replace(options, restart=policy)
    job_id = new_job_id()
    if flags.dry_run:
        count = options.engine.allocate_count if options.engine is not None else None
        if count is not None:
            placeholders = tuple(Host(f"node{i + 1}") for i in range(count))
            request = with_slurm_hosts(request, placeholders)
        print_dry_run(request, job_id, options.ssh, flags.as_json, engine=options.engine)
        return
    stderr = sys.stderr.buffer
    console = TerminalConsole(stderr if flags.as_json else sys.stdout.buffer, stderr)
    run = Launch(request, job_id, options, console, on_planned=announcer(console))
    try:
        result = run.run()
    finally:
        console.close()  # its notes before the result, or the error
    say(render.result_text(result))
    if flags.as_json:
        data = {"plan": run.plan.to_dict() if run.plan else None, "result": result.to_dict()}
        if run.job_file is not None and "attempts" in run.job_file.document:
            data["attempts"] = run.job_file.document["attempts"]
        emit_json(render.envelope("launch", result.exit_code, data, result.problems()))
    raise SystemExit(result.exit_code)


def print_dry_run(
    request: planner.JobRequest,
    job_id: str,
    ssh: SshOptions,
    as_json: bool,
    engine: EngineOptions | None = None,
) -> None:
    """The plan, made with what can be known without connecting anywhere."""
    facts, unresolved = dry_run_facts(request, job_id, ssh, through_engine=engine is not None)
    plan = planner.plan_job(request, facts)
    note = "dry run: nothing was started; remote addresses and ports are confirmed at launch"
    if engine is not None:
        unresolved = []  # an engine's host names need not resolve here: the agents connect back
        remote = [host for host in request.hosts if not host.is_local]
        from dtrain.transport.connectback import shown_command

        note += f"\nstarter: {shown_command(engine.starter_command(remote))}"
        if engine.allocate_count is not None:
            count = engine.allocate_count
            note += f"\nnote: node1..node{count} stand for the nodes Slurm will allocate"
    if unresolved:
        note += (
            f"\nnote: {', '.join(unresolved)} "
            f"{'does' if len(unresolved) == 1 else 'do'} not resolve from here: shown by name; "
            "a launch uses the address ssh reaches each at"
        )
    if as_json:
        emit_json(render.envelope("launch", 0, {"dry_run": True, "plan": plan.to_dict()}))
    else:
        click.echo(render.plan_text(plan, note), nl=False)


def announcer(console: TerminalConsole) -> Callable[[JobPlan, Path], None]:
    """What a launch says once its plan is made: where the job runs and where its logs go."""

    def announce(plan: JobPlan, where: Path) -> None:
        hosts = plan.hosts
        if plan.is_multi_host:
            names = ", ".join(h.display for h in hosts)
            place = f"{len(hosts)} host{'s' if len(hosts) != 1 else ''} ({names})"
        else:
            place = f"this machine ({hosts[0].name})"
        count = f"{len(plan.tasks)} task{'s' if len(plan.tasks) != 1 else ''}"
        console.note(f"job {plan.job_id}: {count} on {place}; logs in {where}/")
        for message in plan.notes:
            console.note(message)

    return announce


# ---- ps and kill -----------------------------------------------------------------------------


def finish_sweep(
    command: str, as_json: bool, outcome: results.Outcome, text: str, data: object
) -> None:
    """Print a ps/kill report (text, or one JSON document); exit non-zero unless all went well."""
    if as_json:
        problems = outcome.problems
        emit_json(render.envelope(command, outcome.exit_code, data, problems, outcome.status))
        if outcome.exit_code:
            raise SystemExit(outcome.exit_code)
        return
    click.echo(text, nl=False)
    if outcome.exit_code:
        raise DtrainError(
            outcome.headline or f"{command} failed",
            problems=outcome.problems,
            exit_code=outcome.exit_code,
        )


@cli.command("ps", context_settings=CONTEXT)
@hosts_option
@launcher_option
@job_option
@log_dir_option("Also list the jobs under LOG_DIR whose launcher died (job.json says running).")
@remote_python_option
@ssh_options
@container_options(fresh=False)
@json_option
@reports_errors_as_json("ps")
def ps_command(
    hostfile: Path | None,
    launcher: str,
    mpi: MpiFlags,
    job: str | None,
    log_dir: str,
    remote_python: str,
    ssh_config: Path | None,
    accept_new_host_keys: bool,
    connect_timeout: float | None,
    as_json: bool,
) -> None:
    """List job processes on every host at once, grouped by job: pid, task, state, age, CPU.

    For each: its state (running, sleeping, disk-wait), CPU time and CPU % over half a
    second, memory, and, for a job launched from this machine, how long ago its task last
    printed (OUTPUT): a stuck rank stands out before `dtrain stacks` shows where it is.

    A job process is one of yours whose environment carries DTRAIN_JOB_ID (any dtrain job)
    or DMLC_ROLE (a parameter-server process, however it was started), or a descendant of
    one. Found by environment, never by name. Without -H, this machine. Also lists the jobs
    under --log-dir whose launcher died (killed or crashed) before it recorded their end, and
    marks them launcher_died in their job.json. Exits 0 when every host answered, whatever it
    found.

    \b
    Examples:
      dtrain ps -H hosts
      dtrain ps -H hosts --job 20261122-143005-3fa2 --json
    """
    ssh = make_ssh_options(ssh_config, accept_new_host_keys, connect_timeout)
    from dtrain.processes import (
        results,
        sweep,  # only ps/kill/doctor need them: launch starts faster
    )
    from dtrain.render import processes as shown

    root = joblog.check_root(log_dir)
    where = where_to_run(launcher, hostfile, os.environ, mpi=mpi)
    found = sweep.scan(
        where.hosts,
        ssh,
        job,
        remote_python=remote_python,
        engine=where.engine,
        cpu_window_s=sweep.PS_CPU_WINDOW_S,
    )
    dead = joblog.dead_launcher_jobs(root, local_hostname(), job)
    jobs = {p.job_id for scan in found.values() for p in scan.processes if p.job_id}
    ages = {j: joblog.output_ages(root, j, time.time()) for j in jobs}
    scans = [results.with_output_ages(scan, ages) for scan in found.values()]
    outcome = results.scan_outcome(scans)
    waiting = {j for j, _ in joblog.running_launchers(root, local_hostname(), job)}
    states = joblog.restart_states(root, jobs | waiting)
    text, data = shown.ps_text(scans, dead, states), shown.ps_data(scans, job, dead, states)
    finish_sweep("ps", as_json, outcome, text, data)


@cli.command("kill", context_settings=CONTEXT)
@hosts_option
@launcher_option
@job_option
@log_dir_option("A job launched from here with --max-restarts, under LOG_DIR, ends for good.")
@click.option("--dry-run", is_flag=True, help="Only list what would be stopped.")
@click.option(
    "--grace",
    type=Seconds(min=0, max=DAY_S),
    default=5.0,
    show_default=True,
    help="Seconds between SIGTERM and SIGKILL.",
)
@remote_python_option
@ssh_options
@container_options(fresh=False)
@json_option
@reports_errors_as_json("kill")
def kill_command(
    hostfile: Path | None,
    launcher: str,
    mpi: MpiFlags,
    job: str | None,
    log_dir: str,
    dry_run: bool,
    grace: float,
    remote_python: str,
    ssh_config: Path | None,
    accept_new_host_keys: bool,
    connect_timeout: float | None,
    as_json: bool,
) -> None:
    """Stop what jobs left behind, or a running job, on every host at once.

    Stops the job processes `dtrain ps` lists (yours only, found by environment, never by
    name): SIGTERM to each process group, SIGKILL to what is left after --grace, then gather
    that nothing is left. A running `dtrain launch` then fails, saying its tasks were killed
    from outside; one with --max-restarts from this machine (its job.json under --log-dir) is
    told to stop first, so it is not restarted, even between two attempts. Without -H, this
    machine. Exits 0 only when every
    host was reached and nothing is left (with --dry-run: when every host answered).

    \b
    Examples:
      dtrain kill -H hosts
      dtrain kill -H hosts --job 20261122-143005-3fa2
      dtrain kill --dry-run
    """
    from dtrain.processes import results, sweep
    from dtrain.render import processes as shown

    ssh = make_ssh_options(ssh_config, accept_new_host_keys, connect_timeout)
    where = where_to_run(launcher, hostfile, os.environ, mpi=mpi)
    if not dry_run:
        for stopped, pid in joblog.stop_launchers(
            joblog.check_root(log_dir), local_hostname(), job
        ):
            say(f"dtrain: job {stopped}: its launcher (pid {pid}) stops it, for good\n")
    kills = list(
        sweep.kill(
            where.hosts,
            ssh,
            job,
            grace_s=grace,
            dry_run=dry_run,
            remote_python=remote_python,
            engine=where.engine,
        ).values()
    )
    outcome = results.kill_outcome(kills)
    data = shown.kill_data(kills, job, grace, dry_run)
    finish_sweep("kill", as_json, outcome, shown.kill_text(kills), data)


@cli.command("stacks", context_settings=CONTEXT)
@hosts_option
@launcher_option
@job_option
@click.option("--native", is_flag=True, help="Also the C/C++ frames (ps-lite, gloo, NCCL).")
@click.option(
    "--per-process-timeout",
    "per_process_s",
    type=Seconds(min=0.1, max=DAY_S),
    default=10.0,
    show_default=True,
    help="Seconds py-spy may take for one process.",
)
@log_dir_option("Where the job's directory is: each task's full stack is written there.")
@remote_python_option
@ssh_options
@container_options(fresh=False)
@json_option
@reports_errors_as_json("stacks")
def stacks_command(
    hostfile: Path | None,
    launcher: str,
    mpi: MpiFlags,
    job: str | None,
    native: bool,
    per_process_s: float,
    log_dir: str,
    remote_python: str,
    ssh_config: Path | None,
    accept_new_host_keys: bool,
    connect_timeout: float | None,
    as_json: bool,
) -> None:
    """Show where every task of a job is right now: its Python stack, on every host at once.

    Takes the stack of every thread of every job process (as `dtrain ps` finds them) with
    py-spy, on all hosts in parallel (without -H: this machine, or inside a Slurm allocation
    its nodes), and groups identical stacks: the odd ones out come first. Each task's full
    stack is written under the job's directory in --log-dir when it is on this machine.
    py-spy must be installed in the job's environment (or on PATH) on each host; it pauses
    each process for milliseconds and changes nothing else. Exits 0 when every host
    answered with every Python process's stack.

    \b
    Examples:
      dtrain stacks -H hosts --job 20261122-143005-3fa2
      dtrain stacks -H hosts --native --json
    """
    from dtrain.processes import stacks
    from dtrain.render import processes as shown

    ssh = make_ssh_options(ssh_config, accept_new_host_keys, connect_timeout)
    root = joblog.check_root(log_dir)
    where = where_to_run(launcher, hostfile, os.environ, mpi=mpi)
    report = stacks.take(
        where.hosts,
        ssh,
        job,
        native=native,
        per_process_s=per_process_s,
        remote_python=remote_python,
        engine=where.engine,
    )
    report = stacks.with_files(report, root, datetime.now().strftime("%Y%m%d-%H%M%S"))
    if as_json:
        document = render.envelope(
            "stacks", report.exit_code, shown.stacks_data(report), report.problems, report.status
        )
        emit_json(document)
        if report.exit_code:
            raise SystemExit(report.exit_code)
        return
    click.echo(shown.stacks_text(report), nl=False)
    if report.exit_code:
        raise DtrainError(report.headline, problems=report.problems, exit_code=report.exit_code)


# ---- doctor ---------------------------------------------------------------------------------


@cli.command(context_settings={**CONTEXT, "allow_interspersed_args": False})
@hosts_option
@launcher_option
@click.option("--port", type=click.IntRange(1, 65535), help="The scheduler port launch will use.")
@click.option(
    "--scheduler-host",
    help="Check the scheduler on this host of the hosts file, where launch --scheduler-host "
    "runs it; this machine, which then runs nothing of the job, is not checked.",
)
@workdir_option
@click.option("--sync-dst-dir", help="Where launch --sync-dst-dir would copy the workdir to.")
@click.option("--host-ip", help="The scheduler's address as every host reaches it.")
@click.option("--interface", help="Network interface whose address tasks use (DMLC_INTERFACE).")
@remote_python_option
@ssh_options
@container_options(fresh=False)
@setup_options
@json_option
@click.argument("command", nargs=-1, type=click.UNPROCESSED)
@reports_errors_as_json("doctor")
def doctor(
    hostfile: Path | None,
    launcher: str,
    mpi: MpiFlags,
    port: int | None,
    scheduler_host: str | None,
    workdir: Path | None,
    sync_dst_dir: str | None,
    host_ip: str | None,
    interface: str | None,
    remote_python: str,
    ssh_config: Path | None,
    accept_new_host_keys: bool,
    connect_timeout: float | None,
    setup: tuple[str, ...],
    setup_file: Path | None,
    setup_timeout: float,
    as_json: bool,
    command: tuple[str, ...],
) -> None:
    """Check every host for what makes launches hang, all at once, with the fix for each.

    ssh (no prompt, host key known), the Python COMMAND would run and its packages, the
    working directory and script, ps-lite's variables, GPUs, clocks, the address each host
    advertises, TCP to the scheduler and between every pair of hosts, and processes left by
    earlier jobs. Give the COMMAND you will launch after --; without one, python3 is checked.
    Exits 0 when nothing FAILs.

    \b
    Examples:
      dtrain doctor -H hosts -- python train.py --kv-store dist_sync
      dtrain doctor -H hosts --port 9091 --sync-dst-dir /data/job --json -- python train.py
      dtrain doctor -H hosts --scheduler-host node1 -- python train.py
    """
    from dtrain.doctor import gather
    from dtrain.render import doctor as shown

    where = where_to_run(launcher, hostfile, os.environ, mpi=mpi)
    if scheduler_host is not None:
        require_named(where.hosts, scheduler_host, "--scheduler-host")
    request = gather.DoctorRequest(
        hosts=where.hosts,
        command=command,
        workdir=str((workdir or Path.cwd()).absolute()),
        sync_dst=sync_dst_dir,
        port=port,
        scheduler_host=scheduler_host,
        host_ip=host_ip,
        interface=interface or os.environ.get("DMLC_INTERFACE") or None,
        shell_env=dict(os.environ),
        kill_command=kill_command_for(hostfile, ssh_config),
    )
    ssh = make_ssh_options(
        ssh_config,
        accept_new_host_keys,
        connect_timeout,
        read_setup(setup, setup_file),
        setup_timeout,
    )
    console = TerminalConsole(sys.stdout.buffer, sys.stderr.buffer)
    try:
        report = gather.run_doctor(
            request, ssh, remote_python, engine=where.engine, setup_output=console.setup_output
        )
    finally:
        console.close()
    if as_json:
        problems = [r.to_problem() for r in report.failures]
        emit_json(render.envelope("doctor", report.exit_code, report.to_dict(), problems))
    else:
        click.echo(shown.doctor_text(report), nl=False)
    if report.exit_code:
        raise SystemExit(report.exit_code)


class Terminated(Exception):
    """SIGTERM before the job's own signal handling took over: nothing was started yet."""


def _terminated(signum: int, frame: object) -> None:
    raise Terminated(signum)


def hoist_debug(args: Sequence[str]) -> list[str]:
    """`dtrain launch --debug -- cmd` means `dtrain --debug launch -- cmd`; a `--debug` after
    `--` belongs to the user's command and is left alone (without `--`, click's error for an
    unknown option says where --debug goes)."""
    if "--" not in args:  # without it, which words are the user's is click's to say
        return list(args)
    end = args.index("--")
    if "--debug" not in args[1:end]:
        return list(args)
    rest = [a for i, a in enumerate(args) if not (a == "--debug" and i < end)]
    return ["--debug", *rest]


def run(interrupted: bool = False) -> NoReturn:
    """The `dtrain` program: `main`, then the interpreter's ordinary exit.

    A reader that went away (`dtrain ps | head -n 1`) leaves output that cannot be flushed:
    the interpreter's own flush at exit would print "Exception ignored" and exit 120, so what
    is left goes to /dev/null instead and the exit code stays the command's."""
    try:
        main(interrupted=interrupted)
    finally:
        for stream in (sys.stdout, sys.stderr):
            try:
                stream.flush()
            except (OSError, ValueError):
                with contextlib.suppress(OSError, ValueError):
                    os.dup2(os.open(os.devnull, os.O_WRONLY), stream.fileno())
    raise SystemExit(0)


def json_command(args: Sequence[str]) -> str | None:
    """The command whose `--json` this command line asks for, read as click reads it (unknown
    options and bad values passed over), so that even a usage error is one JSON document."""
    position = next((i for i, word in enumerate(args) if not word.startswith("-")), None)
    if position is None or args[position] not in cli.commands:
        return None  # before the command's name come only the group's flags (--debug)
    name, rest = args[position], list(args[position + 1 :])
    try:
        ctx = cli.commands[name].make_context(
            name, rest, resilient_parsing=True, ignore_unknown_options=True
        )
    except click.ClickException:
        return None
    return name if ctx.params.get("as_json") else None


def failure(exc: BaseException) -> tuple[int, str, list[Problem]]:
    """How an exception that reached `main` is reported: exit code, stderr text, JSON problem."""
    if isinstance(exc, click.NoSuchOption) and exc.option_name == "--debug":
        text = (
            "dtrain: --debug goes before the command's name (dtrain --debug launch ...), "
            "or before the -- that starts your command"
        )
        return ExitCode.USAGE, text, [Problem(text.removeprefix("dtrain: "), code="usage")]
    if isinstance(exc, click.ClickException):
        shown = io.StringIO()
        exc.show(shown)
        problem = Problem(exc.format_message(), code="usage")
        return exc.exit_code, shown.getvalue().rstrip("\n"), [problem]
    if isinstance(exc, DtrainError):
        return exc.exit_code, str(exc), exc.to_problems()
    if isinstance(exc, click.exceptions.Abort):
        return 130, "dtrain: interrupted", [Problem("interrupted", code="interrupted")]
    if isinstance(exc, KeyboardInterrupt):
        text = "interrupted before any task started; nothing is running"
        return 130, f"dtrain: {text}", [Problem(text, code="interrupted")]
    if isinstance(exc, Terminated):
        text = "stopped by SIGTERM before any task started; nothing is running"
        return 128 + signal.SIGTERM, f"dtrain: {text}", [Problem(text, code="terminated")]
    what = one_line(f"internal error: {type(exc).__name__}: {exc}")
    hint = "run it again with --debug for the traceback, and report it"
    problem = Problem(what, hint=hint, code="internal")
    return ExitCode.JOB_FAILED, f"dtrain: {what}\n  hint: {hint}", [problem]


def main(argv: Sequence[str] | None = None, interrupted: bool = False) -> None:
    """Every error is a message and an exit code, never a traceback (`run` is the program);
    with --json, also exactly one JSON document on stdout. `interrupted`: Ctrl-C came while
    the program was loading (`__main__`)."""
    args = hoist_debug(argv if argv is not None else sys.argv[1:])
    debug = bool(args) and args[0] == "--debug"
    signal.signal(signal.SIGTERM, _terminated)  # a launch replaces it once tasks can start
    if signal.getsignal(signal.SIGINT) is not signal.SIG_IGN:  # Ctrl-C held while loading
        signal.signal(signal.SIGINT, signal.default_int_handler)
    try:
        if interrupted:
            raise KeyboardInterrupt
        cli.main(args=args, prog_name="dtrain", standalone_mode=False)
    except JsonFailure as exc:
        raise SystemExit(exc.exit_code) from None
    except BrokenPipeError:  # the reader went away: there is no one left to tell
        raise SystemExit(ExitCode.JOB_FAILED) from None
    except Exception as exc:  # Abort is click's Ctrl-C; Terminated, SIGTERM
        expected = isinstance(exc, click.ClickException | click.exceptions.Abort | Terminated)
        if debug and not expected:
            raise
        report_failure(args, *failure(exc))
    except KeyboardInterrupt as exc:
        report_failure(args, *failure(exc))


def report_failure(
    args: Sequence[str], exit_code: int, text: str, problems: Sequence[Problem]
) -> NoReturn:
    """The text on stderr, and with --json the one document on stdout; exit with `exit_code`."""
    say(f"{text}\n")
    command = json_command(args)
    if command is not None:
        emit_json(render.envelope(command, exit_code, None, problems))
    raise SystemExit(exit_code)
