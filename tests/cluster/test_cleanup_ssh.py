"""`dtrain ps -H` and `dtrain kill -H` on the real sshd cluster.

Each host has its own PID namespace, so a kill without `--job` there touches only what these
tests started. Leftovers are started the way people leave them behind: over plain ssh, with
DMLC_ROLE set, in the background.
"""

from __future__ import annotations

import json
import re
import signal
import statistics
import time
from collections.abc import Callable
from pathlib import Path

from dtrain.remote import procs, proto
from tests.cluster.netcluster import Cluster, host_address
from tests.cluster.test_launch_ssh import (
    assert_nothing_left,
    cluster_tasks,
    run,
    start,
    wait_running,
)
from tests.conftest import PYTHON, program, wait_gone

BY_TASK = program("by_task.py")
SLEEP = ["sleep", "602"]
# A DMLC process with a child that dropped the variable (still a job process: a descendant).
LEFTOVER = (
    "DMLC_ROLE=server setsid sh -c 'env -u DMLC_ROLE sleep 602 & exec sleep 602' "
    ">/dev/null 2>&1 </dev/null &"
)
UNRELATED = "setsid sleep 602 >/dev/null 2>&1 </dev/null &"  # same command line, no variable
STUBBORN = (
    f"DMLC_ROLE=worker setsid {PYTHON} {program('ignore_sigterm.py')} >/dev/null 2>&1 </dev/null &"
)


def sleeps_on(cluster: Cluster, host: str) -> dict[int, bool]:
    """Root-namespace pid of each `sleep 602` on the host -> whether it is a job process."""
    found = {}
    for pid in cluster.host_pids(host):
        if procs.read_cmdline(pid) != SLEEP:
            continue
        env = procs.read_environ(pid) or {}
        stat = procs.read_stat(pid)
        parent = procs.read_environ(stat[1]) or {} if stat else {}
        found[pid] = proto.ROLE_VAR in env or proto.ROLE_VAR in parent
    return found


def wait_sleeps(cluster: Cluster, host: str, count: int, timeout_s: float = 5.0) -> dict[int, bool]:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        found = sleeps_on(cluster, host)
        if len(found) >= count:
            return found
        time.sleep(0.05)
    raise AssertionError(f"{count} sleeps did not appear on {host} within {timeout_s}s")


def leave_behind(cluster: Cluster, hosts: list[str], command: str) -> None:
    for host in hosts:
        cluster.ssh_run(host, command, check=True)


def test_leftovers_on_two_hosts_are_listed_and_killed_and_an_unrelated_sleep_survives(
    cluster: Cluster, tmp_path: Path
) -> None:
    leave_behind(cluster, ["h1", "h2"], LEFTOVER)
    leave_behind(cluster, ["h1", "h3"], UNRELATED)
    before = {h: wait_sleeps(cluster, h, n) for h, n in (("h1", 3), ("h2", 2), ("h3", 1))}
    listed = run(cluster, ["ps"], tmp_path)
    assert listed.returncode == 0, listed.stderr
    assert "h1: 2 job processes" in listed.stdout
    assert "h2: 2 job processes" in listed.stdout
    assert "h3: no job processes" in listed.stdout
    assert "no dtrain job id (DMLC_ROLE set" in listed.stdout
    assert "server (child of " in listed.stdout  # the child that dropped DMLC_ROLE

    killed = run(cluster, ["kill", "--grace", "2"], tmp_path)
    assert killed.returncode == 0, killed.stderr
    assert "h1: stopped 2 of 2 processes: 2 on SIGTERM" in killed.stdout
    assert "h3: nothing to stop" in killed.stdout
    assert killed.stdout.endswith("stopped 4 processes on 3 hosts; nothing is left\n")
    job_processes = [pid for found in before.values() for pid, is_job in found.items() if is_job]
    unrelated = [pid for found in before.values() for pid, is_job in found.items() if not is_job]
    assert len(job_processes) == 4 and len(unrelated) == 2
    assert wait_gone(job_processes, 1) == []
    assert all(procs.alive(pid) for pid in unrelated)


def test_a_process_ignoring_sigterm_is_killed_after_the_grace(
    cluster: Cluster, tmp_path: Path
) -> None:
    leave_behind(cluster, ["h2"], STUBBORN)
    leave_behind(cluster, ["h2"], LEFTOVER)
    wait_sleeps(cluster, "h2", 2)
    time.sleep(0.5)  # let ignore_sigterm.py install its handler
    started = time.monotonic()
    result = run(
        cluster,
        ["kill", "--grace", "1", "--json"],
        tmp_path,
        hosts=cluster.hosts_file(names=["h2"]),
    )
    assert result.returncode == 0, result.stderr
    assert time.monotonic() - started >= 1
    (host,) = json.loads(result.stdout)["data"]["hosts"]
    fates = sorted((p["role"], p["argv"][0], p["fate"]) for p in host["processes"])
    assert fates == [("server", "sleep", "term")] * 2 + [("worker", PYTHON, "kill")]
    assert host["survivors"] == []
    assert cluster_tasks(cluster) == []


def test_kill_stops_a_live_launch_on_every_host_which_then_fails(
    cluster: Cluster, tmp_path: Path
) -> None:
    launch = start(
        cluster,
        [
            "launch",
            "-n",
            "3",
            "-s",
            "2",
            "--scheduler-host",
            "h1",
            "--grace",
            "1",
            "--",
            PYTHON,
            BY_TASK,
            "worker.0=ignore-term",
            "*=tree",
        ],
        tmp_path,
    )
    try:
        job = wait_running(tmp_path, 1 + 5 * 3)  # worker.0 has no descendants
        other = tmp_path / "elsewhere"  # another terminal
        other.mkdir()
        killed = run(cluster, ["kill", "--grace", "2"], other)
        _, stderr = launch.communicate(timeout=30)
    finally:
        if launch.poll() is None:
            launch.send_signal(signal.SIGINT)
            launch.communicate(timeout=30)
    assert killed.returncode == 0, killed.stderr
    assert f"job {job}" in killed.stdout
    assert launch.returncode not in (0, None), stderr
    assert re.search(r"killed (by SIG\w+ )?from outside dtrain", stderr), stderr
    assert_nothing_left(cluster, job)
    assert cluster_tasks(cluster) == []


