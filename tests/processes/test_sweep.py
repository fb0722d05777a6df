"""`dtrain ps` and `dtrain kill` on this machine, with real processes.

Other people run tests on this machine at the same time, so every kill here names its job
(`--job`): a kill without it would stop their jobs too. The no-`--job` path is exercised on
the cluster (tests/cluster/test_cleanup_ssh.py), whose hosts have their own PID namespaces.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import secrets
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from dtrain.errors import ExitCode, Problem
from dtrain.processes.launcher import DeadLauncherJob, Launcher
from dtrain.processes.results import (
    HostKill,
    HostScan,
    JobProcess,
    Survivor,
    kill_outcome,
    scan_outcome,
)
from dtrain.remote import procs, proto
from dtrain.render.processes import cpu_text, duration_text, kill_text, ps_text, size_text
from tests.conftest import (
    PYTHON,
    job_pids,
    program,
    run_dtrain,
    start_dtrain,
    wait_for_latest,
    wait_gone,
)

SLEEPER = [PYTHON, "-c", "import time; time.sleep(3600)"]
ZOMBIE_PARENT = [
    PYTHON,
    "-c",
    "import os, time\nif os.fork() == 0:\n    os._exit(0)\ntime.sleep(3600)",
]


def new_job() -> str:
    return f"test-cleanup-{os.getpid()}-{secrets.token_hex(3)}"


class Spawner:
    """Starts tagged (or untagged) processes, each in its own session like a dtrain task, and
    kills whatever is left of them by process group at the end of the test."""

    def __init__(self) -> None:
        self.started: list[subprocess.Popen[bytes]] = []
        self.jobs: set[str] = set()

    def __call__(
        self,
        argv: Sequence[str],
        job: str | None = None,
        task: str = "worker.0",
        user: int | None = None,
    ) -> subprocess.Popen[bytes]:
        env = dict(os.environ)  # carries the test session marker the leftover check looks for
        if job is not None:
            env.update({proto.JOB_ID_VAR: job, proto.TASK_VAR: task})
            self.jobs.add(job)
        proc = subprocess.Popen(
            list(argv),
            env=env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.DEVNULL,
            start_new_session=True,
            user=user,
            group=user,
        )
        self.started.append(proc)
        return proc

    def close(self) -> None:
        for proc in self.started:
            with contextlib.suppress(OSError):
                os.killpg(proc.pid, signal.SIGKILL)
        for job in self.jobs:  # descendants that left the group (setsid), by tag
            for pid in job_pids(job):
                with contextlib.suppress(OSError):
                    os.kill(pid, signal.SIGKILL)
        for proc in self.started:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(timeout=5)


@pytest.fixture
def spawn() -> Iterator[Spawner]:
    spawner = Spawner()
    yield spawner
    spawner.close()


def wait_for_job(job: str, count: int, timeout_s: float = 10.0) -> list[int]:
    """Wait until `count` processes of the job are alive; return their pids."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        pids = job_pids(job)
        if len(pids) >= count:
            return pids
        time.sleep(0.05)
    raise AssertionError(f"job {job}: {count} processes did not appear within {timeout_s}s")


def kill_json(*args: str, cwd: Path) -> tuple[subprocess.CompletedProcess[str], dict[str, Any]]:
    result = run_dtrain(["kill", "--json", *args], cwd)
    return result, json.loads(result.stdout)


def host_entry(document: dict[str, Any]) -> dict[str, Any]:
    data = document["data"]
    assert isinstance(data, dict)
    (host,) = data["hosts"]
    assert isinstance(host, dict)
    return host


# ---- real processes --------------------------------------------------------------------------


