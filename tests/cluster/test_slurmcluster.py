"""Tests of the Slurm test cluster itself: real slurmctld and slurmd in the namespaced hosts."""

from __future__ import annotations

import os
import secrets
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path

from . import netcluster, slurmcluster
from .netcluster import BRIDGE_ADDRESS
from .slurmcluster import CONTROLLER_PORT, SlurmCluster

# Each task reports where it runs: node id, hostname, addresses, and its PID and net namespaces.
WHERE_AM_I = (
    'echo "$SLURM_NODEID $(hostname) $(hostname -I | tr -d " ")'
    ' $(readlink /proc/self/ns/pid) $(readlink /proc/self/ns/net)"'
)


def wait_for(predicate: Callable[[], bool], timeout_s: float = 10.0, what: str = "it") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.05)


def _read(path: str) -> bytes:
    try:
        return Path(path).read_bytes()
    except OSError:
        return b""


def _live_pids() -> list[int]:
    pids = [int(name) for name in os.listdir("/proc") if name.isdigit()]
    return [pid for pid in pids if slurmcluster._pid_state(pid) not in (None, "Z")]


def pids_marked(marker: str) -> list[int]:
    """Live processes anywhere on the machine whose environment holds `marker` (KEY=VALUE)."""
    wanted = marker.encode()
    return [pid for pid in _live_pids() if wanted in _read(f"/proc/{pid}/environ").split(b"\0")]


def pids_naming(conf: Path) -> list[int]:
    """Live processes whose command line or environment names `conf` (our slurm.conf)."""
    needle = str(conf).encode()
    return [
        pid
        for pid in _live_pids()
        if needle in _read(f"/proc/{pid}/cmdline") + _read(f"/proc/{pid}/environ")
    ]


def test_nodes_reach_idle_and_the_controller_listens_on_the_bridge_only(
    slurm_cluster: SlurmCluster,
) -> None:
    assert slurm_cluster.node_states() == {"h1": "idle", "h2": "idle", "h3": "idle"}
    tcp = Path(f"/proc/{slurm_cluster.slurmctld_pid}/net/tcp").read_text().splitlines()[1:]
    listening = {line.split()[1] for line in tcp if line.split()[3] == "0A"}
    port = f"{CONTROLLER_PORT:04X}"
    bridge = socket.inet_aton(BRIDGE_ADDRESS)[::-1].hex().upper()  # /proc/net/tcp: little-endian
    assert f"{bridge}:{port}" in listening
    assert f"00000000:{port}" not in listening  # never on every address (auth/none)


def test_srun_runs_one_task_per_node_in_that_nodes_namespaces(
    slurm_cluster: SlurmCluster,
) -> None:
    result = slurm_cluster.srun("-N3", "--ntasks-per-node=1", "sh", "-c", WHERE_AM_I, check=True)

    lines = sorted(result.stdout.splitlines())
    cluster = slurm_cluster.cluster
    expected = []
    for node_id, host in enumerate(cluster.hosts):
        init = cluster.sshd_pid(host)  # the host's PID 1: its namespaces are the host's
        pid_ns = os.readlink(f"/proc/{init}/ns/pid")
        net_ns = os.readlink(f"/proc/{init}/ns/net")
        expected.append(f"{node_id} {host.name} {host.address} {pid_ns} {net_ns}")
    assert lines == expected


def test_a_task_sees_only_its_own_hosts_processes(slurm_cluster: SlurmCluster) -> None:
    script = 'echo "$(hostname) $(cat /proc/1/comm) $(cat /proc/[0-9]*/comm | grep -cx slurmd)"'
    result = slurm_cluster.srun("-N3", "--ntasks-per-node=1", "sh", "-c", script, check=True)

    # PID 1 is the host's own sshd, and the only slurmd in sight is the host's own.
    assert sorted(result.stdout.splitlines()) == ["h1 sshd 1", "h2 sshd 1", "h3 sshd 1"]