def test_job_kills_only_that_job_while_two_run(cluster: Cluster, tmp_path: Path) -> None:
    # A live `dtrain launch`, and on the same hosts the processes of another dtrain job (started
    # over ssh: launch's preflight would rightly refuse to start a second job next to the first).
    launch = start(
        cluster,
        [
            "launch",
            "-n",
            "3",
            "-s",
            "0",
            "--scheduler-host",
            "h1",
            "--",
            PYTHON,
            BY_TASK,
            "*=sleep",
        ],
        tmp_path,
    )
    try:
        first = wait_running(tmp_path, 4)
        second = f"{first}-other"
        leave_behind(
            cluster,
            ["h1", "h2", "h3"],
            f"DTRAIN_JOB_ID={second} DTRAIN_TASK=worker.0 setsid sleep 602 "
            ">/dev/null 2>&1 </dev/null &",
        )
        for host in ("h1", "h2", "h3"):
            wait_sleeps(cluster, host, 1)
        killed = run(cluster, ["kill", "--job", first, "--grace", "2"], tmp_path)
        assert killed.returncode == 0, killed.stderr
        assert second not in killed.stdout
        _, stderr = launch.communicate(timeout=30)
    finally:
        if launch.poll() is None:
            launch.send_signal(signal.SIGINT)
            launch.communicate(timeout=30)
    assert launch.returncode != 0, stderr
    assert_nothing_left(cluster, first)
    others = [pid for host in ("h1", "h2", "h3") for pid in sleeps_on(cluster, host)]
    assert len(others) == 3 and all(procs.alive(pid) for pid in others)

    listed = run(cluster, ["ps", "--json"], tmp_path)
    jobs = {p["job_id"] for h in json.loads(listed.stdout)["data"]["hosts"] for p in h["processes"]}
    assert jobs == {second}
    killed = run(cluster, ["kill", "--job", second], tmp_path)
    assert killed.returncode == 0, killed.stderr
    assert wait_gone(others, 1) == []


def test_an_unreachable_host_is_reported_and_the_others_are_still_cleaned(
    cluster: Cluster, tmp_path: Path
) -> None:
    leave_behind(cluster, ["h1", "h2", "h3"], LEFTOVER)
    on_h1 = list(wait_sleeps(cluster, "h1", 2))
    on_h3 = list(wait_sleeps(cluster, "h3", 2))
    cluster.partition("h2", all_traffic=True)
    started = time.monotonic()
    result = run(cluster, ["kill", "--grace", "1", "--connect-timeout", "1"], tmp_path)
    assert time.monotonic() - started < 10
    assert result.returncode == 3, result.stderr
    assert "h2: not reached (see the error below)" in result.stdout
    assert "stopped 4 processes on 2 of 3 hosts; nothing is left on those" in result.stdout
    assert result.stderr.startswith(
        "dtrain: could not reach 1 of 3 hosts; the other 2 were cleaned\n"
    )
    assert f"h2 ({host_address(2)}:22): connection timed out after 1s" in result.stderr
    assert wait_gone(on_h1 + on_h3, 1) == []

    as_json = run(cluster, ["ps", "--json", "--connect-timeout", "1"], tmp_path)
    assert as_json.returncode == 3
    document = json.loads(as_json.stdout)
    assert document["status"] == "partial"
    assert [e["host"] for e in document["errors"]] == ["h2"]
    assert [h["reachable"] for h in document["data"]["hosts"]] == [True, False, True]


def test_kill_on_eight_hosts_takes_about_as_long_as_on_one(
    make_cluster: Callable[[int], Cluster], tmp_path: Path
) -> None:
    """Measures `dtrain kill --grace 1` on 1 and on 8 hosts, each with a SIGTERM-ignoring
    leftover (so the grace is really spent). Prints the figures (pytest -s)."""
    cluster = make_cluster(8)
    names = [h.name for h in cluster.hosts]
    one, eight = cluster.hosts_file(names=["h1"]), cluster.hosts_file()
    timings: dict[str, list[float]] = {"1": [], "8": []}
    for _ in range(3):
        for label, hosts, seeded in (("1", one, ["h1"]), ("8", eight, names)):
            leave_behind(cluster, seeded, STUBBORN)
            leave_behind(cluster, seeded, LEFTOVER)
            for host in seeded:
                wait_sleeps(cluster, host, 2)
            time.sleep(0.5)
            started = time.monotonic()
            result = run(cluster, ["kill", "--grace", "1"], tmp_path, hosts=hosts)
            timings[label].append(time.monotonic() - started)
            assert result.returncode == 0, result.stderr
            assert f"stopped {3 * len(seeded)} processes" in result.stdout
    one_s, eight_s = statistics.median(timings["1"]), statistics.median(timings["8"])
    print(f"\ndtrain kill --grace 1, median of 3: 1 host {one_s:.2f}s, 8 hosts {eight_s:.2f}s")
    print(f"  runs: 1 host {timings['1']}, 8 hosts {timings['8']}")
    # One host after another would spend the 1 s grace 8 times: about 8x. A loose bound, as
    # the 8 hosts share this machine's cores (their login shells and agents start at once).
    assert eight_s < 3 * one_s
