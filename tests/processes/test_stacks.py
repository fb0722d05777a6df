"""`dtrain stacks` on this machine: real tagged processes, a real local agent, real py-spy."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

from dtrain.processes import stacks
from dtrain.processes.stackgroups import HostStacks, StacksReport, TaskStack
from dtrain.remote import procs
from tests.conftest import PYTHON, program, run_dtrain
from tests.processes.test_sweep import Spawner, new_job, spawn, wait_for_job  # noqa: F401

STUCK = program("where_stuck.py")
SYSTEM_PYTHON = "/usr/bin/python3"  # a Python with no py-spy beside it


def wait_ready(pids: list[int], timeout_s: float = 10.0) -> None:
    """Until every process has imported enough to be in its named function."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all((procs.read_stat(pid) or ("?",))[0] in ("S", "R", "T") for pid in pids):
            time.sleep(0.5)  # past `import` and into the function
            return
        time.sleep(0.05)


def test_stacks_of_local_tasks_are_grouped_written_and_complete_in_json(
    spawn: Spawner,  # noqa: F811
    tmp_path: Path,
) -> None:
    job = new_job()
    for task in ("worker.0", "worker.1", "worker.2"):
        spawn([PYTHON, STUCK, "worker.1"], job, task=task)
    spawn(["sleep", "3600"], job, task="server.0")
    wait_ready(wait_for_job(job, 4))
    (tmp_path / "dtrain-logs" / job).mkdir(parents=True)

    result = run_dtrain(["stacks", "--job", job], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert re.match(r"1 task \(worker\.1@.+\): in compute_step \(where_stuck\.py:2\d\)", lines[0])
    assert re.match(r"2 tasks \(worker\.0@.+, worker\.2@.+\): in wait_for_peer", lines[1])
    assert lines[2] == "1 process is not Python (sleep): no stacks"
    (written,) = (tmp_path / "dtrain-logs" / job).glob("stacks-*")
    assert lines[3] == f"every task's full stack: dtrain-logs/{job}/{written.name}/"
    names = sorted(p.name.split("@")[0] for p in written.iterdir())
    assert names == ["server.0", "summary.txt", "worker.0", "worker.1", "worker.2"]

    document = json.loads(run_dtrain(["stacks", "--job", job, "--json"], tmp_path).stdout)
    assert document["status"] == "ok"
    tasks = {t["task"]: t for t in document["data"]["tasks"]}
    assert set(tasks) == {"server.0", "worker.0", "worker.1", "worker.2"}
    assert tasks["server.0"]["python"] is False and tasks["server.0"]["threads"] is None
    assert all(tasks[f"worker.{i}"]["threads"] for i in range(3))


def test_a_stopped_task_has_its_stack_taken_and_stays_stopped(
    spawn: Spawner,  # noqa: F811
    tmp_path: Path,
) -> None:
    job = new_job()
    leader = spawn([PYTHON, STUCK, "none"], job, task="worker.0")
    wait_ready(wait_for_job(job, 1))
    os.kill(leader.pid, signal.SIGSTOP)
    try:
        result = run_dtrain(["stacks", "--job", job], tmp_path)
        assert result.returncode == 0, result.stderr
        assert "): in wait_for_peer (where_stuck.py:15)" in result.stdout
        assert "no directory for job" in result.stdout  # nothing under ./dtrain-logs: said so
        stat = procs.read_stat(leader.pid)
        assert stat is not None and stat[0] == "T"  # dtrain did not resume it
    finally:
        os.kill(leader.pid, signal.SIGCONT)


def test_a_python_without_py_spy_beside_it_or_on_path_gets_one_clear_line(
    spawn: Spawner,  # noqa: F811
    tmp_path: Path,
) -> None:
    assert os.path.exists(SYSTEM_PYTHON), "this test needs the system Python"
    job = new_job()
    spawn(["env", "PATH=/usr/bin:/bin", SYSTEM_PYTHON, STUCK, "none"], job, task="worker.4")
    wait_ready(wait_for_job(job, 1))
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # the agent's own PATH has no py-spy either
    result = run_dtrain(["stacks", "--job", job], tmp_path, env=env)
    assert result.returncode == 3
    assert re.fullmatch(
        r"  \S+: no stacks for 1 process \(worker\.4@\S+\): py-spy is not installed "
        r"\(looked beside /usr/bin and on PATH\)",
        result.stderr.splitlines()[1],
    ), result.stderr
    hint = "hint: install it into the job's environment: /usr/bin/python3 -m pip install py-spy"
    assert hint in result.stderr
    assert "Traceback" not in result.stderr


def test_no_job_processes_is_an_answer_not_an_error(tmp_path: Path) -> None:
    result = run_dtrain(["stacks", "--job", "no-such-job"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert result.stdout == "no job processes of job no-such-job on 1 host\n"


def test_a_process_with_an_empty_job_id_writes_no_stacks_into_the_log_root(
    spawn: Spawner,  # noqa: F811
    tmp_path: Path,
) -> None:
    spawn([PYTHON, STUCK, "none"], "", task="worker.0")  # DTRAIN_JOB_ID= (set, empty)
    wait_ready(wait_for_job("", 1))
    root = tmp_path / "dtrain-logs"
    root.mkdir()
    result = run_dtrain(["stacks"], tmp_path)  # every job here: this one has no id to ask for
    assert "): in wait_for_peer (where_stuck.py:15)" in result.stdout, result.stderr
    assert list(root.iterdir()) == []


def test_a_python_found_on_path_is_named_in_the_hint_as_the_task_found_it(
    spawn: Spawner,  # noqa: F811
    tmp_path: Path,
) -> None:
    job = new_job()
    spawn(["env", "PATH=/usr/bin:/bin", "python3", STUCK, "none"], job, task="worker.5")
    wait_ready(wait_for_job(job, 1))
    env = {**os.environ, "PATH": "/usr/bin:/bin"}  # the agent's own PATH has no py-spy either
    result = run_dtrain(["stacks", "--job", job], tmp_path, env=env)
    assert result.returncode == 3, result.stderr
    hint = "hint: install it into the job's environment: /usr/bin/python3 -m pip install py-spy"
    assert hint in result.stderr


def test_stack_files_are_private_and_two_runs_in_one_second_never_share_a_directory(
    tmp_path: Path,
) -> None:
    stack = TaskStack("h1", 7, task="worker.0", threads=(), label="worker.0@h1")
    report = StacksReport((HostStacks("h1", (stack,)),))
    old_umask = os.umask(0)
    try:
        first = stacks.write_files(report, tmp_path, "20261127-120000")
        second = stacks.write_files(report, tmp_path, "20261127-120000")
    finally:
        os.umask(old_umask)
    assert first != second and second.name == "stacks-20261127-120000-2"
    for where in (first, second):
        assert where.stat().st_mode & 0o777 == 0o700
        files = sorted(p.name for p in where.iterdir())
        assert files == ["summary.txt", "worker.0@h1.txt"]
        assert {(where / name).stat().st_mode & 0o777 for name in files} == {0o600}
