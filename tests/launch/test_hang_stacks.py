"""A hung local job's automatic stacks: real agent, real tasks, real py-spy."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

import pytest

import dtrain.processes
from dtrain.launch.lifecycle import StacksOnDemand
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
    assert f"dtrain: stacks: every task's full stack: dtrain-logs/{job.name}/" in stderr
    assert stderr.index("reached its --timeout") < stderr.index("dtrain: stacks:")


def test_no_stacks_stops_a_timed_out_job_without_them(tmp_path: Path) -> None:
    stderr = launch_until_timeout(tmp_path, "--no-stacks")
    assert "stacks:" not in stderr
    assert list(latest_job(tmp_path).glob("stacks-*")) == []


def test_a_job_that_does_not_hang_never_loads_the_stack_taker(tmp_path: Path) -> None:
    code = (
        "import sys\n"
        "from dtrain.cli import main\n"
        "try:\n"
        f"    main(['launch', '-n', '2', '--', {PYTHON!r}, '-c', 'pass'])\n"
        "except SystemExit as exc:\n"
        "    print('exit', exc.code)\n"
        "print('dtrain.processes.stacks' in sys.modules)\n"
    )
    result = subprocess.run(
        [PYTHON, "-c", code], cwd=tmp_path, capture_output=True, text=True, timeout=60
    )
    assert result.stdout.split() in (["False"], ["exit", "0", "False"]), result.stderr


def test_a_stack_taker_that_cannot_load_says_so_and_lets_the_job_stop(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setitem(sys.modules, "dtrain.processes.stacks", None)  # import raises
    monkeypatch.delattr(dtrain.processes, "stacks", raising=False)  # even once loaded
    taker = StacksOnDemand({}, "job-1", tmp_path, 1.0)
    assert not taker.is_done() and taker.summary() == []
    taker.start()
    assert taker.is_done()
    (line,) = taker.summary()
    assert line.startswith("cannot load dtrain's stack taker (import of dtrain.processes.stacks")
    assert line.endswith("): reinstall dtrain")
