"""How each launcher is asked to run the same job: N hosts x K copies of one task command.

Each launcher is used the way its users use it, pointed at the test cluster without touching
~/.ssh: dtrain with `--ssh-config`, pdsh through PDSH_SSH_ARGS, hand-written one-ssh-per-task
with `ssh -F`, and the dmlc tracker (which runs a bare `ssh`) through an `ssh` wrapper placed
first in its PATH. Builders return plain data (argv and environment); nothing here starts a
process.
"""

from __future__ import annotations

import compileall
import os
import shlex
import sys
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
TASK_PROGRAM = REPO / "bench" / "task.py"
TASK_INTERPRETER = ("/usr/bin/python3", "-S")
TRACKER_SHIM = REPO / "bench" / "tracker_shim.py"
PYTHON_FLOOR = REPO / "bench" / "pyfloor.py"
VENV_BIN = Path(sys.executable).parent


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

    def hosts_file(self, job: Job, with_slots: bool) -> Path:
        slots = f" slots={job.per_host}" if with_slots else ""
        text = "".join(f"{host}{slots}\n" for host in job.hosts)
        path = self.scratch / f"hosts-{len(job.hosts)}x{job.per_host}-{int(with_slots)}"
        path.write_text(text)
        return path

    def ssh_wrapper_dir(self) -> Path:
        """A directory holding `ssh` that runs OpenSSH with the cluster's config (-F)."""
        folder = self.scratch / "ssh-wrapper"
        wrapper = folder / "ssh"
        if not wrapper.exists():
            folder.mkdir(parents=True, exist_ok=True)
            wrapper.write_text(f'#!/bin/sh\nexec /usr/bin/ssh -F {self.ssh_config} "$@"\n')
            wrapper.chmod(0o755)
        return folder


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


def dmlc_tracker(job: Job, setup: Setup) -> Command:
    """mxnet's tools/launch.py in ssh mode: servers then workers, round robin over the hosts.

    -s 1 -n N-1 gives exactly N remote tasks; it also runs the scheduler here, locally.
    """
    argv = [sys.executable, str(TRACKER_SHIM), str(tracker_launch_py())]
    argv += ["-n", str(job.tasks - 1), "-s", "1", "--launcher", "ssh"]
    argv += ["-H", str(setup.hosts_file(job, with_slots=False))]
    path = f"{setup.ssh_wrapper_dir()}{os.pathsep}{os.environ.get('PATH', os.defpath)}"
    return Command((*argv, *job.task_argv), {"PATH": path})


AGENT = "dtrain's agent"
AGENT_C_ONLY = "the agent's C modules"
# What the agent imports beyond a bare interpreter's own: C modules where the standard ones
# around them (json, signal, socket, selectors, threading, base64) would bring enum, re,
# locale and collections.
AGENT_C_MODULES = (
    "_json", "_signal", "_socket", "_thread", "binascii", "errno", "fcntl",
    "marshal", "select", "stat", "struct", "time", "types", "zlib",
)  # fmt: skip

FLOOR = "pyfloor"  # the trivial job only: what any Python launcher pays


def python_floor(job: Job, setup: Setup) -> Command:
    """The least a Python launcher does (`bench/pyfloor.py`), under the interpreter dtrain runs
    under, each host running what pdsh has it run: the trivial job only (it neither tears down
    nor forwards signals)."""
    argv = [sys.executable, str(PYTHON_FLOOR), str(setup.ssh_config), ",".join(job.hosts)]
    return Command((*argv, per_host_command(job)))


def dtrain_path_python(job: Job, setup: Setup) -> Command:
    """dtrain with its agent under `python3` from the login PATH (a pyenv shim on these
    hosts), where the default (auto) picks the system python3 first: what the default saves."""
    command = dtrain(job, setup)
    split = command.argv.index("--")
    argv = (*command.argv[:split], "--remote-python", "python3", *command.argv[split:])
    return Command(argv, command.env)


def dtrain_local(job: Job, setup: Setup) -> Command:
    """dtrain with no hosts file: every task on this machine (for its local figures)."""
    argv = [str(VENV_BIN / "dtrain"), "launch", "--framework", "torch", "-n", str(job.tasks)]
    argv += ["--log-dir", str(setup.scratch / "dtrain-logs")]
    return Command((*argv, "--", *job.task_argv))


def tracker_launch_py() -> Path:
    """launch.py inside the installed mxnet wheel, found without importing mxnet."""
    import importlib.util

    spec = importlib.util.find_spec("mxnet")
    if spec is None or not spec.submodule_search_locations:
        raise RuntimeError("mxnet is not installed in this environment (pip install mxnet)")
    return Path(next(iter(spec.submodule_search_locations))) / "tools" / "launch.py"


BUILDERS = {
    "dtrain": dtrain,
    "pdsh": pdsh,
    "ssh": ssh_per_task,
    "tracker": dmlc_tracker,
    "dtrain-local": dtrain_local,
    "dtrain-pathpy": dtrain_path_python,
    FLOOR: python_floor,
}
SPLIT = "dtrain-split"  # log only: two dtrain launchers at once, each with half the hosts
LABELS = {
    "dtrain": "dtrain",
    "pdsh": "pdsh",
    "ssh": "ssh per task",
    "tracker": "dmlc tracker",
    "dtrain-local": "dtrain (local)",
    "dtrain-pathpy": "dtrain --remote-python python3 (login PATH)",
    FLOOR: "Python floor",
    SPLIT: "dtrain, two launchers of half the hosts each",
}


def command(launcher: str, job: Job, setup: Setup) -> Command:
    return BUILDERS[launcher](job, setup)