def test_kills_tagged_processes_and_all_their_descendants(spawn: Spawner, tmp_path: Path) -> None:
    job = new_job()
    leader = spawn([PYTHON, program("spawn_tree.py")], job)
    pids = wait_for_job(job, 5)  # leader, child, escaped child, middle, grandchild
    assert leader.pid in pids
    result = run_dtrain(["kill", "--job", job, "--grace", "3"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert wait_gone(pids, 1) == []
    assert "stopped 5 of 5 processes: 5 on SIGTERM" in result.stdout
    assert f"job {job}" in result.stdout
    assert result.stdout.endswith("stopped 5 processes on 1 host; nothing is left\n")
    assert result.stderr == ""


def test_a_process_with_the_same_command_line_but_no_tag_is_not_a_job_process(
    spawn: Spawner, tmp_path: Path
) -> None:
    job = new_job()
    tagged = spawn(SLEEPER, job)
    untagged = spawn(SLEEPER)
    wait_for_job(job, 1)
    assert procs.read_cmdline(tagged.pid) == procs.read_cmdline(untagged.pid)
    # Every job's processes on this machine (read only: this selects, it stops nothing).
    everything = procs.select_job_processes(procs.snapshot())
    assert tagged.pid in everything and untagged.pid not in everything
    result = run_dtrain(["kill", "--job", job, "--grace", "3"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert wait_gone([tagged.pid], 1) == []
    assert procs.alive(untagged.pid)


def test_a_process_ignoring_sigterm_is_killed_after_the_grace(
    spawn: Spawner, tmp_path: Path
) -> None:
    job = new_job()
    stubborn = spawn([PYTHON, program("ignore_sigterm.py")], job, task="worker.1")
    polite = spawn(SLEEPER, job, task="worker.0")
    wait_for_job(job, 2)
    time.sleep(0.3)  # let ignore_sigterm.py install its handler
    result, document = kill_json("--job", job, "--grace", "1", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    fates = {p["pid"]: p["fate"] for p in host_entry(document)["processes"]}
    assert fates == {stubborn.pid: "kill", polite.pid: "term"}
    assert wait_gone([stubborn.pid, polite.pid], 1) == []


def test_job_selects_one_of_two_jobs(spawn: Spawner, tmp_path: Path) -> None:
    first, second = new_job(), new_job()
    spawn([PYTHON, program("spawn_tree.py")], first)
    spawn([PYTHON, program("spawn_tree.py")], second)
    first_pids = wait_for_job(first, 5)
    second_pids = wait_for_job(second, 5)
    result = run_dtrain(["kill", "--job", first, "--grace", "3"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert wait_gone(first_pids, 1) == []
    assert all(procs.alive(pid) for pid in second_pids)
    assert second not in result.stdout


def test_a_job_process_in_another_pid_namespace_is_not_this_machines_to_stop(
    spawn: Spawner, tmp_path: Path
) -> None:
    # A container's processes show in root's /proc, but no launcher here started them.
    job = new_job()
    tag = [f"{proto.JOB_ID_VAR}={job}", f"{proto.TASK_VAR}=worker.0"]
    contained = spawn(["unshare", "--pid", "--fork", "env", *tag, *SLEEPER])
    deadline = time.monotonic() + 10
    while not (inside := job_pids(job)) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert inside, "the process in the new PID namespace did not start"
    assert procs.pid_namespace(inside[0]) != procs.pid_namespace("self")
    result = run_dtrain(["kill", "--job", job, "--grace", "1"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "nothing to stop" in result.stdout, result.stdout
    assert all(procs.alive(pid) for pid in inside) and contained.poll() is None


def test_dry_run_lists_and_kills_nothing(spawn: Spawner, tmp_path: Path) -> None:
    job = new_job()
    spawn([PYTHON, program("spawn_tree.py")], job)
    pids = wait_for_job(job, 5)
    result = run_dtrain(["kill", "--job", job, "--dry-run"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert "would stop 5 processes" in result.stdout
    assert "nothing was signalled" in result.stdout
    time.sleep(0.3)
    assert all(procs.alive(pid) for pid in pids)


def test_ps_groups_by_job_with_task_age_cpu_and_rss(spawn: Spawner, tmp_path: Path) -> None:
    job = new_job()
    spawn(SLEEPER, job, task="server.0")
    spawn(ZOMBIE_PARENT, job, task="worker.3")
    pids = wait_for_job(job, 2)
    time.sleep(0.5)  # the forked child has exited: a zombie, which does not count
    result = run_dtrain(["ps", "--job", job], tmp_path)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines[0].endswith("(this machine): 2 job processes")
    assert lines[1] == f"  job {job}"
    assert lines[2].split() == [
        "PID",
        "TASK",
        "STATE",
        "AGE",
        "CPU",
        "CPU%",
        "RSS",
        "OUTPUT",
        "COMMAND",
    ]
    rows = {line.split()[1]: line.split() for line in lines[3:]}
    assert set(rows) == {"server.0", "worker.3"}
    assert rows["server.0"][8:] == SLEEPER[:2] + SLEEPER[2].split()
    assert rows["server.0"][2] == "sleeping" and rows["server.0"][5] == "0"  # CPU % just now
    assert rows["server.0"][4] == "0:00" and rows["server.0"][6].endswith("M")
    assert rows["server.0"][7] == "-"  # no launcher of this job here: no output age
    assert sorted(int(row[0]) for row in rows.values()) == sorted(pids)


def test_json_is_one_document_with_every_process_and_its_fate(
    spawn: Spawner, tmp_path: Path
) -> None:
    job = new_job()
    leader = spawn(SLEEPER, job, task="scheduler")
    wait_for_job(job, 1)
    listed = run_dtrain(["ps", "--json", "--job", job], tmp_path)
    assert listed.returncode == 0, listed.stderr
    document = json.loads(listed.stdout)
    assert document["command"] == "ps" and document["status"] == "ok"
    assert document["exit_code"] == 0 and document["errors"] == []
    host = host_entry(document)
    assert host["reachable"] is True and host["local"] is True and host["error"] is None
    (process,) = host["processes"]
    assert process["pid"] == leader.pid
    assert process["job_id"] == job and process["task"] == "scheduler"
    assert process["argv"] == SLEEPER
    assert {"age_s", "cpu_s", "rss_bytes", "started_at", "pgid", "state"} <= set(process)

    result, killed = kill_json("--job", job, "--grace", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert killed["command"] == "kill" and killed["status"] == "ok"
    assert killed["data"]["job"] == job and killed["data"]["grace_s"] == 2
    host = host_entry(killed)
    assert [p["fate"] for p in host["processes"]] == ["term"]
    assert host["survivors"] == []


def test_another_users_process_is_never_touched(spawn: Spawner, tmp_path: Path) -> None:
    if os.getuid() != 0:
        pytest.skip("needs root to start a process as another user")
    job = new_job()
    theirs = spawn(["sleep", "600"], job, user=65534)  # nobody, with our job's tag
    ours = spawn(SLEEPER, job)
    wait_for_job(job, 1)
    assert procs.read_environ(theirs.pid) is not None
    result, document = kill_json("--job", job, "--grace", "2", cwd=tmp_path)
    assert result.returncode == 0, result.stderr
    assert [p["pid"] for p in host_entry(document)["processes"]] == [ours.pid]
    assert procs.alive(theirs.pid)


def test_the_caller_and_the_agent_are_never_stopped_even_if_tagged(
    spawn: Spawner, tmp_path: Path
) -> None:
    # `dtrain kill` run from inside a task of the job it kills: it must not kill itself.
    job = new_job()
    sibling = spawn(SLEEPER, job, task="worker.1")
    wait_for_job(job, 1)
    env = dict(os.environ, **{proto.JOB_ID_VAR: job, proto.TASK_VAR: "worker.0"})
    result = run_dtrain(["kill", "--job", job, "--grace", "2", "--json"], tmp_path, env=env)
    assert result.returncode == 0, result.stderr
    pids = [p["pid"] for p in host_entry(json.loads(result.stdout))["processes"]]
    assert pids == [sibling.pid]


def test_kill_stops_a_running_launch_which_says_its_tasks_were_killed_from_outside(
    workdir: Path, tmp_path: Path
) -> None:
    launch = start_dtrain(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "1",
            "--grace",
            "1",
            "--",
            PYTHON,
            program("by_task.py"),
            "*=tree",
        ],
        workdir,
    )
    try:
        job = wait_for_latest(workdir, timeout_s=20).name
        pids = wait_for_job(job, 4 * 3)  # 4 tasks, each with 2 descendants
        killer = run_dtrain(["kill", "--job", job, "--grace", "2"], tmp_path)
        _, stderr = launch.communicate(timeout=30)
    finally:
        if launch.poll() is None:
            launch.send_signal(signal.SIGINT)
            launch.communicate(timeout=30)
    assert killer.returncode == 0, killer.stderr
    assert wait_gone(pids, 2) == []
    assert job_pids(job) == []
    assert launch.returncode == 128 + signal.SIGTERM, stderr
    assert re.search(r"killed (by SIG\w+ )?from outside dtrain", stderr), stderr
    assert "`dtrain kill`" in stderr


# ---- what the results add up to (pure) ---------------------------------------------------------


def process(pid: int, job: str | None = "J", task: str | None = "worker.0") -> JobProcess:
    return JobProcess(
        pid=pid,
        ppid=1,
        pgid=pid,
        uid=0,
        state="S",
        started_at=0.0,
        age_s=65.0,
        cpu_s=3.0,
        rss_bytes=12 << 20,
        argv=("python", "train.py"),
        comm="python",
        job_id=job,
        task=task,
        role="worker" if task else "server",
    )


UNREACHABLE = Problem("h2 (198.18.0.12:22): connection timed out after 1s", host="h2")


def test_kill_outcome_exit_codes() -> None:
    clean = HostKill(HostScan("h1", (process(10),)), 5.0, by_term=frozenset({10}))
    survived = HostKill(
        HostScan("h1", (process(10),)), 5.0, survivors=(Survivor(10, "in state D"),)
    )
    lost = HostKill(HostScan("h2", error=UNREACHABLE), 5.0)
    assert kill_outcome([clean]).exit_code == ExitCode.OK
    outcome = kill_outcome([survived])
    assert outcome.exit_code == ExitCode.JOB_FAILED and outcome.status == "partial"
    assert outcome.problems[0].message == "pid 10 (worker.0 of job J) survived SIGKILL: in state D"
    outcome = kill_outcome([clean, lost])
    assert outcome.exit_code == ExitCode.ENVIRONMENT and outcome.status == "partial"
    assert outcome.headline == "could not reach 1 of 2 hosts; the other host was cleaned"
    assert outcome.problems == (UNREACHABLE,)
    assert kill_outcome([lost]).status == "failed"
    assert scan_outcome([clean.scan, lost.scan]).exit_code == ExitCode.ENVIRONMENT
    assert scan_outcome([clean.scan]).exit_code == ExitCode.OK


def test_kill_text_says_what_went_on_term_on_kill_and_what_survived_and_why() -> None:
    scan = HostScan("h1", (process(10), process(11, task="worker.1"), process(12, None, None)))
    result = HostKill(
        scan,
        5.0,
        by_term=frozenset({10}),
        by_kill=frozenset({11}),
        survivors=(Survivor(12, "in uninterruptible sleep (state D)"),),
    )
    text = kill_text([result, HostKill(HostScan("h2", error=UNREACHABLE), 5.0)])
    assert text.splitlines() == [
        "h1: stopped 2 of 3 processes: 1 on SIGTERM, 1 on SIGKILL after the 5s grace, 1 survived",
        "  job J",
        "    PID  TASK      RESULT   COMMAND",
        "    10   worker.0  SIGTERM  python train.py",
        "    11   worker.1  SIGKILL  python train.py",
        "  no dtrain job id (DMLC_ROLE set: started by hand, launch.py or BytePS)",
        "    PID  TASK    RESULT    COMMAND",
        "    12   server  SURVIVED  python train.py",
        "      why: in uninterruptible sleep (state D)",
        "h2: not reached (see the error below)",
        "stopped 2 processes on 1 of 2 hosts; 1 left running on those",
    ]


def test_kill_text_does_not_count_what_was_gone_before_it_was_signalled() -> None:
    scan = HostScan("h1", (process(10), process(11, task="worker.1")))
    result = HostKill(scan, 5.0, by_term=frozenset({10}), already_gone=frozenset({11}))
    assert kill_text([result]).splitlines() == [
        "h1: stopped 1 of 2 processes: 1 on SIGTERM, 1 had already exited (not signalled)",
        "  job J",
        "    PID  TASK      RESULT        COMMAND",
        "    10   worker.0  SIGTERM       python train.py",
        "    11   worker.1  already gone  python train.py",
        "stopped 1 process on 1 host; nothing is left",
    ]


def test_a_process_that_exits_between_the_scan_and_the_signal_is_reported_already_gone() -> None:
    # A live launch stops its other tasks as soon as `dtrain kill` stops the first: a process
    # the kill found may be gone before the kill signals it, and the kill did not stop it.
    sleepers = [
        subprocess.Popen([PYTHON, "-c", "import time; time.sleep(60)"], start_new_session=True)
        for _ in range(2)
    ]
    try:
        table = procs.snapshot()  # what the kill's scan saw: both running
        stopped_by_launcher = sleepers[1]
        stopped_by_launcher.kill()
        stopped_by_launcher.wait(timeout=10)
        pids = [p.pid for p in sleepers]
        by_term, by_kill, survivors, gone = procs.terminate(table, pids, 5.0)
    finally:
        for sleeper in sleepers:
            sleeper.kill()
            sleeper.wait(timeout=10)
    assert (by_term, by_kill, survivors, gone) == ([sleepers[0].pid], [], [], [sleepers[1].pid])


def test_ps_text_for_empty_and_unreachable_hosts() -> None:
    text = ps_text([HostScan("h1", is_local=True), HostScan("h2", error=UNREACHABLE)])
    assert text == "h1 (this machine): no job processes\nh2: not scanned (see the error below)\n"


@pytest.mark.parametrize(
    ("left", "tail"),
    [(0, "no process left"), (2, "2 processes left: dtrain kill --job J")],
)
def test_ps_text_lists_jobs_whose_launcher_died_and_what_they_left(left: int, tail: str) -> None:
    dead = DeadLauncherJob("J", "dtrain-logs/J", Launcher(pid=4242, host="node0"))
    scan = HostScan("h1", tuple(process(10 + i, job="J") for i in range(left)), is_local=True)
    text = ps_text([scan], [dead])
    assert text.splitlines()[-2:] == [
        "1 job whose launcher died (job.json says launcher_died):",
        f"  job J: launcher died (pid 4242 on node0); {tail}; logs in dtrain-logs/J/",
    ]


@pytest.mark.parametrize(
    ("seconds", "age", "cpu"),
    [
        (0, "0s", "0:00"),
        (59.9, "59s", "0:59"),
        (65, "1m05s", "1:05"),
        (3 * 3600 + 300, "3h05m", "3:05:00"),
        (2 * 86400 + 4 * 3600, "2d04h", "52:00:00"),
    ],
)
def test_durations(seconds: float, age: str, cpu: str) -> None:
    assert duration_text(seconds) == age
    assert cpu_text(seconds) == cpu


@pytest.mark.parametrize(
    ("size", "text"), [(512 << 10, "512K"), (12 << 20, "12M"), (3 << 29, "1.5G")]
)
def test_sizes(size: int, text: str) -> None:
    assert size_text(size) == text


STUCK = program("where_stuck.py")


def test_ps_shows_a_spinning_task_running_and_how_long_each_task_has_been_silent(
    tmp_path: Path,
) -> None:
    launch = start_dtrain(
        ["launch", "--framework", "torch", "-n", "2", "--", PYTHON, STUCK, "worker.1"],
        tmp_path,
    )
    try:
        deadline = time.monotonic() + 30
        logs = tmp_path / "dtrain-logs" / "latest"
        while time.monotonic() < deadline and not all(
            (logs / f"worker.{i}.log").exists()
            and "ready" in (logs / f"worker.{i}.log").read_text()
            for i in range(2)
        ):
            time.sleep(0.1)
        job = logs.resolve().name
        listed = run_dtrain(["ps", "--job", job, "--json"], tmp_path)
        processes = host_entry(json.loads(listed.stdout))["processes"]
        by_task = {p["task"]: p for p in processes}
        assert by_task["worker.1"]["cpu_percent"] > by_task["worker.0"]["cpu_percent"]
        assert by_task["worker.0"]["state"] == "S"
        assert all(p["last_output_age_s"] is not None for p in processes)
        text = run_dtrain(["ps", "--job", job], tmp_path).stdout
        assert re.search(r"worker\.0\s+sleeping\s+\S+\s+\S+\s+0\s+\S+\s+\d+s ago", text), text
    finally:
        launch.send_signal(signal.SIGINT)
        launch.communicate(timeout=30)
