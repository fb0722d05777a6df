"""The launcher off Linux: every --dry-run works without a Linux-only call on this machine, and
tasks on this machine fail in one line with what to do.

The program runs under tests/programs/off_linux.py, which takes `os.sched_getaffinity`,
`select.epoll` and /proc away from the launcher's process (psutil aside, which reads each system
its own way) and says each /proc access it refused. The remote commands' side is in
tests/cluster/test_off_linux_ssh.py.
"""

from __future__ import annotations

import json
import subprocess
from collections.abc import Sequence
from pathlib import Path

import pytest

from tests.conftest import PYTHON, program, run_dtrain, run_program

OFF_LINUX = program("off_linux.py")
REFUSED = "off-linux: refused"


def run_off_linux(
    args: Sequence[str],
    cwd: Path,
    timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """`dtrain ARGS` with the Linux-only calls gone from its interpreter, bounded in time."""
    return run_program([PYTHON, OFF_LINUX, *args], cwd, timeout_s, env)


def plan_shape(stdout: str) -> list[tuple[str, str, list[str]]]:
    """A --dry-run --json plan's tasks: name, host, argv (the job id and ports differ)."""
    plan = json.loads(stdout)["data"]["plan"]
    return [(t["name"], t["host"]["name"], t["argv"]) for t in plan["tasks"]]


def ssh_config(tmp_path: Path) -> list[str]:
    """Two hosts named in an ssh config (loopback addresses: nothing is connected to)."""
    config = tmp_path / "ssh_config"
    config.write_text(
        "Host gpu1\n  HostName 127.0.0.11\nHost gpu2\n  HostName 127.0.0.12\n"
        "Host *\n  StrictHostKeyChecking yes\n"
    )
    (tmp_path / "hosts").write_text("gpu1 slots=2\ngpu2 slots=2\n")
    return ["-H", "hosts", "--ssh-config", str(config)]


@pytest.mark.parametrize(
    "flags",
    [
        ["-n", "2", "-s", "1"],
        ["--framework", "torch", "-n", "2"],
        ["-n", "4", "-s", "2", "HOSTS", "--scheduler-host", "gpu1"],
        ["-n", "4", "-s", "2", "HOSTS"],
        ["--launcher", "slurm", "--nodes", "2", "--framework", "torch"],
    ],
)
def test_every_dry_run_plans_as_on_linux(tmp_path: Path, flags: list[str]) -> None:
    if "HOSTS" in flags:
        at = flags.index("HOSTS")
        flags = [*flags[:at], *ssh_config(tmp_path), *flags[at + 1 :]]
    args = ["launch", *flags, "--dry-run", "--json", "--", "python3", "train.py"]
    off = run_off_linux(args, tmp_path)
    assert off.returncode == 0, off.stderr
    assert REFUSED not in off.stderr
    assert plan_shape(off.stdout) == plan_shape(run_dtrain(args, tmp_path).stdout)
    text = run_off_linux([a for a in args if a != "--json"], tmp_path)
    assert text.returncode == 0 and REFUSED not in text.stderr, text.stderr
    assert "dry run: nothing was started" in text.stdout


HINT = (
    "  hint: run the tasks on Linux hosts: -H HOSTS, with --scheduler-host HOST for dmlc's "
    "scheduler (it runs on this machine otherwise); or run dtrain on Linux"
)


@pytest.mark.parametrize(("hosts", "tasks"), [(False, "4 tasks"), (True, "1 task")])
def test_tasks_on_this_machine_off_linux_fail_in_one_line_before_anything(
    tmp_path: Path, hosts: bool, tasks: str
) -> None:
    """With -H, the scheduler is the one task here; gpu1 and gpu2 would refuse a connection
    (nothing listens there): the refusal comes first."""
    flags = ssh_config(tmp_path) if hosts else []
    args = ["--platform", "darwin", "launch", "-n", "2", "-s", "1", *flags, "--", "true"]
    result = run_off_linux(args, tmp_path)
    assert result.returncode == 3
    assert result.stderr.splitlines() == [
        f"dtrain: {tasks} would run on this machine: dtrain's agent needs Linux "
        "(this machine runs darwin)",
        HINT,
    ]
    assert not (tmp_path / "dtrain-logs").exists()  # nothing was made, nothing started


def test_ps_of_this_machine_off_linux_says_its_agent_needs_linux(tmp_path: Path) -> None:
    result = run_off_linux(["--platform", "darwin", "ps"], tmp_path)
    assert result.returncode == 3
    assert "cannot start dtrain's agent: dtrain's agent needs Linux (this machine runs darwin)" in (
        result.stderr
    )
    assert f"  {HINT}" in result.stderr.splitlines()
    assert "Traceback" not in result.stderr
