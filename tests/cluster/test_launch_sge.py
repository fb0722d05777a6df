"""`dtrain launch` inside Grid Engine parallel-environment jobs on the suite's real SGE cluster.

dtrain runs where a user's would: in the job script qsub ran on the job's first host. Its
hosts come from $PE_HOSTFILE; the other hosts' agents start with `qrsh -inherit`, under their
execd's shepherd. The tests watch the job from outside: its files in the (shared) test dir,
its processes by the dtrain job's tag, and qstat/qacct.
"""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import PYTHON, ROOT, SESSION, SESSION_VAR, dtrain_argv, program, wait_gone

from .sgecluster import JobOutcome, SgeCluster
from .test_launch_slurm import job_of, running_tasks
from .test_slurmcluster import wait_for

BY_TASK = program("by_task.py")
WHERE = 'echo "$DMLC_ROLE $(hostname) $DMLC_NODE_HOST $DMLC_PS_ROOT_URI"'
EXAMPLES = ROOT / "examples"


def preamble() -> str:
    """What every job script sets first: this test run's tag (the leftover check finds what
    the job left by it) and, when set, where dtrain is imported from."""
    lines = [f"export {SESSION_VAR}={shlex.quote(SESSION)}"]
    if os.environ.get("PYTHONPATH"):
        lines.append(f"export PYTHONPATH={shlex.quote(os.environ['PYTHONPATH'])}")
    return "\n".join(lines)


def run_in_job(
    sge: SgeCluster, args: list[str], cwd: Path, slots: int = 3, timeout_s: float = 120
) -> JobOutcome:
    """`dtrain ARGS` as the whole job script of a `-pe dtrain SLOTS` job; its outcome
    (exit_status is dtrain's)."""
    body = f"{preamble()}\n{shlex.join(dtrain_argv(*args))}"
    return sge.wait(sge.submit(body, slots, cwd=cwd), timeout_s)


def start_in_job(sge: SgeCluster, args: list[str], cwd: Path, slots: int = 3) -> str:
    """A job whose script becomes `dtrain ARGS` (exec: signals reach dtrain itself), with its
    host, environment and pid in cwd; the job's id, once dtrain runs."""
    q = shlex.quote
    body = "\n".join(
        [
            preamble(),
            f"hostname > {q(str(cwd / 'master'))}",
            f"env -0 > {q(str(cwd / 'job.env'))}",
            f"echo $$ > {q(str(cwd / 'dtrain.pid'))}",
            f"exec {shlex.join(dtrain_argv(*args))} "
            f"> {q(str(cwd / 'dtrain.out'))} 2> {q(str(cwd / 'dtrain.err'))}",
        ]
    )
    job = sge.submit(body, slots, cwd=cwd)
    wait_for(lambda: (cwd / "dtrain.pid").exists(), 60, "the job script to start")
    return job


def master(cwd: Path) -> str:
    return (cwd / "master").read_text().strip()


def signal_dtrain(sge: SgeCluster, cwd: Path, sig: int) -> None:
    """Signal dtrain in the job script's host (its pid is that host's)."""
    pid = (cwd / "dtrain.pid").read_text().strip()
    sge.cluster.run(master(cwd), ["kill", f"-{sig}", pid], check=True)


def job_env(cwd: Path) -> dict[str, str]:
    """What a shell in the job has: the job script's environment, as it wrote it."""
    pairs = (item.split("=", 1) for item in (cwd / "job.env").read_text().split("\0") if item)
    return dict(pair for pair in pairs if len(pair) == 2)


def nothing_left(sge: SgeCluster) -> Callable[[], bool]:
    return lambda: not any(sge.job_pids(h) for h in sge.hosts)


def test_roles_and_each_hosts_own_address_inside_a_pe_job(
    sge_cluster: SgeCluster, tmp_path: Path
) -> None:
    done = run_in_job(
        sge_cluster, ["launch", "-n", "3", "-s", "2", "--", "sh", "-c", WHERE], tmp_path
    )

    assert done.exit_status == 0, done.stderr
    found = re.search(r"dtrain: inside Grid Engine job (\d+): 3 hosts (h\d), h\d, h\d", done.stderr)
    assert found and found.group(1) == done.job_id, done.stderr
    first = found.group(2)  # the job script's host: the scheduler's
    rows = [line.split("] ", 1)[1].split() for line in done.stdout.splitlines() if "] " in line]
    assert sorted(row[0] for row in rows) == [
        "scheduler", "server", "server", "worker", "worker", "worker",
    ]  # fmt: skip
    addresses = {host.name: host.address for host in sge_cluster.hosts}
    for _role, hostname, node_host, root_uri in rows:
        assert root_uri == addresses[first]
        assert node_host == addresses[hostname]  # each task's own host's address
    assert {row[1] for row in rows} == {"h1", "h2", "h3"}
    engine = job_of(tmp_path)["engine"]
    assert engine == {"name": "sge", "job_id": done.job_id, "pe": "dtrain"}


