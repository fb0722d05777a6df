"""`dtrain stacks` and a hung launch's automatic stacks on the real sshd cluster, with py-spy."""

from __future__ import annotations

import json
import re
import signal
import subprocess
import time
from pathlib import Path

from tests.cluster.netcluster import Cluster
from tests.cluster.test_doctor import doctor
from tests.cluster.test_launch_ssh import assert_nothing_left, run, ssh_args, start
from tests.conftest import PYTHON, ROOT, latest_job, program, run_dtrain

WHERE_STUCK = program("where_stuck.py")
SKIP_ALLREDUCE = program("torch_skip_allreduce.py")
SKIP_KVSTORE = program("mxnet_skip_kvstore.py")


def wait_for_lines(logs: Path, names: list[str], text: str, timeout_s: float = 120) -> None:
    """Wait until every named task's log holds `text`."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if all(
            (logs / f"{name}.log").exists() and text in (logs / f"{name}.log").read_text()
            for name in names
        ):
            return
        time.sleep(0.1)
    raise AssertionError(f"{text!r} not in every log of {names} within {timeout_s}s")


def hide_every_py_spy(cluster: Cluster, host: str, args: list[str], cwd: Path) -> None:
    """Hide on `host` each py-spy its agent finds for the job (beside the task's Python, on
    its PATH or the agent's: a pyenv shim, a system package), until it finds none, so the
    test does not depend on what else the machine has installed."""
    for _ in range(5):
        document = json.loads(run_dtrain([*args, "--json"], cwd).stdout)
        tools = {t["tool"] for t in document["data"]["tasks"] if t["host"] == host and t["tool"]}
        if not tools:
            return
        cluster.hide_path(host, *tools)
    raise AssertionError(f"{host} still finds py-spy after hiding five of them")


def stop(proc: subprocess.Popen[str], cluster: Cluster, job: str) -> None:
    proc.send_signal(signal.SIGINT)
    proc.communicate(timeout=60)
    assert_nothing_left(cluster, job)


def test_stacks_group_the_blocked_tasks_and_list_the_busy_one_first(
    cluster: Cluster, tmp_path: Path
) -> None:
    hosts = cluster.hosts_file(names=["h1", "h2"], slots=2)
    proc = start(
        cluster,
        ["launch", "--framework", "torch", "--", PYTHON, WHERE_STUCK, "worker.3"],
        tmp_path,
        hosts=hosts,
    )
    workers = [f"worker.{i}" for i in range(4)]
    deadline = time.monotonic() + 60
    while not (tmp_path / "dtrain-logs" / "latest").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    logs = latest_job(tmp_path)
    job = logs.name
    wait_for_lines(logs, workers, "ready")
    try:
        result = run_dtrain(["stacks", *ssh_args(cluster, hosts), "--job", job], tmp_path)
        assert result.returncode == 0, result.stderr
        lines = result.stdout.splitlines()
        busy = r"1 task \(worker.3@h2\): in compute_step \(where_stuck.py:2[0-4]\) <- <module> "
        assert re.fullmatch(busy + r"\(where_stuck.py:29\)", lines[0]), result.stdout
        assert lines[1] == (
            "3 tasks (worker.0@h1, worker.1@h1, worker.2@h2): in wait_for_peer "
            "(where_stuck.py:15) <- <module> (where_stuck.py:31)"
        ), result.stdout
        stacks_dir = Path(lines[2].split(": ", 1)[1].rstrip("/"))
        assert sorted(p.name for p in (tmp_path / stacks_dir).iterdir()) == [
            "summary.txt",
            *(f"worker.{i}@h{1 + i // 2}.txt" for i in range(4)),
        ]
        assert "wait_for_peer" in (tmp_path / stacks_dir / "worker.0@h1.txt").read_text()

        as_json = run_dtrain(
            ["stacks", *ssh_args(cluster, hosts), "--job", job, "--json"], tmp_path
        )
        document = json.loads(as_json.stdout)
        assert document["status"] == "ok" and document["exit_code"] == 0
        tasks = document["data"]["tasks"]
        assert sorted(t["label"] for t in tasks) == [f"worker.{i}@h{1 + i // 2}" for i in range(4)]
        assert all(t["threads"] for t in tasks)
        assert [g["count"] for g in document["data"]["groups"]] == [1, 3]

        hide_every_py_spy(
            cluster, "h2", ["stacks", *ssh_args(cluster, hosts), "--job", job], tmp_path
        )
        hidden = run_dtrain(["stacks", *ssh_args(cluster, hosts), "--job", job], tmp_path)
        assert hidden.returncode == 3, hidden.stderr
        assert hidden.stdout.splitlines()[0].startswith("2 tasks (worker.0@h1, worker.1@h1)")
        assert hidden.stderr.startswith(
            "dtrain: no stacks from 1 of 2 hosts; the other host is above\n"
            "  h2: no stacks for 2 processes (worker.2@h2, worker.3@h2): py-spy is not "
            f"installed (looked beside {ROOT}/.venv/bin"
        ), hidden.stderr
        assert f"hint: install it into the job's environment: {ROOT}/.venv/bin/python -m pip" in (
            hidden.stderr
        )
        assert "Traceback" not in hidden.stderr

        _, checked, _ = doctor(cluster, ["--", PYTHON, WHERE_STUCK], tmp_path, hosts)
        assert checked[("stacks", "h1")]["status"] == "pass"
        assert checked[("stacks", "h2")]["status"] == "warn"
        assert checked[("stacks", "h2")]["detail"].startswith("py-spy is not installed beside")
    finally:
        stop(proc, cluster, job)


def test_a_torch_job_that_times_out_leaves_every_ranks_stack_in_its_logs(
    cluster: Cluster, tmp_path: Path
) -> None:
    hosts = cluster.hosts_file(names=["h1", "h2"], slots=2)
    result = run(
        cluster,
        [
            "launch",
            "--framework",
            "torch",
            "--timeout",
            "40",
            "--grace",
            "2",
            "--",
            PYTHON,
            SKIP_ALLREDUCE,
            "2",
        ],
        tmp_path,
        timeout_s=120,
        hosts=hosts,
    )
    assert result.returncode == 124, result.stderr[-3000:]
    logs = latest_job(tmp_path)
    for rank in range(4):
        assert f"entering {rank}" in (logs / f"worker.{rank}.log").read_text()
    (stacks_dir,) = logs.glob("stacks-*")
    files = {p.name: p.read_text() for p in stacks_dir.iterdir()}
    ranks = {name: text for name, text in files.items() if name.startswith("worker.")}
    assert sorted(ranks) == [f"worker.{i}@h{1 + i // 2}.txt" for i in range(4)]
    inside = sorted(name for name, text in ranks.items() if "all_reduce (" in text)
    assert inside == ["worker.0@h1.txt", "worker.1@h1.txt", "worker.3@h2.txt"]
    assert "skip_the_collective" in ranks["worker.2@h2.txt"]
    assert "stacks: 1 task (worker.2@h2): in skip_the_collective" in result.stderr
    assert "stacks: 3 tasks (worker.0@h1, worker.1@h1, worker.3@h2)" in result.stderr
    assert_nothing_left(cluster, logs.name)


def test_mxnet_workers_wait_in_the_kvstore_for_one_that_never_came(
    cluster: Cluster, tmp_path: Path
) -> None:
    proc = start(
        cluster,
        ["launch", "-n", "3", "-s", "1", "--", PYTHON, SKIP_KVSTORE, "worker.1"],
        tmp_path,
    )
    deadline = time.monotonic() + 60
    while not (tmp_path / "dtrain-logs" / "latest").exists() and time.monotonic() < deadline:
        time.sleep(0.1)
    logs = latest_job(tmp_path)
    job = logs.name
    try:
        wait_for_lines(logs, ["worker.0", "worker.1", "worker.2"], "entering")
        args = ["stacks", *ssh_args(cluster), "--job", job, "--json"]
        plain = json.loads(run_dtrain(args, tmp_path).stdout)
        native = json.loads(run_dtrain([*args, "--native"], tmp_path).stdout)
        assert plain["exit_code"] == 0 and native["exit_code"] == 0, native["errors"]
        for document, is_native in ((plain, False), (native, True)):
            by_task = {t["task"]: t for t in document["data"]["tasks"]}
            assert {"server.0", "worker.0", "worker.1", "worker.2"} <= set(by_task)
            for name in ("worker.0", "worker.2"):
                (thread,) = [t for t in by_task[name]["threads"] if t["id"] == by_task[name]["pid"]]
                names = [f["name"] for f in thread["frames"]]
                assert "create" in names, names
                assert any(n.startswith("ps::") for n in names) is is_native, names
            skipper = by_task["worker.1"]["threads"][0]["frames"]
            assert "never_create_kvstore" in [f["name"] for f in skipper]
        groups = {tuple(g["tasks"]): g["headline"] for g in plain["data"]["groups"]}
        (odd,) = [tasks for tasks in groups if any(t.startswith("worker.1@") for t in tasks)]
        assert len(odd) == 1 and groups[odd].startswith("in never_create_kvstore"), groups
    finally:
        stop(proc, cluster, job)
