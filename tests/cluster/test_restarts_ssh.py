"""`--max-restarts` over the real sshd cluster: a restart stops and clears every host first,
a lost host ends the job or, with --min-hosts, the job goes on without it on a re-made plan.

Every case ends in bounded time with the right exit code and no task left on any host.
"""

from __future__ import annotations

import json
import time
from pathlib import Path
from typing import Any

from tests.cluster.netcluster import Cluster
from tests.cluster.test_launch_ssh import assert_nothing_left, run, start, wait_running
from tests.conftest import PYTHON, latest_job, program

PROBE = program("restart_probe.py")
FAST = ["--restart-delay", "0", "--restart-window", "0", "--grace", "1"]


def attempt_lines(job_dir: Path, attempt: int) -> dict[str, dict[str, Any]]:
    """Each task's first line (its attempt variables) in one attempt's logs, by log name."""
    return {
        log.name: json.loads(log.read_text().splitlines()[0])
        for log in sorted((job_dir / f"attempt-{attempt}").glob("*.log"))
        if not log.is_symlink()
    }


def test_a_failed_attempt_restarts_on_every_host_with_nothing_left_between(
    cluster: Cluster, tmp_path: Path
) -> None:
    result = run(
        cluster,
        ["launch", "-n", "3", "-s", "2", "--max-restarts", "2", *FAST, "--",
         PYTHON, PROBE, "worker.1", "1", "7", "1"],
        tmp_path,
    )  # fmt: skip
    assert result.returncode == 0, result.stderr
    assert "attempt 1 of 3 failed: worker.1@h2 exited with code 7" in result.stderr
    job_dir = latest_job(tmp_path)
    document = json.loads((job_dir / "job.json").read_text())
    assert [a["exit_code"] for a in document["attempts"]] == [7, 0]
    assert document["attempts"][1]["hosts"] == document["attempts"][0]["hosts"]
    second = attempt_lines(job_dir, 2)
    assert len(second) == 6 and len(attempt_lines(job_dir, 1)) == 6
    assert {line["DTRAIN_RESTART_COUNT"] for line in second.values()} == {"1"}
    assert [line["earlier"] for line in second.values()] == [0] * 6  # no task of attempt 1
    assert_nothing_left(cluster, job_dir.name)


def test_a_partitioned_host_is_dropped_with_min_hosts_and_the_plan_made_again(
    cluster: Cluster, tmp_path: Path
) -> None:
    proc = start(
        cluster,
        ["launch", "-n", "3", "-s", "2", "--max-restarts", "1", "--min-hosts", "2",
         "--heartbeat-timeout", "3", "--connect-timeout", "2", *FAST, "--",
         PYTHON, PROBE, "all", "1", "hang"],
        tmp_path,
    )  # fmt: skip
    job = wait_running(tmp_path, 6)
    cluster.partition("h3")
    try:
        _, stderr = proc.communicate(timeout=60)
    finally:
        cluster.heal("h3")
    assert proc.returncode == 0, stderr
    assert "h3 dropped from attempt 2: lost during attempt 1" in stderr
    job_dir = latest_job(tmp_path)
    document = json.loads((job_dir / "job.json").read_text())
    first, second = document["attempts"]
    assert first["root_cause"]["reason"] == "lost"
    assert "h3" not in second["hosts"] and second["dropped_hosts"][0]["host"] == "h3"
    tasks = document["plan"]["tasks"]
    assert all(t["host"]["name"] != "h3" for t in tasks)
    lines = attempt_lines(job_dir, 2)
    assert len(lines) == 6  # the scheduler, 2 servers and 3 workers, on the hosts left
    for line in lines.values():
        assert (line["DMLC_NUM_WORKER"], line["DMLC_NUM_SERVER"]) == ("3", "2")
    assert_nothing_left(cluster, job, within_s=3 + 1 + 3)


def test_a_host_whose_sshd_dies_is_dropped_and_the_world_size_follows(
    cluster: Cluster, tmp_path: Path
) -> None:
    proc = start(
        cluster,
        ["launch", "--framework", "torch", "--max-restarts", "1", "--min-hosts", "2", *FAST,
         "--", PYTHON, PROBE, "all", "1", "hang"],
        tmp_path,
    )  # fmt: skip
    job = wait_running(tmp_path, 3)
    cluster.stop_host("h2")
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode == 0, stderr
    lines = attempt_lines(latest_job(tmp_path), 2)
    assert sorted(line["RANK"] for line in lines.values()) == ["0", "1"]
    assert {line["WORLD_SIZE"] for line in lines.values()} == {"2"}
    assert {line["TORCHELASTIC_RESTART_COUNT"] for line in lines.values()} == {"1"}
    assert_nothing_left(cluster, job)


def test_without_min_hosts_a_lost_host_ends_the_job_naming_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    proc = start(
        cluster,
        ["launch", "-n", "3", "-s", "0", "--max-restarts", "2", "--heartbeat-timeout", "3",
         "--connect-timeout", "1", *FAST, "--", PYTHON, PROBE, "all", "9", "hang"],
        tmp_path,
    )  # fmt: skip
    job = wait_running(tmp_path, 4)
    cluster.partition("h3")
    started = time.monotonic()
    try:
        _, stderr = proc.communicate(timeout=60)
    finally:
        cluster.heal("h3")
    assert proc.returncode == 3, stderr
    assert time.monotonic() - started < 40
    assert "cannot reach 1 of 3 hosts" in stderr and "h3" in stderr
    attempts = json.loads((latest_job(tmp_path) / "job.json").read_text())["attempts"]
    assert attempts[0]["root_cause"]["reason"] == "lost"
    assert "cannot reach" in attempts[1]["error"]
    assert_nothing_left(cluster, job, within_s=3 + 1 + 3)


def test_dtrain_kill_during_the_wait_ends_the_job_with_nothing_left(
    cluster: Cluster, tmp_path: Path
) -> None:
    proc = start(
        cluster,
        ["launch", "-n", "3", "-s", "1", "--max-restarts", "3", "--restart-delay", "60",
         "--restart-window", "0", "--grace", "1", "--", PYTHON, PROBE, "worker.2", "9", "5"],
        tmp_path,
    )  # fmt: skip
    deadline = time.monotonic() + 60
    document: dict[str, Any] = {}
    while not document.get("next_attempt_at") and time.monotonic() < deadline:
        time.sleep(0.1)
        try:
            document = json.loads((latest_job(tmp_path) / "job.json").read_text())
        except (OSError, ValueError):
            continue
    assert document.get("next_attempt_at"), "the job never waited to restart"
    killed = run(cluster, ["kill"], tmp_path, timeout_s=60)
    try:
        _, stderr = proc.communicate(timeout=30)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.communicate()
    assert killed.returncode == 0, killed.stderr
    assert proc.returncode == 143, stderr
    assert "while waiting to restart: the job ends" in stderr
    assert len(json.loads((latest_job(tmp_path) / "job.json").read_text())["attempts"]) == 1
    assert_nothing_left(cluster, latest_job(tmp_path).name)
