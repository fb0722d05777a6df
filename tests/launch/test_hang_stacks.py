"""A hung local job's automatic stacks: real agent, real tasks, real py-spy."""

from __future__ import annotations

from pathlib import Path

from tests.conftest import PYTHON, latest_job, program, run_dtrain

STUCK = program("where_stuck.py")
LAUNCH = ["launch", "--framework", "torch", "-n", "2", "--timeout", "3", "--grace", "1"]


def launch_until_timeout(cwd: Path, *flags: str) -> str:
    result = run_dtrain([*LAUNCH, *flags, "--", PYTHON, STUCK, "worker.1"], cwd)
    assert result.returncode == 124, result.stderr
    return result.stderr


def test_a_timed_out_job_leaves_every_tasks_stack_and_prints_the_summary(tmp_path: Path) -> None:
    stderr = launch_until_timeout(tmp_path)
    job = latest_job(tmp_path)
    (written,) = job.glob("stacks-*")
    names = sorted(p.name.split("@")[0] for p in written.iterdir())
    assert names == ["summary.txt", "worker.0", "worker.1"]
    assert "wait_for_peer" in next(written.glob("worker.0@*")).read_text()
    assert "dtrain: stacks: 1 task (worker.1@" in stderr
    assert "): in compute_step (where_stuck.py:" in stderr
    assert f"dtrain: stacks: every task's full stack is in dtrain-logs/{job.name}/" in stderr
    assert stderr.index("reached its --timeout") < stderr.index("dtrain: stacks:")


def test_no_stacks_stops_a_timed_out_job_without_them(tmp_path: Path) -> None:
    stderr = launch_until_timeout(tmp_path, "--no-stacks")
    assert "stacks:" not in stderr
    assert list(latest_job(tmp_path).glob("stacks-*")) == []
