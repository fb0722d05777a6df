"""`--setup` on this machine: the agent runs the commands in `$SHELL` as a process group of
the job's, shows their output, and leaves nothing of them behind whatever happens."""

from __future__ import annotations

import os
import signal
import time
import uuid
from pathlib import Path

import pytest

from dtrain.remote import procs
from tests.conftest import PYTHON, ROOT, run_dtrain, start_dtrain, wait_gone

SHELL_ENV = {**os.environ, "SHELL": "/bin/sh"}
LAUNCH = ["launch", "-n", "1", "-s", "0"]


def marked(mark: str) -> list[int]:
    """Live processes whose environment holds SETUP_MARK=`mark` (tagged by dtrain or not)."""
    found = []
    for pid, proc in procs.snapshot().items():
        if proc.state != "Z" and (procs.read_environ(pid) or {}).get("SETUP_MARK") == mark:
            found.append(pid)
    return found


def assert_none_left(mark: str) -> None:
    left = wait_gone(marked(mark), 10.0)
    assert left == [], procs.describe(procs.snapshot(), left)


def wait_marked(mark: str, count: int, timeout_s: float = 30) -> None:
    """Wait until `count` processes carry the mark (the setup is running)."""
    deadline = time.monotonic() + timeout_s
    while len(marked(mark)) < count:
        assert time.monotonic() < deadline, f"{count} setup processes did not start"
        time.sleep(0.05)


def test_setup_values_reach_local_tasks_and_job_variables_win(tmp_path: Path) -> None:
    args = [*LAUNCH, "--setup", "export A=setup B=setup", "--env", "B=job"]
    result = run_dtrain([*args, "--", "sh", "-c", 'echo "got $A $B"'], tmp_path, env=SHELL_ENV)
    assert result.returncode == 0, result.stderr
    assert "got setup job" in result.stdout


def test_a_failing_setup_shows_its_stderr_and_exit_code_and_starts_nothing(
    tmp_path: Path,
) -> None:
    mark = uuid.uuid4().hex
    setup = f"export SETUP_MARK={mark}; sleep 1000 & echo broken-env >&2; false"
    result = run_dtrain(
        [*LAUNCH, "--setup", setup, "--", "sh", "-c", "echo ran"], tmp_path, env=SHELL_ENV
    )
    assert result.returncode == 3, result.stderr
    assert "ran" not in result.stdout
    assert f"setup command `{setup}` failed (exit 1)" in result.stderr, result.stderr
    assert "its stderr ended: broken-env" in result.stderr, result.stderr
    assert "[setup@" in result.stderr  # and as it came
    assert "--remote-python" not in result.stderr and "python3" not in result.stderr
    assert_none_left(mark)


def test_an_exit_in_the_setup_is_named_as_such(tmp_path: Path) -> None:
    result = run_dtrain(
        [
            *LAUNCH,
            *("--setup", "echo first", "--setup", "exit 3", "--setup", "echo never"),
            *("--", "true"),
        ],
        tmp_path,
        env=SHELL_ENV,
    )
    assert result.returncode == 3, result.stderr
    assert "setup command `exit 3` exited the setup shell with code 3" in result.stderr
    assert "never" not in result.stderr
    assert "--remote-python" not in result.stderr


def test_a_hanging_setup_is_stopped_after_its_own_time_and_named(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    setup = f"export SETUP_MARK={mark}; sleep 1000 & echo waiting-for-lock >&2; sleep 1000"
    started = time.monotonic()
    result = run_dtrain(
        [*LAUNCH, "--setup-timeout", "2", "--setup", setup, "--", "true"],
        tmp_path,
        env=SHELL_ENV,
    )
    assert result.returncode == 3, result.stderr
    assert f"the setup did not finish within 2s (still running: `{setup}`)" in result.stderr
    assert "waiting-for-lock" in result.stderr and "--setup-timeout" in result.stderr
    assert "check the load and network" not in result.stderr
    assert time.monotonic() - started < 25  # generous: its own 2 s, not a request's 30
    assert_none_left(mark)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGKILL, -9)])
