"""Real PyTorch, TensorFlow and Paddle jobs across the sshd cluster through one `dtrain launch`."""

from __future__ import annotations

import re
import subprocess
import time
from pathlib import Path

from dtrain.remote import procs
from tests.cluster.netcluster import Cluster, host_address
from tests.cluster.test_launch_ssh import assert_nothing_left, run, start, wait_running
from tests.conftest import PYTHON, ROOT, job_pids, latest_job
from tests.launch.test_frameworks_real import PADDLE_PYTHON, TF_PYTHON, json_lines, planned_env

EXAMPLES = ROOT / "examples"


def test_torch_ddp_over_two_hosts_by_two_ranks_trains_identically(
    cluster: Cluster, tmp_path: Path
) -> None:
    hosts = cluster.hosts_file(names=["h1", "h2"], slots=2)
    result = run(
        cluster,
        [
            "launch",
            "--framework",
            "torch",
            "--",
            PYTHON,
            str(EXAMPLES / "torch_ddp.py"),
            "--steps",
            "10",
        ],
        tmp_path,
        timeout_s=240,
        hosts=hosts,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sums = re.findall(r"\[worker\.(\d)@(h\d)\] rank \d checksum (\S+)", result.stdout)
    assert sorted((rank, host) for rank, host, _ in sums) == [
        ("0", "h1"),
        ("1", "h1"),
        ("2", "h2"),
        ("3", "h2"),
    ]
    assert len({checksum for _, _, checksum in sums}) == 1
    env = planned_env(tmp_path)["worker.3"]
    assert env["MASTER_ADDR"] == host_address(1) and env["GLOO_SOCKET_IFNAME"] == "eth0"


def test_torch_rank_killed_fails_the_job_and_leaves_nothing(
    cluster: Cluster, tmp_path: Path
) -> None:
    hosts = cluster.hosts_file(names=["h1", "h2"], slots=2)
    proc = start(
        cluster,
        [
            "launch",
            "--framework",
            "torch",
            "--grace",
            "2",
            "--",
            PYTHON,
            str(EXAMPLES / "torch_ddp.py"),
            "--steps",
            "100000",
            "--sleep",
            "0.05",
        ],
        tmp_path,
        hosts=hosts,
    )
    job = wait_running(tmp_path, 4, timeout_s=120)
    logs = latest_job(tmp_path)
    deadline = time.monotonic() + 120
    while "started" not in (logs / "worker.3.log").read_text() and time.monotonic() < deadline:
        time.sleep(0.2)
    victim = next(
        pid
        for pid in job_pids(job)
        if (procs.read_environ(pid) or {}).get("DTRAIN_TASK") == "worker.3"
    )
    subprocess.run(["kill", "-9", str(victim)], check=True)
    _, stderr = proc.communicate(timeout=60)
    assert proc.returncode != 0
    assert "worker.3@h2" in stderr
    assert_nothing_left(cluster, job)


def test_tensorflow_parameter_server_training_across_the_cluster(
    cluster: Cluster, tmp_path: Path
) -> None:
    result = run(
        cluster,
        [
            "launch",
            "--framework",
            "tf",
            "--chief",
            "-s",
            "1",
            "-n",
            "2",
            "--",
            TF_PYTHON,
            str(EXAMPLES / "tf_ps.py"),
            "--steps",
            "100",
        ],
        tmp_path,
        timeout_s=300,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert re.search(r"\[chief\.0@h\d\] chief done steps 100", result.stdout), result.stdout[-2000:]
    # ps and workers serve forever (server.join()); dtrain stopped them: success.
    assert set(planned_env(tmp_path)) == {"ps.0", "chief.0", "worker.0", "worker.1"}


def test_paddle_sees_the_planned_endpoints_on_every_host(cluster: Cluster, tmp_path: Path) -> None:
    result = run(
        cluster,
        [
            "launch",
            "--framework",
            "paddle",
            "--nproc-per-host",
            "2",
            "--",
            PADDLE_PYTHON,
            str(EXAMPLES / "paddle_probe.py"),
        ],
        tmp_path,
        timeout_s=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json_lines(result.stdout)
    assert len(seen) == 6
    endpoints = seen["worker.0"]["parallel_env"]["trainer_endpoints"]
    assert endpoints[::2] == [
        f"{host_address(k)}:" + endpoints[2 * k - 2].split(":")[1] for k in (1, 2, 3)
    ]
    for rank in range(6):
        view = seen[f"worker.{rank}"]["parallel_env"]
        assert view["rank"] == rank and view["world_size"] == 6
        assert view["current_endpoint"] == endpoints[rank]