def test_salloc_gives_a_nodelist_that_scontrol_expands(slurm_cluster: SlurmCluster) -> None:
    script = 'echo "$SLURM_JOB_NODELIST $SLURM_JOB_NUM_NODES"; scontrol show hostnames'
    result = slurm_cluster.salloc("-N", "2", "sh", "-c", script, check=True)

    assert result.stdout.splitlines() == ["h[1-2] 2", "h1", "h2"]


def test_sbatch_from_a_host_runs_a_script_whose_srun_reaches_every_node(
    slurm_cluster: SlurmCluster,
) -> None:
    out = slurm_cluster.dir / "batch.out"
    submitted = slurm_cluster.sbatch(
        "--parsable", "-N3", f"--output={out}", "--wrap", "hostname; srun hostname | sort",
        host="h3", check=True,
    )  # fmt: skip
    job_id = submitted.stdout.strip()

    def state() -> str:
        return slurm_cluster.squeue("-h", "-t", "all", "-j", job_id, "-o", "%T").stdout.strip()

    # Polled: `sbatch --wait` would do, but it polls slowly (~10 s for an instant job).
    wait_for(lambda: state() == "COMPLETED", what=f"batch job {job_id} to complete")
    # The script itself runs on the allocation's first node, its srun on all three.
    assert out.read_text().splitlines() == ["h1", "h1", "h2", "h3"]


def test_srun_overlap_runs_beside_a_running_step_inside_a_host(
    slurm_cluster: SlurmCluster,
) -> None:
    # Run as a user logged in on h2 would: salloc there, one long step, then a second step.
    script = """
        srun -N2 --ntasks-per-node=1 sleep 120 &
        first=$!
        n=0
        until squeue -h -s -j "$SLURM_JOB_ID" -o %j | grep -q sleep; do
            n=$((n+1)); [ $n -lt 200 ] || exit 9; sleep 0.05
        done
        srun --overlap -N2 --ntasks-per-node=1 hostname | sort
        squeue -h -s -j "$SLURM_JOB_ID" -o %j | sort
        kill $first
    """
    result = slurm_cluster.salloc("-N", "2", "sh", "-c", script, host="h2", check=True)

    # The second step ran on both nodes while the first one was still running.
    assert result.stdout.splitlines() == ["h1", "h2", "sleep"]


def test_with_ssh_blocked_on_every_node_srun_still_works(slurm_cluster: SlurmCluster) -> None:
    cluster = slurm_cluster.cluster
    slurm_cluster.block_ssh_all()

    for host in cluster.hosts:
        ssh = cluster.ssh_run(host, "true")
        assert ssh.returncode == 255
        assert "refused" in ssh.stderr
    result = slurm_cluster.srun("-N3", "--ntasks-per-node=1", "hostname", check=True)
    assert sorted(result.stdout.split()) == ["h1", "h2", "h3"]
    inside = slurm_cluster.srun("-N3", "--ntasks-per-node=1", "hostname", host="h3", check=True)
    assert sorted(inside.stdout.split()) == ["h1", "h2", "h3"]


def test_scancel_ends_a_running_steps_tasks(slurm_cluster: SlurmCluster) -> None:
    marker = f"DTCL_MARK={secrets.token_hex(4)}"
    key, value = marker.split("=")
    argv = ["srun", "-N3", "--ntasks-per-node=1", "sleep", "300"]
    srun = slurm_cluster.spawn(argv, env={key: value})
    wait_for(lambda: len(pids_marked(marker)) == 5, what="three tasks, srun and its helper")
    job_id = slurm_cluster.squeue("-h", "-o", "%i", check=True).stdout.strip()

    slurm_cluster.scancel(f"{job_id}.0", check=True)

    wait_for(lambda: not pids_marked(marker), what="the tasks and srun to end")
    assert srun.popen.wait(timeout=10) != 0


