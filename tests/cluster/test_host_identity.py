"""Hosts are told apart by name and port: two sshds on one machine are two hosts, everywhere.

One cluster host's sshd listens on a second port; launch, ps, kill and doctor then see
`198.18.0.11:22` and `198.18.0.11:2222` as two hosts, as two containers or two tunnels on one
machine are.
"""

from __future__ import annotations

import json
import signal
from collections.abc import Callable
from pathlib import Path

from tests.cluster.netcluster import Cluster
from tests.cluster.test_launch_ssh import assert_nothing_left, run, start, wait_running
from tests.conftest import PYTHON, program

BY_TASK = program("by_task.py")
SECOND_PORT = 2222


def listen_twice(cluster: Cluster) -> tuple[str, str]:
    """h1's sshd also on SECOND_PORT, its key known there too; the two hosts-file lines."""
    h1 = cluster.host("h1")
    cluster.sshd_override(h1, f"Port {SECOND_PORT}")
    known = cluster.known_hosts.read_text().splitlines()
    key = next(line.split(" ", 1)[1] for line in known if line.startswith(f"{h1.name},"))
    with cluster.known_hosts.open("a") as out:
        out.write(f"[{h1.address}]:{SECOND_PORT} {key}\n")
    return f"{h1.address}:22", f"{h1.address}:{SECOND_PORT}"


def test_one_machine_on_two_ports_is_two_hosts_for_launch_ps_kill_and_doctor(
    make_cluster: Callable[[int], Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(1)
    first, second = listen_twice(cluster)
    hosts = tmp_path / "hosts"
    hosts.write_text(f"{first}\n{second}\n")
    job_dir = tmp_path / "job"
    job_dir.mkdir()
    launch = start(
        cluster,
        ["launch", "-n", "2", "-s", "0", "--", PYTHON, BY_TASK, "*=sleep"],
        job_dir,
        hosts=hosts,
    )
    try:
        job = wait_running(job_dir, 3)  # the scheduler here and one worker per port
        document = json.loads((job_dir / "dtrain-logs" / job / "job.json").read_text())
        placed = {
            t["name"]: (t["host"]["name"], t["host"]["port"]) for t in document["plan"]["tasks"]
        }
        assert placed["worker.0"] == (cluster.host("h1").address, 22)
        assert placed["worker.1"] == (cluster.host("h1").address, SECOND_PORT)
        labels = {t["name"]: t["label"] for t in document["plan"]["tasks"]}
        assert labels["worker.1"] == f"worker.1@{second}"

        listed = run(cluster, ["ps", "--json", "--job", job], tmp_path, hosts=hosts)
        assert listed.returncode == 0, listed.stderr
        scans = json.loads(listed.stdout)["data"]["hosts"]
        assert [s["host"] for s in scans] == [first, second]
        for scan in scans:  # one machine: each host sees both workers
            assert scan["reachable"], scan
            assert {p["task"] for p in scan["processes"]} == {"worker.0", "worker.1"}

        checked = run(cluster, ["doctor", "--json"], tmp_path, hosts=hosts)
        results = json.loads(checked.stdout)["data"]["results"]
        ssh = {r["host"]: r["status"] for r in results if r["check"] == "ssh"}
        assert ssh[first] == ssh[second] == "pass", results

        killed = run(cluster, ["kill", "--json", "--job", job], tmp_path, hosts=hosts)
        assert killed.returncode == 0, killed.stderr
        assert [k["host"] for k in json.loads(killed.stdout)["data"]["hosts"]] == [first, second]
        out, _ = launch.communicate(timeout=60)
    finally:
        if launch.poll() is None:
            launch.send_signal(signal.SIGINT)
            launch.communicate(timeout=30)
    assert f"[worker.1@{second}] ready worker.1" in out
    assert f"[worker.0@{first}] ready worker.0" in out
    assert_nothing_left(cluster, job)


def test_a_host_listed_twice_through_ssh_config_is_one_duplicate_before_connecting(
    make_cluster: Callable[[int], Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(1)
    h1 = cluster.host("h1")
    hosts = tmp_path / "hosts"
    hosts.write_text(f"h1\n{h1.address}:22\n")  # the alias, and its address on the default port
    for command in (["launch", "-n", "1", "--", "true"], ["ps"], ["doctor"]):
        result = run(cluster, command, tmp_path, hosts=hosts)
        assert result.returncode == 2, result.stderr
        assert result.stderr.splitlines()[0] == (
            f'{hosts}:2: duplicate host: "{h1.address}:22" and "h1" on line 1 both reach '
            f"root@{h1.address}:22"
        )
    # not even a TCP connection, and no job directory left behind
    said = [line for line in cluster.sshd_log(h1).splitlines() if "Server listening" not in line]
    assert said == []
    assert not (tmp_path / "dtrain-logs").exists()