def test_the_first_failure_ends_the_job_with_the_tasks_own_exit_code(
    sge_cluster: SgeCluster, tmp_path: Path
) -> None:
    args = ["launch", "-n", "3", "-s", "1", "--", PYTHON, BY_TASK, "worker.2=exit:7:0.5", "*=sleep"]
    done = run_in_job(sge_cluster, args, tmp_path)

    assert done.exit_status == 7, done.stderr
    assert re.search(r"worker\.2@h\d exited with code 7", done.stderr), done.stderr
    assert job_of(tmp_path)["state"] == "failed"
    wait_for(nothing_left(sge_cluster), 10, "no process of the job on any host")


# How dtrain is stopped -> its exit status as the job's (a signal: 128 + its number).
ENDINGS = {"sigkill": 137, "sigint": 130, "sigterm": 143, "timeout": 124}


@pytest.mark.parametrize("how", sorted(ENDINGS))
def test_dtrain_killed_interrupted_or_timed_out_leaves_nothing_on_any_host(
    sge_cluster: SgeCluster, tmp_path: Path, how: str
) -> None:
    timeout = ["--timeout", "8"] if how == "timeout" else []  # time to find the tasks first
    args = ["launch", *timeout, "-n", "2", "-s", "1", "--", PYTHON, BY_TASK, "*=sleep"]
    job = start_in_job(sge_cluster, args, tmp_path)
    pids = running_tasks(tmp_path, 4)
    signals = {"sigkill": signal.SIGKILL, "sigint": signal.SIGINT, "sigterm": signal.SIGTERM}
    if how in signals:
        signal_dtrain(sge_cluster, tmp_path, signals[how])

    done = sge_cluster.wait(job, 60)

    assert done.exit_status == ENDINGS[how], (tmp_path / "dtrain.err").read_text()
    assert wait_gone(pids, 10) == [], how
    wait_for(nothing_left(sge_cluster), 10, "no process of the job on any host")


def test_qdel_of_the_job_leaves_nothing_on_any_host(
    sge_cluster: SgeCluster, tmp_path: Path
) -> None:
    args = ["launch", "-n", "3", "-s", "1", "--", PYTHON, BY_TASK, "*=tree"]
    job = start_in_job(sge_cluster, args, tmp_path)
    pids = running_tasks(tmp_path, 5)

    sge_cluster.qdel(job)

    # every task left two descendants, one in a session of its own: all go with the job
    assert wait_gone(pids, 15) == []
    wait_for(nothing_left(sge_cluster), 15, "no process of the job on any host")
    assert sge_cluster.wait(job, 30).job_id == job


def test_a_lost_host_is_named_and_the_rest_of_the_job_stopped(
    sge_cluster: SgeCluster, tmp_path: Path
) -> None:
    args = ["launch", "-n", "3", "-s", "1", "--", PYTHON, BY_TASK, "*=sleep"]
    job = start_in_job(sge_cluster, args, tmp_path)
    pids = running_tasks(tmp_path, 5)
    # neither the job script's host nor sge_qmaster's (the test asks it how the job ended)
    keep = {master(tmp_path), sge_cluster.master.name}
    lost = next(h.name for h in sge_cluster.hosts if h.name not in keep)

    sge_cluster.cluster.stop_host(lost)  # the machine is gone: its execd, agent and tasks

    done = sge_cluster.wait(job, 90)
    err = (tmp_path / "dtrain.err").read_text()
    assert done.exit_status != 0, err
    assert re.search(rf"\w+\.\d@{lost} was lost", err), err
    assert wait_gone(pids, 15) == []


