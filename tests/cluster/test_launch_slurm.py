"""`dtrain launch` through Slurm on the suite's real Slurm cluster, with ssh blocked on every node.

The launcher runs where a user's shell would: inside `salloc` on this machine (a login node),
inside `sbatch` on a node, or making its own allocation with `--launcher slurm --nodes N`.
"""

from __future__ import annotations

import json
import re
import select
import signal
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT, dtrain_argv, program, wait_gone

from .slurmcluster import SlurmCluster
from .test_launch_ssh import tasks_started
from .test_slurmcluster import pids_marked, wait_for

BY_TASK = program("by_task.py")
PRINT_ENV = program("print_env.py")
SLEEP_FOREVER = program("sleep_forever.py")
WHERE = 'echo "$DMLC_ROLE $(hostname) $DMLC_NODE_HOST $DMLC_PS_ROOT_URI"'


@pytest.fixture
def slurm(slurm_cluster: SlurmCluster) -> Iterator[SlurmCluster]:
    """The 3-node Slurm cluster with ssh refused on every node: nothing may use it."""
    slurm_cluster.block_ssh_all()
    yield slurm_cluster


def dtrain_in_salloc(
    slurm: SlurmCluster, nodes: int, args: list[str], cwd: Path, timeout_s: float = 90
) -> subprocess.CompletedProcess[str]:
    """`salloc -N nodes dtrain ARGS` from this machine, as a user on a login node types it."""
    return slurm.run(["salloc", f"-N{nodes}", *dtrain_argv(*args)], timeout=timeout_s, cwd=cwd)


