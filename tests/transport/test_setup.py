"""`--setup` on this machine: the local agent starts after the commands, in `$SHELL`."""

from __future__ import annotations

import os
from pathlib import Path

from tests.conftest import run_dtrain


def test_setup_values_reach_local_tasks_and_job_variables_win(tmp_path: Path) -> None:
    env = {**os.environ, "SHELL": "/bin/sh"}
    args = ["launch", "-n", "1", "-s", "0", "--setup", "export A=setup B=setup", "--env", "B=job"]
    result = run_dtrain([*args, "--", "sh", "-c", 'echo "got $A $B"'], tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    assert "got setup job" in result.stdout


def test_a_failing_local_setup_starts_nothing_and_says_which_command(tmp_path: Path) -> None:
    env = {**os.environ, "SHELL": "/bin/sh"}
    args = ["launch", "-n", "1", "-s", "0", "--setup", "echo broken-env >&2; false"]
    result = run_dtrain([*args, "--", "sh", "-c", "echo ran"], tmp_path, env=env)
    assert result.returncode != 0
    assert "ran" not in result.stdout
    assert "setup command `echo broken-env >&2; false` failed" in result.stderr, result.stderr
    assert "broken-env" in result.stderr
