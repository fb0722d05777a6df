"""Tests of the Grid Engine test cluster itself: real sge_qmaster and sge_execd in the hosts."""

from __future__ import annotations

import os
import time
from collections.abc import Callable
from pathlib import Path

import pytest

from .netcluster import ClusterError
from .sgecluster import PE, SgeCluster

# Each task reports where it runs: hostname, address and PID namespace.
WHERE_AM_I = 'echo "$(hostname) $(hostname -I | tr -d " ") $(readlink /proc/self/ns/pid)"'


def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0, what: str = "it") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


def _alive(pid: int) -> bool:
    try:
        state = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()[0]
    except OSError:
        return False
    return state != "Z"


def test_every_queue_instance_takes_jobs_and_the_pe_spans_every_host(
    sge_cluster: SgeCluster,
) -> None:
    assert sge_cluster.queue_states() == {
        "h1": "",
        "h2": "",
        "h3": "",
    }
    pe = sge_cluster.run(["qconf", "-sp", PE], check=True).stdout
    assert "control_slaves     TRUE" in pe and "job_is_first_task  FALSE" in pe
    config = sge_cluster.run(["qconf", "-sconf"], check=True).stdout
    assert "ENABLE_ADDGRP_KILL=TRUE" in config


def test_qrsh_inherit_runs_on_each_granted_host_in_its_namespaces_with_its_exit_code(
    sge_cluster: SgeCluster,
) -> None:
    body = f"""
cat "$PE_HOSTFILE"
for h in $(cut -d' ' -f1 "$PE_HOSTFILE"); do qrsh -inherit -nostdin $h '{WHERE_AM_I}'; done
qrsh -inherit -nostdin h2 'exit 7'; echo "rc=$?"
"""
    job = sge_cluster.submit(body, 3)
    outcome = sge_cluster.wait(job, 60)

    assert outcome.exit_status == 0, outcome
    lines = outcome.stdout.splitlines()
    granted = sorted(line.split()[:2] for line in lines[:3])
    assert granted == [["h1", "1"], ["h2", "1"], ["h3", "1"]]
    places = sorted(line.split() for line in lines[3:6])
    cluster = sge_cluster.cluster
    assert [p[:2] for p in places] == [[h.name, h.address] for h in cluster.hosts]
    assert len({p[2] for p in places}) == 3  # each task in its own host's PID namespace
    assert lines[6] == "rc=7"


def test_qdel_ends_the_job_script_and_every_task(sge_cluster: SgeCluster) -> None:
    body = """
for h in $(cut -d' ' -f1 "$PE_HOSTFILE"); do qrsh -inherit -nostdin $h 'sleep 300' & done
wait
"""
    job = sge_cluster.submit(body, 3)
    sge_cluster.wait_state(job, "r")
    wait_for(
        lambda: all(sge_cluster.job_pids(h) for h in sge_cluster.hosts), 20, "tasks on every host"
    )

    sge_cluster.qdel(job)

    wait_for(lambda: not any(sge_cluster.job_pids(h) for h in sge_cluster.hosts), 20, "no task")
    assert sge_cluster.wait(job, 30).job_id == job


def test_a_pe_without_control_slaves_refuses_qrsh_inherit(
    make_sge_cluster: Callable[..., SgeCluster],
) -> None:
    sge = make_sge_cluster(2, control_slaves=False)
    job = sge.submit('qrsh -inherit -nostdin "$HOSTNAME" true; echo "rc=$?"', 2)
    outcome = sge.wait(job, 60)

    assert "rc=1" in outcome.stdout
    assert "accept" in outcome.stderr, outcome.stderr


def test_a_job_larger_than_the_pe_stays_queued_and_wait_is_bounded(
    sge_cluster: SgeCluster,
) -> None:
    job = sge_cluster.submit("true", 99)  # 3 hosts x 4 slots
    with pytest.raises(ClusterError, match="did not finish within 3s"):
        sge_cluster.wait(job, 3)
    wait_for(lambda: sge_cluster.job_state(job) is None, 10, "the job deleted")


def test_stop_kills_daemons_jobs_and_setsid_children_and_removes_the_root(
    make_sge_cluster: Callable[..., SgeCluster],
) -> None:
    sge = make_sge_cluster(2)
    body = "qrsh -inherit -nostdin h2 'setsid sleep 300 </dev/null >/dev/null 2>&1 &'; sleep 300"
    job = sge.submit(body, 2)
    sge.wait_state(job, "r")
    wait_for(lambda: len(sge.job_pids("h2")) >= 1, 20, "the setsid child on h2")
    pids = sge.started_pids() + sge.job_pids("h1") + sge.job_pids("h2")
    root = sge.dir

    sge.stop()

    wait_for(lambda: not any(_alive(p) for p in pids), 5, "every SGE process gone")
    assert not root.exists()
    assert sge.cluster.is_running  # the hosts stay
    assert not os.path.exists(root)
