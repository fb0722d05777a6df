"""`--max-restarts` on this machine, with real processes: what restarts, what never does, the
records it leaves, and that nothing is left running between attempts or after the last.

No timing in pass/fail beyond generous lower bounds on the waits dtrain was told to keep.
"""

from __future__ import annotations

import itertools
import json
import signal
import time
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import (
    PYTHON,
    job_pids,
    latest_job,
    program,
    run_dtrain,
    start_dtrain,
    wait_for_latest,
)

PROBE = program("restart_probe.py")
FAST = ["--restart-delay", "0", "--restart-window", "0", "--grace", "1"]


def job_json(cwd: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((latest_job(cwd) / "job.json").read_text())
    return document


def first_lines(log: Path) -> dict[str, Any]:
    line: dict[str, Any] = json.loads(log.read_text().splitlines()[0])
    return line


def wait_for_json(cwd: Path, key: str, timeout_s: float = 30.0) -> dict[str, Any]:
    """Wait until the newest job.json has `key` set (not None); return it."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        job_dir = wait_for_latest(cwd, timeout_s)
        try:
            document: dict[str, Any] = json.loads((job_dir / "job.json").read_text())
        except (OSError, ValueError):
            document = {}
        if document.get(key) is not None:
            return document
        time.sleep(0.05)
    raise AssertionError(f"job.json never had {key} within {timeout_s}s")


@pytest.mark.parametrize("framework", ["dmlc", "torch"])
def test_fails_on_attempt_one_succeeds_on_two_with_both_attempts_kept(
    workdir: Path, framework: str
) -> None:
    done = run_dtrain(
        ["launch", "--framework", framework, "-n", "2", "--max-restarts", "2", *FAST, "--",
         PYTHON, PROBE, "worker.1", "1", "7", "0.3"],
        workdir,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "attempt 1 of 3 failed: worker.1 exited with code 7" in done.stderr
    document = job_json(workdir)
    assert document["state"] == "succeeded"
    assert [(a["attempt"], a["exit_code"]) for a in document["attempts"]] == [(1, 7), (2, 0)]
    assert document["attempts"][0]["root_cause"]["label"] == "worker.1"
    job_dir = latest_job(workdir)
    names = sorted(p.name for p in (job_dir / "attempt-1").iterdir())
    assert names == sorted(p.name for p in (job_dir / "attempt-2").iterdir())
    for attempt in (1, 2):
        for log in (job_dir / f"attempt-{attempt}").glob("*.log"):
            env = first_lines(log)
            assert env["DTRAIN_RESTART_COUNT"] == str(attempt - 1), log
            assert env["DTRAIN_MAX_RESTARTS"] == "2"
            torch_count = env["TORCHELASTIC_RESTART_COUNT"]
            assert torch_count == (str(attempt - 1) if framework == "torch" else None)
    assert (job_dir / "worker.1.log").resolve() == job_dir / "attempt-2" / "worker.1.log"
    assert not job_pids(job_dir.name)


def test_always_failing_runs_every_attempt_and_keeps_the_backoff(workdir: Path) -> None:
    done = run_dtrain(
        ["launch", "-n", "1", "-s", "1", "--max-restarts", "2", "--restart-delay", "0.5",
         "--max-restart-delay", "0.8", "--restart-window", "0", "--grace", "1", "--",
         PYTHON, PROBE, "all", "99", "5", "0.2"],
        workdir,
    )  # fmt: skip
    assert done.returncode == 5, done.stderr
    assert "no restarts left (--max-restarts 2)" in done.stderr
    attempts = job_json(workdir)["attempts"]
    assert [a["exit_code"] for a in attempts] == [5, 5, 5]
    gaps = [b["started_at"] - a["ended_at"] for a, b in itertools.pairwise(attempts)]
    assert gaps[0] >= 0.5 * 0.8 and gaps[1] >= 0.8 * 0.8  # the doubled delay, the cap, jitter


@pytest.mark.parametrize("when", ["running", "waiting"])
@pytest.mark.parametrize("how", ["ctrl-c", "dtrain kill"])
def test_a_stop_on_purpose_is_never_restarted(workdir: Path, when: str, how: str) -> None:
    code = "hang" if when == "running" else "5"
    process = start_dtrain(
        ["launch", "-n", "1", "-s", "1", "--max-restarts", "3", "--restart-delay", "60",
         "--restart-window", "0", "--grace", "1", "--", PYTHON, PROBE, "worker.0", "9", code],
        workdir,
    )  # fmt: skip
    try:
        wait_for_json(workdir, "tasks_started_at" if when == "running" else "next_attempt_at")
        shown = run_dtrain(["ps"], workdir, timeout_s=30)
        if when == "waiting":
            assert "attempt 1 of 4 failed; attempt 2 starts at" in shown.stdout
        else:
            assert "attempt 1 of 4 running" in shown.stdout
        if how == "ctrl-c":
            process.send_signal(signal.SIGINT)
        else:
            killed = run_dtrain(["kill"], workdir, timeout_s=30)
            assert killed.returncode == 0, killed.stderr
            assert "its launcher" in killed.stderr
        _, stderr = process.communicate(timeout=30)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    expected = 130 if how == "ctrl-c" else 143
    assert process.returncode == expected, stderr
    document = job_json(workdir)
    assert len(document["attempts"]) == 1 and document["state"] == "interrupted"
    assert not job_pids(latest_job(workdir).name)


def test_a_failure_within_the_restart_window_is_not_restarted(workdir: Path) -> None:
    done = run_dtrain(
        ["launch", "-n", "1", "-s", "1", "--max-restarts", "3", "--restart-delay", "0", "--",
         PYTHON, PROBE, "worker.0", "9", "4"],
        workdir,
    )  # fmt: skip
    assert done.returncode == 4
    assert "within --restart-window 5s (a start-up failure): never restarted" in done.stderr
    assert len(job_json(workdir)["attempts"]) == 1


@pytest.mark.parametrize(
    ("code", "flags", "why"),
    [
        ("127", [], "cannot run"),
        ("3", ["--no-restart-on", "3,137"], "--no-restart-on"),
    ],
)
def test_exit_codes_that_never_restart(
    workdir: Path, code: str, flags: list[str], why: str
) -> None:
    done = run_dtrain(
        ["launch", "-n", "1", "-s", "1", "--max-restarts", "3", *FAST, *flags, "--",
         PYTHON, PROBE, "worker.0", "9", code],
        workdir,
    )  # fmt: skip
    assert done.returncode == int(code)
    assert why in done.stderr
    assert len(job_json(workdir)["attempts"]) == 1


def test_a_task_that_cannot_start_is_not_restarted(workdir: Path) -> None:
    done = run_dtrain(
        ["launch", "-n", "1", "--max-restarts", "3", *FAST, "--", "no-such-command-here"],
        workdir,
    )
    assert done.returncode == 3, done.stderr
    assert "attempt 2" not in done.stderr


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (["--max-restarts", "-1"], "--max-restarts"),
        (["--max-restarts", "1", "--no-restart-on", "x"], "--no-restart-on 'x'"),
        (["--min-hosts", "1"], "--min-hosts only matters"),
        (["--max-restarts", "1", "--restart-delay", "nan"], "--restart-delay"),
    ],
)
def test_bad_restart_flags_are_one_line_exit_2(
    workdir: Path, flags: list[str], message: str
) -> None:
    done = run_dtrain(["launch", "-n", "1", *flags, "--", PYTHON, "-c", "pass"], workdir)
    assert done.returncode == 2
    assert message in done.stderr
    assert "Traceback" not in done.stderr
    assert not (workdir / "dtrain-logs" / "latest").exists()


def test_without_restarts_the_logs_stay_where_they_were(workdir: Path) -> None:
    done = run_dtrain(["launch", "-n", "1", "--", PYTHON, PROBE, "none", "0", "0"], workdir)
    assert done.returncode == 0, done.stderr
    job_dir = latest_job(workdir)
    assert (job_dir / "worker.0.log").is_file() and not (job_dir / "worker.0.log").is_symlink()
    assert first_lines(job_dir / "worker.0.log")["DTRAIN_RESTART_COUNT"] is None
    assert "attempts" not in job_json(workdir)
