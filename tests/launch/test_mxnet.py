"""A real MXNet `dist_sync` job (1 scheduler, 2 servers, 2 workers) through the local launcher."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from dtrain.remote import procs
from tests.conftest import PYTHON, ROOT, job_pids, run_dtrain, start_dtrain, wait_gone

EXAMPLE = str(ROOT / "examples" / "mxnet_dist_sync.py")


def test_mxnet_job_trains_and_every_worker_agrees(workdir: Path) -> None:
    result = run_dtrain(
        ["launch", "-n", "2", "-s", "2", "--", PYTHON, EXAMPLE, "--epochs", "2"],
        workdir,
        timeout_s=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    checksums = re.findall(r"\[worker\.\d\] worker rank \d checksum (\S+)", result.stdout)
    assert len(checksums) == 2 and checksums[0] == checksums[1], result.stdout[-2000:]
    assert "succeeded: 5 tasks" in result.stderr


def test_worker_killed_mid_run_fails_fast_and_leaves_nothing(workdir: Path) -> None:
    grace = 2.0
    proc = start_dtrain(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "2",
            "--grace",
            str(grace),
            "--",
            PYTHON,
            EXAMPLE,
            "--epochs",
            "50",
            "--sleep",
            "0.05",
        ],
        workdir,
    )
    try:
        log_dir = wait_for_training(workdir)
        job = log_dir.name
        pids = job_pids(job)
        victim = next(
            pid for pid in pids if (procs.read_environ(pid) or {}).get("DTRAIN_TASK") == "worker.1"
        )
        subprocess.run(["kill", "-9", str(victim)], check=True)
        killed_at = time.monotonic()
        _, stderr = proc.communicate(timeout=60)
        elapsed = time.monotonic() - killed_at
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert proc.returncode == 137, stderr[-3000:]
    assert elapsed < grace + 2, f"dtrain took {elapsed:.1f}s to fail the job"
    assert "failed: worker.1 was killed by SIGKILL from outside dtrain" in stderr
    assert wait_gone(pids, 1) == []


def test_worker_that_raises_and_hangs_is_caught_by_the_traceback_watch(workdir: Path) -> None:
    # MXNet's kvstore blocks a worker that raised at interpreter exit, forever; every other
    # process then waits forever too. dtrain names the worker and stops everything.
    started = time.monotonic()
    result = run_dtrain(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "2",
            "--traceback-timeout",
            "3",
            "--grace",
            "1",
            "--",
            PYTHON,
            EXAMPLE,
            "--epochs",
            "5",
            "--fail-worker",
            "0",
            "--fail-at-epoch",
            "2",
            "--fail-mode",
            "raise",
        ],
        workdir,
        timeout_s=120,
    )
    assert result.returncode == 1, result.stderr[-3000:]
    assert "printed an unhandled Python traceback and then hung" in result.stderr
    assert time.monotonic() - started < 60


def wait_for_training(workdir: Path, timeout_s: float = 90) -> Path:
    """Wait until both workers print an epoch line: the kvstore is up and training."""
    deadline = time.monotonic() + timeout_s
    latest = workdir / "dtrain-logs" / "latest"
    while time.monotonic() < deadline:
        if latest.exists():
            log_dir = latest.resolve()
            texts = [(log_dir / f"worker.{i}.log") for i in (0, 1)]
            if all(p.exists() and "epoch" in p.read_text(errors="replace") for p in texts):
                return log_dir
        time.sleep(0.1)
    raise AssertionError("the MXNet workers did not start training in time")