def test_ctrl_c_or_dtrain_killed_during_the_setup_stops_it_and_what_it_started(
    tmp_path: Path, signum: int, code: int
) -> None:
    mark = uuid.uuid4().hex
    setup = f"export SETUP_MARK={mark}; sleep 1000 & sleep 1000"
    proc = start_dtrain([*LAUNCH, "--setup", setup, "--", "true"], tmp_path, env=SHELL_ENV)
    try:
        wait_marked(mark, 2)  # its two sleeps
        proc.send_signal(signum)
        _, stderr = proc.communicate(timeout=30)
    finally:
        proc.kill()
        proc.wait()
    assert proc.returncode == code, stderr
    assert_none_left(mark)


def test_what_the_setup_starts_in_the_background_is_the_jobs_until_it_ends(
    tmp_path: Path,
) -> None:
    """A task sees it alive and tagged with its own job (the preflight does not call it
    stale); once the job ends it is gone."""
    mark = uuid.uuid4().hex
    show = (
        "import os\n"
        "from dtrain.remote import procs\n"
        "for pid, p in procs.snapshot().items():\n"
        "    env = procs.read_environ(pid) or {}\n"
        f"    if env.get('SETUP_MARK') == '{mark}' and p.state != 'Z':\n"
        "        same = env.get('DTRAIN_JOB_ID') == os.environ['DTRAIN_JOB_ID']\n"
        "        task = env.get('DTRAIN_TASK', '').split('@')[0]\n"
        "        print('bg', task, 'same-job' if same else 'other')\n"
    )
    result = run_dtrain(
        [*LAUNCH, "--setup", f"export SETUP_MARK={mark}; sleep 1000 &", "--", PYTHON, "-c", show],
        tmp_path,
        env={**SHELL_ENV, "PYTHONPATH": str(ROOT)},
    )
    assert result.returncode == 0, result.stderr
    assert "bg setup same-job" in result.stdout, result.stdout + result.stderr
    assert_none_left(mark)


def test_a_launch_that_fails_after_the_setup_leaves_none_of_it(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    result = run_dtrain(
        [
            *LAUNCH,
            *("--setup", f"export SETUP_MARK={mark}; sleep 1000 &"),
            *("--", "no-such-command-here"),
        ],
        tmp_path,
        env=SHELL_ENV,
    )
    assert result.returncode != 0 and "no-such-command-here" in result.stderr, result.stderr
    assert_none_left(mark)


def test_doctor_stops_a_hanging_setup_after_its_own_time_too(tmp_path: Path) -> None:
    mark = uuid.uuid4().hex
    setup = f"export SETUP_MARK={mark}; sleep 1000 & sleep 1000"
    result = run_dtrain(
        ["doctor", "--setup-timeout", "2", "--setup", setup], tmp_path, env=SHELL_ENV
    )
    assert result.returncode == 3, result.stdout + result.stderr
    assert "the setup did not finish within 2s" in result.stdout + result.stderr
    assert_none_left(mark)


def test_doctor_fails_this_machine_when_its_setup_fails(tmp_path: Path) -> None:
    """Before, doctor skipped this machine's row and said every check passed (exit 0)."""
    result = run_dtrain(["doctor", "--setup", "echo nope >&2; false"], tmp_path, env=SHELL_ENV)
    assert result.returncode == 3, result.stdout + result.stderr
    assert "setup command `echo nope >&2; false` failed (exit 1)" in result.stdout
    assert "every check passed" not in result.stdout


def test_megabytes_of_setup_output_go_to_stderr_line_by_line(tmp_path: Path) -> None:
    setup = "i=0; while [ $i -lt 20000 ]; do echo line-$i-" + "x" * 90 + "; i=$((i+1)); done"
    result = run_dtrain(
        [*LAUNCH, "--setup", setup, "--", "echo", "task-ran"],
        tmp_path,
        env=SHELL_ENV,
        timeout_s=120,
    )
    assert result.returncode == 0, result.stderr[-2000:]
    lines = [line for line in result.stderr.splitlines() if line.startswith("[setup@")]
    assert len(lines) == 20000 and lines[-1].endswith("line-19999-" + "x" * 90)
    assert "task-ran" in result.stdout