def test_sigkill_of_srun_and_its_helper_leaves_the_tasks_until_scancel(
    slurm_cluster: SlurmCluster,
) -> None:
    marker = f"DTCL_MARK={secrets.token_hex(4)}"
    key, value = marker.split("=")
    argv = ["srun", "-N3", "--ntasks-per-node=1", "sleep", "300"]
    srun = slurm_cluster.spawn(argv, env={key: value})
    wait_for(lambda: len(pids_marked(marker)) == 5, what="three tasks, srun and its helper")
    job_id = slurm_cluster.squeue("-h", "-o", "%i", check=True).stdout.strip()

    srun.kill_group()
    srun.popen.wait(timeout=10)

    tasks = pids_marked(marker)
    assert len(tasks) == 3  # the launcher's death did not reach them
    assert slurm_cluster.squeue("-h", "-o", "%T", check=True).stdout.split() == ["RUNNING"]
    slurm_cluster.scancel(job_id, check=True)
    wait_for(lambda: not pids_marked(marker), what="scancel to end the tasks")


def test_sigkill_of_srun_alone_lets_its_helper_end_the_tasks(
    slurm_cluster: SlurmCluster,
) -> None:
    marker = f"DTCL_MARK={secrets.token_hex(4)}"
    key, value = marker.split("=")
    argv = ["srun", "-N3", "--ntasks-per-node=1", "sleep", "300"]
    srun = slurm_cluster.spawn(argv, env={key: value})
    wait_for(lambda: len(pids_marked(marker)) == 5, what="three tasks, srun and its helper")

    os.kill(srun.pid, signal.SIGKILL)

    wait_for(lambda: not pids_marked(marker), what="the helper to end the tasks")
    wait_for(lambda: not slurm_cluster.squeue("-h").stdout.strip(), what="the job to end")


def test_teardown_leaves_no_slurm_process_mount_or_state(
    make_slurm_cluster: Callable[[int], SlurmCluster],
) -> None:
    slurm = make_slurm_cluster(3)
    cluster = slurm.cluster
    marker = f"DTCL_MARK={secrets.token_hex(4)}"
    key, value = marker.split("=")
    slurm.spawn(["srun", "-N3", "--ntasks-per-node=1", "sleep", "300"], env={key: value})
    wait_for(lambda: len(pids_marked(marker)) == 5, what="a running step")
    slurm.block_ssh("h1")
    conf, state_dir = slurm.conf, slurm.dir
    pids = slurm.started_pids() + pids_marked(marker)
    assert pids_naming(conf)

    slurm.stop()
    slurm.stop()  # idempotent

    assert [pid for pid in pids if slurmcluster._pid_state(pid) not in (None, "Z")] == []
    assert pids_naming(conf) == []
    assert not state_dir.exists()
    for host in cluster.hosts:
        mounts = cluster.run(host, "cat /proc/self/mounts", check=True).stdout
        assert "cgroup" not in mounts, host.name
        assert cluster.ssh_run(host, "true").returncode == 0  # ssh unblocked
    cluster.stop()
    assert f"name={cluster.prefix}" not in Path("/proc/self/cgroup").read_text()
    assert cluster.prefix not in Path("/proc/self/mounts").read_text()


def test_cleanup_stale_stops_a_slurmctld_a_crashed_run_left() -> None:
    # Started from a thread, slurmctld gets no parent-death signal: a crash leaves it running.
    crashed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys, threading; sys.path.insert(0, sys.argv[1]);"
            "from tests.cluster.netcluster import Cluster;"
            "from tests.cluster.slurmcluster import SlurmCluster;"
            "c = Cluster(2); c.start(); s = SlurmCluster(c);"
            "t = threading.Thread(target=s.start); t.start(); t.join();"
            "print(s.slurmctld_pid, s.conf); sys.stdout.flush(); os._exit(1)",
            str(Path(netcluster.__file__).parents[2]),
        ],
        capture_output=True,
        text=True,
        timeout=120,
    )
    pid_text, conf = crashed.stdout.split()
    ctld = int(pid_text)
    assert slurmcluster._pid_state(ctld) not in (None, "Z"), crashed.stderr
    assert ctld in pids_naming(Path(conf))

    removed = netcluster.cleanup_stale()

    wait_for(lambda: slurmcluster._pid_state(ctld) in (None, "Z"), what="slurmctld to die")
    assert pids_naming(Path(conf)) == []
    if not any(str(ctld) in item for item in removed):
        # Only possible when a concurrent test run started a cluster in between: its start()
        # cleans up stale runs too. Then it must have left nothing either (checked above).
        return
