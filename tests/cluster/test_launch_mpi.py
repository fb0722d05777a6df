"""`dtrain launch --launcher mpi` on the real sshd cluster, with real Open MPI and MPICH.

One mpirun starts an agent on each host over the suite's ssh (the config dtrain is given);
each agent connects back. Every case runs under both MPIs and ends in bounded time with the
right exit code and no task process (nor mpirun) left anywhere.
"""

from __future__ import annotations

import contextlib
import json
import re
import shutil
import signal
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from dtrain.remote import procs
from tests.cluster.netcluster import BRIDGE_ADDRESS, SUBNET, Cluster, ClusterError
from tests.cluster.slurmcluster import SlurmCluster
from tests.cluster.test_launch_slurm import running_tasks
from tests.cluster.test_launch_ssh import assert_nothing_left, cluster_tasks
from tests.cluster.test_slurmcluster import wait_for
from tests.conftest import (
    PYTHON,
    ROOT,
    dtrain_argv,
    job_document,
    latest_job,
    program,
    run_dtrain,
    wait_gone,
)

BY_TASK = program("by_task.py")
PRINT_ENV = program("print_env.py")
WHERE = 'echo "$DMLC_ROLE $(hostname) $DMLC_NODE_HOST $DMLC_PS_ROOT_URI"'
MPIRUNS = {"openmpi": "mpirun.openmpi", "mpich": "mpiexec.hydra"}
MPI_PREFIXES = ("OMPI_", "PMIX_", "PMI_", "OPAL_", "HYDRA_", "MPI_LOCAL")


@pytest.fixture(params=sorted(MPIRUNS))
def mpirun(request: pytest.FixtureRequest) -> str:
    """Each MPI in turn (scripts/test.sh installs both: a missing one fails, never skips)."""
    name: str = MPIRUNS[request.param]
    return name


def mpi_args(cluster: Cluster, mpirun: str, hosts: Path | None = None) -> list[str]:
    """The flags of `--launcher mpi` on the cluster. Open MPI's daemons call mpirun back on
    every address this machine has unless told otherwise: kept to the cluster's subnet."""
    subnet = ["--mca", "oob_tcp_if_include", SUBNET] if "openmpi" in mpirun else []
    return [
        *(f"--mpi-arg={arg}" for arg in subnet),
        "--launcher",
        "mpi",
        "--mpirun",
        mpirun,
        "-H",
        str(hosts or cluster.hosts_file()),
        "--ssh-config",
        str(cluster.ssh_config),
    ]


def run(
    cluster: Cluster, mpirun: str, args: list[str], cwd: Path, timeout_s: float = 90
) -> subprocess.CompletedProcess[str]:
    command, *rest = args
    return run_dtrain([command, *mpi_args(cluster, mpirun), *rest], cwd, timeout_s=timeout_s)


@pytest.fixture
def launched(cluster: Cluster, tmp_path: Path) -> Iterator[list[subprocess.Popen[str]]]:
    """Launches started in the background; killed at the end if a test left one."""
    started: list[subprocess.Popen[str]] = []
    yield started
    for popen in started:
        if popen.poll() is None:
            popen.kill()
            popen.communicate()


def start(
    cluster: Cluster,
    mpirun: str,
    args: list[str],
    cwd: Path,
    launched: list[subprocess.Popen[str]],
) -> subprocess.Popen[str]:
    popen = subprocess.Popen(
        [PYTHON, "-m", "dtrain", "launch", *mpi_args(cluster, mpirun), *args],
        cwd=cwd,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,  # a signal to the test's group must not reach it
    )
    launched.append(popen)
    return popen


def which(name: str) -> str:
    found = shutil.which(name)
    assert found is not None, f"{name} is not installed (scripts/test.sh installs it)"
    return found


def engine_of(cwd: Path) -> dict[str, object]:
    engine = job_document(cwd)["engine"]
    assert isinstance(engine, dict)
    return engine


def mpirun_pid(cwd: Path) -> int:
    pid = engine_of(cwd)["pid"]
    assert isinstance(pid, int)
    return pid


def assert_hosts_empty(cluster: Cluster, within_s: float = 15) -> None:
    """No process at all on any host but its sshd: no task, agent, orted or hydra proxy."""

    def left() -> dict[str, list[int]]:
        found: dict[str, list[int]] = {}
        for host in cluster.hosts:
            with contextlib.suppress(ClusterError):  # a stopped host has nothing left
                found[host.name] = cluster.host_pids(host)
        return {name: pids for name, pids in found.items() if pids}

    try:
        wait_for(lambda: left() == {}, within_s, "every host to be empty")
    except AssertionError:
        table = procs.snapshot()
        shown = {name: procs.describe(table, pids) for name, pids in left().items()}
        raise AssertionError(f"left on the hosts: {shown}") from None