def test_ps_stacks_doctor_and_kill_inside_the_job_reach_every_host(
    sge_cluster: SgeCluster, tmp_path: Path
) -> None:
    args = ["launch", "-n", "3", "-s", "1", "--", PYTHON, BY_TASK, "*=sleep"]
    job = start_in_job(sge_cluster, args, tmp_path)
    pids = running_tasks(tmp_path, 5)
    dtrain_job = (tmp_path / "dtrain-logs" / "latest").resolve().name
    env = job_env(tmp_path)

    def inside(*args: str, timeout_s: float = 60) -> JobOutcome:
        """`dtrain ARGS` from a shell in the job, on the job script's host."""
        done = sge_cluster.run(
            dtrain_argv(*args), master(tmp_path), env=env, cwd=tmp_path, timeout=timeout_s
        )
        return JobOutcome(job, done.returncode, "", done.stdout, done.stderr)

    ps = inside("ps", "--job", dtrain_job, "--json")
    assert ps.exit_status == 0, ps.stderr
    found = json.loads(ps.stdout)["data"]
    tasks = sorted(p["task"] for h in found["hosts"] for p in h["processes"] if p.get("task"))
    assert tasks == ["scheduler", "server.0", "worker.0", "worker.1", "worker.2"], found
    assert {h["host"] for h in found["hosts"]} >= {"h1", "h2", "h3"}, found
    doctor = inside("doctor", "--json", "--", PYTHON, "-c", "pass", timeout_s=90)
    assert doctor.exit_status == 0, doctor.stdout[-3000:]
    report = json.loads(doctor.stdout)
    assert {"h1", "h2", "h3"} <= {h["name"] for h in report["data"]["hosts"]}, report
    stacks = inside("stacks", "--job", dtrain_job)
    assert stacks.exit_status == 0, stacks.stderr
    assert stacks.stdout.startswith("5 tasks (scheduler@"), stacks.stdout
    kill = inside("kill", "--job", dtrain_job)
    assert kill.exit_status == 0, kill.stderr

    done = sge_cluster.wait(job, 60)
    assert done.exit_status != 0
    assert "killed" in (tmp_path / "dtrain.err").read_text()
    assert wait_gone(pids, 10) == []


def test_a_pe_without_control_slaves_is_one_line_and_nothing_starts(
    make_sge_cluster: Callable[..., SgeCluster], tmp_path: Path
) -> None:
    sge = make_sge_cluster(2, control_slaves=False)
    done = run_in_job(sge, ["launch", "-n", "2", "--", "sleep", "60"], tmp_path, slots=2)

    assert done.exit_status == 2, done.stderr
    assert 'parallel environment "dtrain" does not let it start tasks' in done.stderr
    assert "control_slaves is TRUE" in done.stderr
    assert "Traceback" not in done.stderr
    assert (
        not (tmp_path / "dtrain-logs" / "latest").exists() or job_of(tmp_path)["state"] != "running"
    )
    wait_for(nothing_left(sge), 10, "nothing left")


def test_a_job_without_a_pe_or_its_hostfile_is_one_line(
    sge_cluster: SgeCluster, tmp_path: Path
) -> None:
    body = f"{preamble()}\n{shlex.join(dtrain_argv('launch', '--launcher', 'sge', '--', 'true'))}"
    no_pe = sge_cluster.wait(sge_cluster.submit(body, 0, cwd=tmp_path), 60)
    assert no_pe.exit_status == 2, no_pe.stderr
    assert f"inside Grid Engine job {no_pe.job_id}, which has no parallel environment" in (
        no_pe.stderr
    )
    assert "qsub -pe NAME SLOTS" in no_pe.stderr

    gone = "PE_HOSTFILE=/nonexistent " + shlex.join(dtrain_argv("launch", "--", "true"))
    missing = sge_cluster.wait(sge_cluster.submit(f"{preamble()}\n{gone}", 2, cwd=tmp_path), 60)
    assert missing.exit_status == 2, missing.stderr
    assert "cannot read PE_HOSTFILE=/nonexistent: No such file or directory" in missing.stderr


def test_dry_run_inside_a_job_shows_the_qrsh_that_would_start_the_agents(
    sge_cluster: SgeCluster, tmp_path: Path
) -> None:
    done = run_in_job(sge_cluster, ["launch", "--dry-run", "-n", "2", "--", "true"], tmp_path)

    assert done.exit_status == 0, done.stderr
    assert re.search(r"starter: qrsh -inherit -nostdin -V h\d <agent>", done.stdout + done.stderr)
    assert not (tmp_path / "dtrain-logs").exists()


def test_mxnet_dist_sync_submitted_with_qsub(sge_cluster: SgeCluster, tmp_path: Path) -> None:
    variables = [f"{SESSION_VAR}={SESSION}", f"DTRAIN={PYTHON} -m dtrain", f"PYTHON={PYTHON}"]
    variables += [f"EXAMPLES={EXAMPLES}"]
    if os.environ.get("PYTHONPATH"):
        variables.append(f"PYTHONPATH={os.environ['PYTHONPATH']}")
    script = EXAMPLES / "sge" / "mxnet_dist_sync.sh"  # its own "-pe mpi 6": this site's PE
    extra = ["-v", ",".join(variables)]
    job = sge_cluster.submit_script(script, 6, extra=extra, cwd=tmp_path)
    done = sge_cluster.wait(job, 300)

    output = done.stdout + done.stderr
    assert done.exit_status == 0, output[-3000:]
    checksums = re.findall(r"worker rank \d+ checksum (\S+)", output)
    assert len(checksums) == 4 and len(set(checksums)) == 1, output[-3000:]
    assert f"inside Grid Engine job {job}: 3 hosts" in output
    assert set(re.findall(r"\[\w+\.?\d*@(h\d)\]", output)) == {"h1", "h2", "h3"}
