"""How each launcher is asked to run the same job: N hosts x K copies of one task command.

Each launcher is used the way its users use it, pointed at the test cluster without touching
~/.ssh: dtrain with `--ssh-config`, pdsh through PDSH_SSH_ARGS, hand-written one-ssh-per-task
with `ssh -F`. "dtrain (before)" is the same command with another dtrain tree first on
PYTHONPATH (`--before`). Builders return plain data (argv and environment); nothing here
starts a process.
"""

from __future__ import annotations

import compileall
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TASK_PROGRAM = REPO / "bench" / "task.py"
TASK_INTERPRETER = ("/usr/bin/python3", "-S")
VENV_BIN = Path(sys.executable).parent
BEFORE = "before"


def compile_dtrain(checkout: Path = REPO) -> None:
    """Byte-compile a checkout's dtrain, as installing it does. An editable checkout under
    PYTHONDONTWRITEBYTECODE (or read-only) would otherwise compile every module it imports at
    every launch: ~0.1 s that an installed dtrain never pays, and that would differ between
    two checkouts compared side by side."""
    compileall.compile_dir(checkout / "dtrain", quiet=1)


@dataclass(frozen=True)
class Job:
    """`per_host` copies of `task_argv` on each of `hosts` (ssh aliases h1..hN)."""

    hosts: tuple[str, ...]
    per_host: int
    task_argv: tuple[str, ...]

    @property
    def tasks(self) -> int:
        return len(self.hosts) * self.per_host

    @property
    def placement(self) -> list[str]:
        """Host of each task, round robin as the dmlc tracker places them."""
        return [self.hosts[i % len(self.hosts)] for i in range(self.tasks)]


@dataclass(frozen=True)
class Command:
    argv: tuple[str, ...]
    env: Mapping[str, str] = field(default_factory=dict)


@dataclass(frozen=True)
class Setup:
    """Where the cluster's ssh settings and the run's scratch files are."""

    ssh_config: Path
    scratch: Path
    before: Path | None = None  # the tree "dtrain (before)" runs

    def hosts_file(self, job: Job, with_slots: bool) -> Path:
        slots = f" slots={job.per_host}" if with_slots else ""
        text = "".join(f"{host}{slots}\n" for host in job.hosts)
        path = self.scratch / f"hosts-{len(job.hosts)}x{job.per_host}-{int(with_slots)}"
        path.write_text(text)
        return path


def task_argv(
    stamp_dir: Path, mode: str, expect: int, life_s: float, megabytes: float = 0.0
) -> tuple[str, ...]:
    """The task command line; it holds the stamp directory, which is the run's tag."""
    argv = [*TASK_INTERPRETER, str(TASK_PROGRAM), "--dir", str(stamp_dir), "--mode", mode]
    argv += ["--expect", str(expect), "--life", f"{life_s:g}"]
    if megabytes:
        argv += ["--mb", f"{megabytes:g}"]
    return tuple(argv)


def _wait_all() -> str:
    """bash: wait for every pid in $pids; exit with the first non-zero status in start order.

    (`wait -n` would give the first to end, but loses children that ended before it runs.)
    """
    return 'rc=0; for p in $pids; do wait "$p"; s=$?; [ "$rc" -eq 0 ] && rc=$s; done; exit $rc'


def dtrain(job: Job, setup: Setup) -> Command:
    """dtrain's collective mode puts `per_host` ranks on each host and nothing locally."""
    argv = [str(VENV_BIN / "dtrain"), "launch", "--framework", "torch"]
    argv += ["-n", str(job.tasks), "--nproc-per-host", str(job.per_host)]
    argv += ["-H", str(setup.hosts_file(job, with_slots=True))]
    argv += ["--ssh-config", str(setup.ssh_config), "--log-dir", str(setup.scratch / "dtrain-logs")]
    return Command((*argv, "--", *job.task_argv))


def per_host_command(job: Job) -> str:
    """The command one ssh session runs on each host: the task, or `per_host` copies of it
    started by the login shell and waited for."""
    task = shlex.join(job.task_argv)
    if job.per_host == 1:
        return task
    remote = f'pids=""; for ((i = 0; i < {job.per_host}; i++)); do {task} & pids="$pids $!"; '
    return remote + "done; " + _wait_all()


def pdsh(job: Job, setup: Setup) -> Command:
    """One ssh per host (as DeepSpeed runs it: -S for the worst exit code, wide fan-out)."""
    remote = per_host_command(job)
    argv = ["pdsh", "-S", "-R", "ssh", "-f", str(max(32, len(job.hosts)))]
    argv += ["-w", ",".join(job.hosts), remote]
    env = {"PDSH_SSH_ARGS": f"-F {setup.ssh_config} -x -a -l%u %h"}
    return Command(tuple(argv), env)


def ssh_per_task(job: Job, setup: Setup) -> Command:
    """The hand-written launcher: a shell starts `ssh host cmd &` per task and waits for all."""
    task = shlex.quote(shlex.join(job.task_argv))
    config = shlex.quote(str(setup.ssh_config))
    lines = [f'ssh -F {config} -n {host} {task} & pids="$pids $!"' for host in job.placement]
    script = "\n".join(['pids=""', *lines, _wait_all()])
    return Command(("bash", "-c", script))


def dtrain_before(job: Job, setup: Setup) -> Command:
    """The same dtrain command, importing the `--before` tree's dtrain (first on PYTHONPATH)."""
    assert setup.before is not None
    return Command(dtrain(job, setup).argv, {"PYTHONPATH": str(setup.before)})


BUILDERS = {
    "dtrain": dtrain,
    BEFORE: dtrain_before,
    "pdsh": pdsh,
    "ssh": ssh_per_task,
}
LABELS = {
    "dtrain": "dtrain",
    BEFORE: "dtrain (before)",
    "pdsh": "pdsh",
    "ssh": "ssh per task",
}


def command(launcher: str, job: Job, setup: Setup) -> Command:
    return BUILDERS[launcher](job, setup)