def test_roles_and_each_hosts_own_address_through_mpirun(
    cluster: Cluster, tmp_path: Path, mpirun: str
) -> None:
    done = run(cluster, mpirun, ["launch", "-n", "3", "-s", "2", "--", "sh", "-c", WHERE], tmp_path)
    assert done.returncode == 0, done.stderr
    rows = [line.split("] ", 1)[1].split() for line in done.stdout.splitlines() if "] " in line]
    assert sorted(row[0] for row in rows) == ["scheduler", "server", "server"] + ["worker"] * 3
    addresses = {host.name: host.address for host in cluster.hosts}
    for role, hostname, node_host, root_uri in rows:
        assert root_uri == BRIDGE_ADDRESS  # the scheduler on this machine, as over ssh
        if role != "scheduler":
            assert node_host == addresses[hostname]  # rank i is the i-th host: its own address
    assert {row[1] for row in rows if row[0] != "scheduler"} == {"h1", "h2", "h3"}
    engine = engine_of(tmp_path)
    assert engine["name"] == "mpi" and engine["mpirun"] == which(mpirun)
    assert engine["flavor"] == ("Open MPI" if "openmpi" in mpirun else "MPICH")
    assert wait_gone([mpirun_pid(tmp_path)], 10) == []
    assert_nothing_left(cluster, latest_job(tmp_path).name)
    assert_hosts_empty(cluster)


