"""`dtrain launch` inside a PBS/Torque or LSF job, on the real sshd cluster.

Neither scheduler is packaged for these machines, so the job is its environment (the node
file and the job id the scheduler would set) and its per-host starter is a STAND-IN
(tests/cluster/standins/pbsdsh, also as blaunch) that runs the command on the named host over
the cluster's ssh, as pbsdsh and blaunch run it through their daemons. What is real: the node
file's reading, dtrain's use of the starter (one per host, the key in the environment), the
agents' connect-back, and the ssh fallback when no starter is on PATH.
"""

from __future__ import annotations

import os
import re
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.netcluster import Cluster
from tests.cluster.test_launch_mpi import assert_hosts_empty
from tests.cluster.test_launch_slurm import running_tasks
from tests.cluster.test_launch_ssh import cluster_tasks
from tests.conftest import PYTHON, job_document, program, run_dtrain, wait_gone

BY_TASK = program("by_task.py")
WHERE = 'echo "$DMLC_ROLE $(hostname) $DMLC_NODE_HOST $DMLC_PS_ROOT_URI"'
STANDINS = Path(__file__).parent / "standins"
SCHEDULERS = {
    "pbs": ("PBS_NODEFILE", "PBS_JOBID", "42.pbs-server", "pbsdsh"),
    "lsf": ("LSB_DJOB_HOSTFILE", "LSB_JOBID", "4242", "blaunch"),
}


@pytest.fixture(params=sorted(SCHEDULERS))
def scheduler(request: pytest.FixtureRequest) -> str:
    name: str = request.param
    return name


def job_env(
    cluster: Cluster, scheduler: str, tmp_path: Path, *, standin: bool = True
) -> dict[str, str]:
    """What a shell inside the job has: the node file (h1 with 2 slots, h2, h3: one line per
    slot, interleaved as LSF writes it) and the job's id; the stand-in starter on PATH."""
    file_var, job_var, job_id, _ = SCHEDULERS[scheduler]
    nodes = tmp_path / "nodefile"
    nodes.write_text("h1\nh2\nh1\nh3\n")
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("PBS_", "LSB_", "SLURM_"))}
    path = f"{STANDINS}:{keep['PATH']}" if standin else keep["PATH"]
    return {
        **keep,
        file_var: str(nodes),
        job_var: job_id,
        "PATH": path,
        "STANDIN_SSH_CONFIG": str(cluster.ssh_config),
    }


def launch_argv(cluster: Cluster, *args: str) -> list[str]:
    return [PYTHON, "-m", "dtrain", "launch", "--ssh-config", str(cluster.ssh_config), *args]


def test_roles_slots_and_each_hosts_own_address_through_the_starter(
    cluster: Cluster, tmp_path: Path, scheduler: str
) -> None:
    done = subprocess.run(
        launch_argv(cluster, "-n", "4", "-s", "0", "--", "sh", "-c", WHERE),
        cwd=tmp_path,
        env=job_env(cluster, scheduler, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    name = scheduler.upper()
    starter = SCHEDULERS[scheduler][3]
    job_id = SCHEDULERS[scheduler][2]
    assert f"inside {name} job {job_id}: 3 host(s), 4 slot(s); agents through {starter}" in (
        done.stderr
    )
    rows = [line.split("] ", 1)[1].split() for line in done.stdout.splitlines() if "] " in line]
    addresses = {host.name: host.address for host in cluster.hosts}
    workers = sorted(row[1] for row in rows if row[0] == "worker")
    assert workers == ["h1", "h1", "h2", "h3"]  # the node file's slots
    for _, hostname, node_host, root_uri in rows:
        assert node_host == addresses[hostname]
        assert root_uri == addresses["h1"]  # the scheduler on the job's first host
    engine = job_document(tmp_path)["engine"]
    assert engine == {"name": name.lower(), "job_id": job_id}
    assert_hosts_empty(cluster)


def test_the_first_failure_ends_the_job_with_its_own_exit_code(
    cluster: Cluster, tmp_path: Path, scheduler: str
) -> None:
    done = subprocess.run(
        launch_argv(
            cluster, "-n", "3", "-s", "1", "--", PYTHON, BY_TASK, "worker.2=exit:7:0.5", "*=sleep"
        ),
        cwd=tmp_path,
        env=job_env(cluster, scheduler, tmp_path),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 7, done.stderr
    assert re.search(r"worker\.2@h\d exited with code 7", done.stderr), done.stderr
    assert_hosts_empty(cluster)


@pytest.fixture
def launched() -> Iterator[list[subprocess.Popen[str]]]:
    started: list[subprocess.Popen[str]] = []
    yield started
    for popen in started:
        if popen.poll() is None:
            popen.kill()
            popen.communicate()


@pytest.mark.parametrize("how", ["sigkill", "sigint"])
def test_dtrain_killed_or_interrupted_leaves_nothing_on_any_host(
    cluster: Cluster,
    tmp_path: Path,
    scheduler: str,
    how: str,
    launched: list[subprocess.Popen[str]],
) -> None:
    popen = subprocess.Popen(
        launch_argv(cluster, "-n", "3", "-s", "1", "--", PYTHON, BY_TASK, "*=sleep"),
        cwd=tmp_path,
        env=job_env(cluster, scheduler, tmp_path),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    launched.append(popen)
    pids = running_tasks(tmp_path, 5)
    popen.send_signal(signal.SIGKILL if how == "sigkill" else signal.SIGINT)
    popen.communicate(timeout=60)
    assert popen.returncode == (-9 if how == "sigkill" else 130)
    assert wait_gone(pids, 15) == []
    assert cluster_tasks(cluster) == []
    assert_hosts_empty(cluster)


def test_without_the_starter_the_agents_start_over_ssh_and_say_what_that_costs(
    cluster: Cluster, tmp_path: Path, scheduler: str
) -> None:
    done = subprocess.run(
        launch_argv(cluster, "-n", "4", "-s", "0", "--", "sh", "-c", WHERE),
        cwd=tmp_path,
        env=job_env(cluster, scheduler, tmp_path, standin=False),
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert done.returncode == 0, done.stderr
    name, starter = scheduler.upper(), SCHEDULERS[scheduler][3]
    said = [line for line in done.stderr.splitlines() if f"no {starter} on PATH" in line]
    assert said == [
        f"dtrain: inside {name} job {SCHEDULERS[scheduler][2]}: 3 host(s), 4 slot(s); no "
        f"{starter} on PATH: the agents start over ssh, and their tasks escape {name}'s "
        "accounting (deleting the job does not stop them)"
    ], done.stderr
    rows = [line.split("] ", 1)[1].split() for line in done.stdout.splitlines() if "] " in line]
    assert sorted(row[1] for row in rows if row[0] == "worker") == ["h1", "h1", "h2", "h3"]
    assert job_document(tmp_path)["engine"] == {"name": "ssh"}


def test_a_node_file_that_does_not_exist_is_one_line_and_nothing_starts(
    cluster: Cluster, tmp_path: Path, scheduler: str
) -> None:
    env = job_env(cluster, scheduler, tmp_path)
    file_var = SCHEDULERS[scheduler][0]
    env[file_var] = str(tmp_path / "gone")
    done = run_dtrain(["launch", "--", "true"], tmp_path, env=env)
    assert done.returncode == 2, done.stderr
    assert done.stderr.splitlines()[0] == (
        f"dtrain: node file {tmp_path / 'gone'} (${file_var}) does not exist"
    )
    assert not (tmp_path / "dtrain-logs").exists()