def spawn_in_salloc(
    slurm: SlurmCluster, nodes: int, args: list[str], cwd: Path
) -> subprocess.Popen[str]:
    popen = subprocess.Popen(
        ["salloc", f"-N{nodes}", *dtrain_argv(*args)],
        cwd=cwd,
        env=slurm.client_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    return popen


def job_of(cwd: Path) -> dict[str, object]:
    document: dict[str, object] = json.loads(
        (cwd / "dtrain-logs" / "latest" / "job.json").read_text()
    )
    return document


def test_roles_and_each_nodes_own_address_through_slurm_without_ssh(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    done = dtrain_in_salloc(
        slurm,
        3,
        ["launch", "-n", "3", "-s", "2", "--", "sh", "-c", WHERE],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    assert re.search(r"dtrain: inside Slurm job \d+: 3 nodes h\[1-3\]", done.stderr), done.stderr
    rows = [line.split("] ", 1)[1].split() for line in done.stdout.splitlines() if "] " in line]
    roles = sorted(row[0] for row in rows)
    assert roles == ["scheduler", "server", "server", "worker", "worker", "worker"]
    addresses = {host.name: host.address for host in slurm.cluster.hosts}
    for role, hostname, node_host, root_uri in rows:
        assert root_uri == addresses["h1"]  # the scheduler runs on the first node
        if role != "scheduler":
            assert node_host == addresses[hostname]  # each task's own node's address
    assert {row[1] for row in rows} == {"h1", "h2", "h3"}
    engine = job_of(tmp_path)["engine"]
    assert isinstance(engine, dict) and engine["name"] == "slurm"
    assert str(engine["job_id"]).isdigit() and str(engine["step_id"]).isdigit()


def test_argv_and_env_reach_every_node_byte_exact(slurm: SlurmCluster, tmp_path: Path) -> None:
    awkward = ["a b", "'quoted'", '"dq"', "$HOME", "ü€", "", "--x=1;rm -rf /"]
    done = dtrain_in_salloc(
        slurm,
        3,
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
            "ODD,RANK,MASTER_ADDR,SLURM_JOB_ID,SLURM_PROCID,SLURM_NTASKS,SLURM_STEP_ID",
            *awkward,
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    reports = [json.loads(line.split("] ", 1)[1]) for line in done.stdout.splitlines()]
    assert len(reports) == 3
    first = slurm.cluster.hosts[0].address
    for report in reports:
        assert report["argv"] == [
            "ODD,RANK,MASTER_ADDR,SLURM_JOB_ID,SLURM_PROCID,SLURM_NTASKS,SLURM_STEP_ID",
            *awkward,
        ]
        assert report["env"]["ODD"] == "x y 'z' $HOME"
        assert report["env"]["MASTER_ADDR"] == first
        # the job's id, but not the agents' step's ranks: a framework reads dtrain's RANK
        assert report["env"]["SLURM_JOB_ID"].isdigit()
        assert not {"SLURM_PROCID", "SLURM_NTASKS", "SLURM_STEP_ID"} & set(report["env"])
    assert sorted(r["env"]["RANK"] for r in reports) == ["0", "1", "2"]


def test_the_first_failure_ends_the_job_with_its_own_exit_code(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    done = dtrain_in_salloc(
        slurm,
        3,
        ["launch", "-n", "3", "-s", "1", "--", PYTHON, BY_TASK, "worker.2=exit:7:0.5", "*=sleep"],
        tmp_path,
    )
    assert done.returncode == 7, done.stderr
    assert "worker.2@h3 exited with code 7" in done.stderr
    assert job_of(tmp_path)["state"] == "failed"


def start_allocating(slurm: SlurmCluster, args: list[str], cwd: Path) -> subprocess.Popen[str]:
    """`dtrain launch --launcher slurm --nodes 2 ARGS` from this machine: no allocation yet."""
    return subprocess.Popen(
        dtrain_argv("launch", "--launcher", "slurm", "--nodes", "2", *args),
        cwd=cwd,
        env=slurm.client_env(),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def slurm_jobs(slurm: SlurmCluster) -> str:
    return slurm.squeue("-h", "-o", "%i %T", check=True).stdout.strip()


def test_an_allocation_made_by_dtrain_runs_the_job_and_is_released(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    popen = start_allocating(slurm, ["-n", "2", "-s", "1", "--", "sh", "-c", WHERE], tmp_path)
    out, err = popen.communicate(timeout=90)
    assert popen.returncode == 0, err
    assert re.search(r"dtrain: Slurm job \d+: 2 nodes h1, h2", err), err
    hosts = sorted(line.split("] ", 1)[1].split()[1] for line in out.splitlines())
    assert len(hosts) == 4 and set(hosts) == {"h1", "h2"}  # scheduler, server, 2 workers
    wait_for(lambda: slurm_jobs(slurm) == "", 15, "the allocation's release")


def running_tasks(cwd: Path, count: int) -> list[int]:
    """Wait until `count` tasks printed `ready TASK PID`; their pids (as the root namespace
    sees them: found by the job's tag)."""
    logs = cwd / "dtrain-logs"
    wait_for(lambda: (logs / "latest").exists(), 60, "the job's log directory")
    job_id = (logs / "latest").resolve().name

    def ready() -> int:
        texts = (log.read_text(errors="replace") for log in (logs / "latest").glob("*.log"))
        return sum("ready" in text for text in texts)

    wait_for(lambda: ready() >= count, 60, f"{count} tasks' ready line")
    wait_for(lambda: tasks_started(logs / "latest"), 30, "the launcher's word that all started")
    pids = pids_marked(f"DTRAIN_JOB_ID={job_id}")
    assert len(pids) >= count, f"{len(pids)} processes carry the job's tag, {count} expected"
    return pids


# How dtrain is stopped -> its exit status (Popen's: -9 is SIGKILL).
ENDINGS = {"sigkill": -9, "sigint": 130, "sigterm": 143, "timeout": 124}


@pytest.mark.parametrize("how", sorted(ENDINGS))
def test_dtrain_killed_interrupted_or_timed_out_leaves_nothing_on_any_node(
    slurm: SlurmCluster, tmp_path: Path, how: str
) -> None:
    timeout = ["--timeout", "8"] if how == "timeout" else []  # time to find the tasks first
    popen = start_allocating(
        slurm, [*timeout, "-n", "2", "-s", "1", "--", PYTHON, BY_TASK, "*=sleep"], tmp_path
    )
    try:
        pids = running_tasks(tmp_path, 4)
        signals = {"sigkill": signal.SIGKILL, "sigint": signal.SIGINT, "sigterm": signal.SIGTERM}
        if how in signals:
            popen.send_signal(signals[how])
        popen.communicate(timeout=30)
        left = wait_gone(pids, 10)
        assert left == [], f"{how}: still running {left}"
        assert popen.returncode == ENDINGS[how]
        wait_for(lambda: slurm_jobs(slurm) == "", 20, "the allocation's release")
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait()


def test_scancel_of_the_job_ends_dtrain_saying_so(slurm: SlurmCluster, tmp_path: Path) -> None:
    popen = spawn_in_salloc(
        slurm, 3, ["launch", "-n", "3", "-s", "1", "--", PYTHON, BY_TASK, "*=sleep"], tmp_path
    )
    try:
        pids = running_tasks(tmp_path, 5)
        engine = job_of(tmp_path)["engine"]
        assert isinstance(engine, dict)
        slurm.scancel(str(engine["job_id"]), check=True)
        _, err = popen.communicate(timeout=60)
        assert wait_gone(pids, 10) == []
        assert f"Slurm cancelled job {engine['job_id']}" in err, err
        assert popen.returncode != 0
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait()


EXAMPLES = ROOT / "examples"


def run_sbatch(slurm: SlurmCluster, script: str, cwd: Path, timeout_s: float = 300) -> str:
    """Submit one of examples/slurm/ from this machine as a user would; wait for the job to
    end (bounded); its output, after checking that it succeeded."""
    env = {
        "DTRAIN": f"{PYTHON} -m dtrain",
        "PYTHON": PYTHON,
        "EXAMPLES": str(EXAMPLES),
    }
    submitted = slurm.run(
        ["sbatch", "--parsable", "--output=slurm-%j.out", str(EXAMPLES / "slurm" / script)],
        cwd=cwd,
        env=env,
        check=True,
    )
    job = submitted.stdout.strip().split(";")[0]

    def state() -> str:
        shown = slurm.scontrol("-o", "show", "job", job, check=True).stdout
        return dict(f.split("=", 1) for f in shown.split() if "=" in f)["JobState"]

    wait_for(lambda: state() not in ("PENDING", "RUNNING", "COMPLETING"), timeout_s, "the job")
    output = (cwd / f"slurm-{job}.out").read_text()
    assert state() == "COMPLETED", output[-3000:]
    return output


def test_mxnet_dist_sync_through_sbatch(slurm: SlurmCluster, tmp_path: Path) -> None:
    output = run_sbatch(slurm, "mxnet_dist_sync.sbatch", tmp_path)
    checksums = re.findall(r"worker rank \d+ checksum (\S+)", output)
    assert len(checksums) == 4 and len(set(checksums)) == 1, output[-3000:]
    assert "inside Slurm job" in output
    servers = re.findall(r"\[server\.\d@(h\d)\]", output)
    assert servers == [] or set(servers) <= {"h1", "h2", "h3"}


def test_torch_ddp_through_sbatch(slurm: SlurmCluster, tmp_path: Path) -> None:
    output = run_sbatch(slurm, "torch_ddp.sbatch", tmp_path)
    sums = re.findall(r"\[worker\.(\d)@(h\d)\] rank \d checksum (\S+)", output)
    assert sorted((rank, host) for rank, host, _ in sums) == [
        ("0", "h1"),
        ("1", "h1"),
        ("2", "h2"),
        ("3", "h2"),
    ], output[-3000:]
    assert len({checksum for _, _, checksum in sums}) == 1


def allocation_env(slurm: SlurmCluster, job_id: str) -> dict[str, str]:
    """What a shell inside the allocation has (salloc, sbatch, srun --pty bash)."""
    return {**slurm.client_env(), "SLURM_JOB_ID": job_id, "SLURM_JOB_NODELIST": "h[1-3]"}


def hold_allocation(slurm: SlurmCluster, nodes: int) -> str:
    """An allocation of `nodes` nodes that outlives any one command in it, as an interactive
    `salloc` shell's does (`salloc --no-shell`); its job id. The caller scancels it."""
    slurm.run(["salloc", f"-N{nodes}", "--no-shell"], check=True)
    return slurm_jobs(slurm).split()[0]


def test_ps_stacks_kill_and_doctor_inside_the_allocation_work_on_its_nodes_through_slurm(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    # The launch and the commands after it run from shells of one allocation, so the
    # allocation does not end with the launch (under `salloc dtrain launch` it would, and
    # with it the kill's own step, while the kill still reports).
    allocation = hold_allocation(slurm, 3)
    env = allocation_env(slurm, allocation)
    popen = subprocess.Popen(
        dtrain_argv("launch", "-n", "3", "-s", "1", "--", PYTHON, BY_TASK, "*=sleep"),
        cwd=tmp_path,
        env=env,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:
        pids = running_tasks(tmp_path, 5)
        engine = job_of(tmp_path)["engine"]
        assert isinstance(engine, dict) and str(engine["job_id"]) == allocation
        job = (tmp_path / "dtrain-logs" / "latest").resolve().name

        def inside(*args: str, timeout_s: float = 60) -> subprocess.CompletedProcess[str]:
            """`dtrain ARGS` from a shell inside the allocation."""
            return subprocess.run(
                dtrain_argv(*args),
                cwd=tmp_path,
                env=env,
                capture_output=True,
                text=True,
                timeout=timeout_s,
            )

        ps = inside("ps", "--job", job, "--json")
        assert ps.returncode == 0, ps.stderr
        found = json.loads(ps.stdout)["data"]
        tasks = sorted(
            (p["task"], h["host"]) for h in found["hosts"] for p in h["processes"] if p.get("task")
        )
        assert [t for t, _ in tasks] == [
            "scheduler",
            "server.0",
            "worker.0",
            "worker.1",
            "worker.2",
        ], found
        doctor = inside("doctor", "--json", "--", PYTHON, "-c", "pass", timeout_s=90)
        report = json.loads(doctor.stdout)
        assert doctor.returncode == 0, doctor.stdout[-3000:]
        ssh = {r["host"]: r["detail"] for r in report["data"]["results"] if r["check"] == "ssh"}
        assert ssh["h1"].startswith("not used: reached through Slurm job"), ssh
        hosts = {h["name"] for h in report["data"]["hosts"]}
        assert {"h1", "h2", "h3"} <= hosts, report
        stacks = inside("stacks", "--job", job)
        assert stacks.returncode == 0, stacks.stderr
        assert stacks.stdout.startswith("5 tasks (scheduler@h1, "), stacks.stdout
        kill = inside("kill", "--job", job)
        assert kill.returncode == 0, kill.stderr
        _, err = popen.communicate(timeout=60)
        assert popen.returncode != 0
        assert "killed" in err, err
        assert wait_gone(pids, 10) == []
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait()
        slurm.scancel(allocation)


def test_a_lost_node_is_named_and_the_rest_of_the_job_stopped(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    popen = spawn_in_salloc(
        slurm, 3, ["launch", "-n", "3", "-s", "1", "--", PYTHON, BY_TASK, "*=sleep"], tmp_path
    )
    try:
        pids = running_tasks(tmp_path, 5)
        slurm.cluster.stop_host("h3")  # the machine is gone: its slurmd, agent and tasks
        _, err = popen.communicate(timeout=90)
        assert popen.returncode != 0
        assert re.search(r"worker\.2@h3 was lost", err), err
        assert wait_gone(pids, 15) == []
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.wait()


def stderr_until(popen: subprocess.Popen[str], needle: str, timeout_s: float) -> str:
    """The process's stderr up to the first line holding `needle` (bounded: AssertionError
    with what came, if it does not come in time)."""
    assert popen.stderr is not None
    deadline = time.monotonic() + timeout_s
    seen = ""
    while time.monotonic() < deadline:
        ready, _, _ = select.select([popen.stderr], [], [], 0.2)
        if ready:
            line = popen.stderr.readline()
            if not line:
                break
            seen += line
            if needle in line:
                return seen
    raise AssertionError(f"no {needle!r} on stderr within {timeout_s}s; got: {seen}")


def test_srun_waiting_inside_a_suspended_allocation_is_shown_as_it_waits(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    allocation = hold_allocation(slurm, 3)
    slurm.scontrol("suspend", allocation, check=True)
    popen = subprocess.Popen(
        dtrain_argv("ps"),
        cwd=tmp_path,
        env=allocation_env(slurm, allocation),
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    try:  # said within seconds, not when the agents' 120 s wait gives up
        seen = stderr_until(popen, "Slurm has not started dtrain's agents", 30)
        assert f"on 3 node(s) after 5s (Slurm job {allocation} is SUSPENDED); waiting" in seen
        popen.send_signal(signal.SIGINT)  # the user, told, need not wait out the 120 s
        _, err = popen.communicate(timeout=30)
        assert popen.returncode == 130, seen + err
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.communicate()
        slurm.scancel(allocation)


def test_node_names_that_do_not_resolve_are_said_to_not_resolve(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    """From inside h1 (no route out: the failing lookup sends nothing), in an allocation
    whose node list names nodes nobody knows."""
    env = {"SLURM_JOB_ID": "1", "SLURM_JOB_NODELIST": "ghost[1-2]"}
    done = slurm.run(dtrain_argv("ps"), "h1", env=env, cwd=tmp_path, timeout=60)
    assert done.returncode == 3, done.stderr
    assert "the Slurm nodes' names do not resolve on this machine: ghost1 (" in done.stderr
    assert "no route" not in done.stderr


def test_a_failed_attempt_restarts_inside_the_same_allocation(
    slurm: SlurmCluster, tmp_path: Path
) -> None:
    probe = program("restart_probe.py")
    done = dtrain_in_salloc(
        slurm,
        3,
        ["launch", "-n", "3", "-s", "1", "--max-restarts", "2", "--restart-delay", "0",
         "--restart-window", "0", "--grace", "1", "--", PYTHON, probe, "worker.1", "1", "7", "1"],
        tmp_path,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    assert "attempt 1 of 3 failed: worker.1@h2 exited with code 7" in done.stderr
    attempts = job_of(tmp_path)["attempts"]
    assert isinstance(attempts, list) and [a["exit_code"] for a in attempts] == [7, 0]
    first, second = (a["engine"] for a in attempts)
    assert first["name"] == second["name"] == "slurm"
    assert first["job_id"] == second["job_id"]  # the same allocation
    assert first["step_id"] == second["step_id"]  # its agents, kept for the restart
    assert sorted(attempts[1]["hosts"]) == ["h1", "h2", "h3"]