def test_argv_and_env_reach_every_host_byte_exact_without_mpis_variables(
    cluster: Cluster, tmp_path: Path, mpirun: str
) -> None:
    awkward = ["a b", "'quoted'", '"dq"', "$HOME", "ü€", "", "--x=1;rm -rf /"]
    done = run(
        cluster,
        mpirun,
        [
            "launch",
            "--framework",
            "torch",
            "-n",
            "3",
            "--nproc-per-host",
            "1",
            "--env",
            "ODD=x y 'z' $HOME",
            "--",
            PYTHON,
            PRINT_ENV,
            "-",
            *awkward,
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    reports = [json.loads(line.split("] ", 1)[1]) for line in done.stdout.splitlines()]
    assert len(reports) == 3
    for report in reports:
        assert report["argv"] == ["-", *awkward]
        assert report["env"]["ODD"] == "x y 'z' $HOME"
        assert report["env"]["MASTER_ADDR"] == cluster.hosts[0].address
        mpis = [name for name in report["env"] if name.startswith(MPI_PREFIXES)]
        assert mpis == [], mpis  # the agent's rank is not the task's
        assert "DTRAIN_AGENT_KEY" not in report["env"]
    assert sorted(r["env"]["RANK"] for r in reports) == ["0", "1", "2"]


def test_the_first_failure_ends_the_job_with_its_own_exit_code(
    cluster: Cluster, tmp_path: Path, mpirun: str
) -> None:
    args = ["launch", "-n", "3", "-s", "1", "--", PYTHON, BY_TASK, "worker.2=exit:7:0.5", "*=sleep"]
    done = run(cluster, mpirun, args, tmp_path)
    assert done.returncode == 7, done.stderr  # the task's code, not mpirun's
    assert "worker.2@h3 exited with code 7" in done.stderr
    assert job_document(tmp_path)["state"] == "failed"
    assert wait_gone([mpirun_pid(tmp_path)], 10) == []
    assert_nothing_left(cluster, latest_job(tmp_path).name)
    assert_hosts_empty(cluster)


# How dtrain is stopped -> its exit status (Popen's: -9 is SIGKILL).
ENDINGS = {"sigkill": -9, "sigint": 130, "sigterm": 143, "timeout": 124}


@pytest.mark.parametrize("how", sorted(ENDINGS))
def test_dtrain_killed_interrupted_or_timed_out_leaves_nothing_on_any_host(
    cluster: Cluster,
    tmp_path: Path,
    mpirun: str,
    how: str,
    launched: list[subprocess.Popen[str]],
) -> None:
    timeout = ["--timeout", "8"] if how == "timeout" else []  # time to find the tasks first
    args = [*timeout, "-n", "3", "-s", "1", "--", PYTHON, BY_TASK, "*=sleep"]
    popen = start(cluster, mpirun, args, tmp_path, launched)
    pids = running_tasks(tmp_path, 5)
    starter = mpirun_pid(tmp_path)
    signals = {"sigkill": signal.SIGKILL, "sigint": signal.SIGINT, "sigterm": signal.SIGTERM}
    if how in signals:
        popen.send_signal(signals[how])
    popen.communicate(timeout=60)
    assert popen.returncode == ENDINGS[how]
    assert wait_gone([*pids, starter], 15) == [], f"{how}: still running"
    assert cluster_tasks(cluster) == []
    assert_hosts_empty(cluster)


def test_mpirun_killed_ends_the_job_naming_it_and_leaves_nothing(
    cluster: Cluster, tmp_path: Path, mpirun: str, launched: list[subprocess.Popen[str]]
) -> None:
    args = ["-n", "3", "-s", "1", "--", PYTHON, BY_TASK, "*=sleep"]
    popen = start(cluster, mpirun, args, tmp_path, launched)
    pids = running_tasks(tmp_path, 5)
    name = Path(mpirun).name
    starter = mpirun_pid(tmp_path)
    subprocess.run(["kill", "-KILL", str(starter)], check=True, timeout=10)
    _, err = popen.communicate(timeout=90)
    assert popen.returncode != 0, err
    assert f"{name} was killed by SIGKILL while the job ran" in err, err
    assert re.search(r"@h\d was lost", err), err
    assert wait_gone(pids, 15) == []
    assert cluster_tasks(cluster) == []
    assert_hosts_empty(cluster)


def test_a_lost_host_is_named_and_the_rest_of_the_job_stopped(
    cluster: Cluster, tmp_path: Path, mpirun: str, launched: list[subprocess.Popen[str]]
) -> None:
    args = ["-n", "3", "-s", "1", "--", PYTHON, BY_TASK, "*=sleep"]
    popen = start(cluster, mpirun, args, tmp_path, launched)
    pids = running_tasks(tmp_path, 5)
    starter = mpirun_pid(tmp_path)
    cluster.stop_host("h3")  # the machine is gone: its agent and tasks, mpirun's link to it
    _, err = popen.communicate(timeout=90)
    assert popen.returncode != 0
    assert re.search(r"worker\.2@h3 was lost", err), err
    assert wait_gone([*pids, starter], 30) == []
    assert_hosts_empty(cluster)


def test_a_host_ssh_cannot_log_in_to_is_named_and_nothing_is_started(
    cluster: Cluster, tmp_path: Path, mpirun: str
) -> None:
    """MPICH's hydra waits forever on such a host: dtrain's own bound ends the wait."""
    cluster.revoke_key("h2")
    done = run_dtrain(
        [
            "launch",
            *mpi_args(cluster, mpirun),
            "--connect-timeout",
            "2",
            "-n",
            "3",
            "-s",
            "0",
            "--",
            PYTHON,
            BY_TASK,
            "*=sleep",
        ],
        tmp_path,
        timeout_s=120,
    )
    assert done.returncode == 3, done.stderr
    assert "nothing was started" in done.stderr.splitlines()[0], done.stderr
    assert re.search(r"^  h2: ", done.stderr, re.MULTILINE), done.stderr
    assert "Traceback" not in done.stderr
    assert cluster_tasks(cluster) == []
    assert_hosts_empty(cluster)


def test_ps_stacks_kill_and_doctor_reach_the_hosts_through_mpirun(
    cluster: Cluster, tmp_path: Path, mpirun: str, launched: list[subprocess.Popen[str]]
) -> None:
    args = ["-n", "3", "-s", "1", "--", PYTHON, BY_TASK, "*=sleep"]
    popen = start(cluster, mpirun, args, tmp_path, launched)
    pids = running_tasks(tmp_path, 5)
    job = latest_job(tmp_path).name
    through = mpi_args(cluster, mpirun)

    ps = run_dtrain(["ps", *through, "--job", job, "--json"], tmp_path)
    assert ps.returncode == 0, ps.stderr
    found = json.loads(ps.stdout)["data"]
    tasks = sorted(
        (p["task"], h["host"]) for h in found["hosts"] for p in h["processes"] if p.get("task")
    )
    expected = [("server.0", "h1"), ("worker.0", "h1"), ("worker.1", "h2"), ("worker.2", "h3")]
    assert tasks == expected, found
    doctor = run_dtrain(["doctor", *through, "--json", "--", PYTHON, "-c", "pass"], tmp_path, 120)
    report = json.loads(doctor.stdout)
    ssh = {r["host"]: r["detail"] for r in report["data"]["results"] if r["check"] == "ssh"}
    assert ssh["h1"].startswith(f"not used: reached through {which(mpirun)} ("), ssh
    assert {"h1", "h2", "h3"} <= {h["name"] for h in report["data"]["hosts"]}, report
    stacks = run_dtrain(["stacks", *through, "--job", job], tmp_path, 120)
    assert stacks.returncode == 0, stacks.stderr
    assert stacks.stdout.startswith("4 tasks ("), stacks.stdout
    kill = run_dtrain(["kill", *through, "--job", job], tmp_path, 120)
    assert kill.returncode == 0, kill.stderr
    _, err = popen.communicate(timeout=60)
    assert popen.returncode != 0 and "killed" in err, err
    assert wait_gone(pids, 15) == []
    assert_hosts_empty(cluster)


def test_mxnet_dist_sync_trains_through_mpirun(
    cluster: Cluster, tmp_path: Path, mpirun: str
) -> None:
    example = str(ROOT / "examples" / "mxnet_dist_sync.py")
    args = ["launch", "-n", "4", "-s", "2", "--", PYTHON, example, "--epochs", "2"]
    done = run(cluster, mpirun, args, tmp_path, timeout_s=240)
    assert done.returncode == 0, done.stderr[-3000:]
    checksums = re.findall(r"worker rank \d+ checksum (\S+)", done.stdout)
    assert len(checksums) == 4 and len(set(checksums)) == 1, done.stdout[-2000:]
    assert engine_of(tmp_path)["name"] == "mpi"
    assert_nothing_left(cluster, latest_job(tmp_path).name)
    assert_hosts_empty(cluster)


def test_a_partitioned_host_is_lost_and_mpirun_that_hangs_on_it_is_stopped(
    cluster: Cluster, tmp_path: Path, mpirun: str, launched: list[subprocess.Popen[str]]
) -> None:
    """No FIN reaches h3: its agent stops its tasks when its lease runs out, and dtrain ends
    the mpirun that waits on h3 forever (both MPIs hang there, even after SIGTERM). Open MPI's
    daemon on h3 cannot hear that until the network heals, and goes then."""
    args = ["--grace", "1", "--heartbeat-timeout", "3", "-n", "3", "-s", "0"]
    popen = start(cluster, mpirun, [*args, "--", PYTHON, BY_TASK, "*=sleep"], tmp_path, launched)
    pids = running_tasks(tmp_path, 4)
    starter = mpirun_pid(tmp_path)
    cluster.partition("h3", all_traffic=True)
    _, err = popen.communicate(timeout=90)
    assert popen.returncode == 255, err
    assert "worker.2@h3 was lost: no heartbeat from h3" in err, err
    assert wait_gone([*pids, starter], 15) == []
    assert cluster_tasks(cluster) == []
    cluster.heal("h3")
    assert_hosts_empty(cluster, within_s=60)


def test_inside_a_slurm_allocation_mpirun_starts_the_agents_through_slurm_without_ssh(
    slurm_cluster: SlurmCluster, tmp_path: Path
) -> None:
    """Open MPI's own Slurm support (srun) starts its daemons: no ssh between nodes."""
    slurm_cluster.block_ssh_all()
    subnet = ["--mca", "oob_tcp_if_include", SUBNET]
    launch = ["launch", "--launcher", "mpi", "--mpirun", "mpirun.openmpi"]
    launch += [*(f"--mpi-arg={arg}" for arg in subnet), "-n", "3", "-s", "1"]
    done = slurm_cluster.run(
        ["salloc", "-N3", *dtrain_argv(*launch, "--", "sh", "-c", WHERE)], timeout=120, cwd=tmp_path
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"dtrain: inside Slurm job \d+: 3 nodes .*; agents through ", done.stderr)
    rows = [line.split("] ", 1)[1].split() for line in done.stdout.splitlines() if "] " in line]
    addresses = {host.name: host.address for host in slurm_cluster.cluster.hosts}
    assert {row[1] for row in rows} == {"h1", "h2", "h3"}
    for _, hostname, node_host, root_uri in rows:
        assert node_host == addresses[hostname]
        assert root_uri == addresses["h1"]  # the allocation's hosts: the scheduler on the first
    assert engine_of(tmp_path)["name"] == "mpi"
