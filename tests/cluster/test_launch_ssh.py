"""`dtrain launch -H hosts` on the real sshd cluster: fan-out, byte-exactness and the fault matrix.

Every case ends in bounded time with the right exit code and no task process left on any host.
"""

from __future__ import annotations

import contextlib
import json
import os
import re
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtrain.remote import procs, proto
from tests.cluster.netcluster import BRIDGE_ADDRESS, Cluster, ClusterError, host_address
from tests.cluster.test_slurmcluster import wait_for
from tests.conftest import (
    PYTHON,
    ROOT,
    job_document,
    job_pids,
    latest_job,
    program,
    run_dtrain,
    start_dtrain,
    wait_gone,
)

BY_TASK = program("by_task.py")


def ssh_args(cluster: Cluster, hosts: Path | None = None) -> list[str]:
    return ["-H", str(hosts or cluster.hosts_file()), "--ssh-config", str(cluster.ssh_config)]


def run(
    cluster: Cluster, args: list[str], cwd: Path, timeout_s: float = 90, hosts: Path | None = None
) -> subprocess.CompletedProcess[str]:
    """run_dtrain with the cluster's hosts file and ssh config after the command name."""
    launch, *rest = args
    return run_dtrain([launch, *ssh_args(cluster, hosts), *rest], cwd, timeout_s=timeout_s)


def start(
    cluster: Cluster,
    args: list[str],
    cwd: Path,
    env: dict[str, str] | None = None,
    hosts: Path | None = None,
) -> subprocess.Popen[str]:
    """start_dtrain with the cluster's hosts file and ssh config after the command name."""
    launch, *rest = args
    return start_dtrain([launch, *ssh_args(cluster, hosts), *rest], cwd, env=env)


def cluster_tasks(cluster: Cluster, job: str | None = None) -> list[int]:
    """Root-namespace pids of tagged processes on any cluster host (by tag, never by name)."""
    on_hosts: set[int] = set()
    for host in cluster.hosts:
        with contextlib.suppress(ClusterError):  # a stopped host has no processes left
            on_hosts.update(cluster.host_pids(host))
    table = procs.snapshot()
    tagged = procs.select_job_processes(table, job=job, include_dmlc=False)
    return [pid for pid in tagged if pid in on_hosts]


def tasks_started(job_dir: Path) -> bool:
    """Whether the launcher has every host's word that its tasks started (job.json says so)."""
    try:
        return "tasks_started_at" in json.loads((job_dir / "job.json").read_text())
    except (OSError, ValueError):
        return False


def wait_running(cwd: Path, count: int, timeout_s: float = 30) -> str:
    """Wait until `count` tasks of the newest job are alive somewhere and the launcher knows
    they all started (a fault injected before that is a failure to start); return the job id."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        link = cwd / "dtrain-logs" / "latest"
        if link.exists():
            job = link.resolve().name
            if len(job_pids(job)) >= count and tasks_started(link.resolve()):
                return job
        time.sleep(0.05)
    raise AssertionError(f"{count} tasks did not start within {timeout_s}s")


def assert_nothing_left(cluster: Cluster, job: str, within_s: float = 5) -> None:
    left = wait_gone(job_pids(job), within_s)
    assert left == [], procs.describe(procs.snapshot(), left)
    assert cluster_tasks(cluster, job) == []


def test_ps_demo_runs_across_hosts_with_the_scheduler_here(
    cluster: Cluster, tmp_path: Path
) -> None:
    result = run(
        cluster,
        ["launch", "-n", "3", "-s", "2", "--", PYTHON, str(ROOT / "examples" / "ps_sum.py")],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert "[scheduler@" in result.stdout and "@h3]" in result.stdout
    plan = job_document(tmp_path)["plan"]
    by_name = {t["name"]: t for t in plan["tasks"]}
    assert by_name["scheduler"]["env"]["DMLC_PS_ROOT_URI"] == BRIDGE_ADDRESS
    assert by_name["worker.1"]["host"]["name"] == "h2"
    assert by_name["worker.1"]["env"]["DMLC_NODE_HOST"] == host_address(2)  # an IP, not "h2"


def test_mxnet_dist_sync_trains_over_three_hosts(cluster: Cluster, tmp_path: Path) -> None:
    result = run(
        cluster,
        [
            "launch",
            "-n",
            "4",
            "-s",
            "2",
            "--",
            PYTHON,
            str(ROOT / "examples" / "mxnet_dist_sync.py"),
            "--epochs",
            "2",
        ],
        tmp_path,
        timeout_s=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    checksums = re.findall(r"worker rank \d+ checksum (\S+)", result.stdout)
    assert len(checksums) == 4 and len(set(checksums)) == 1, result.stdout[-2000:]
    assert_nothing_left(cluster, latest_job(tmp_path).name)


def test_more_tasks_on_one_host_than_sshd_max_sessions(cluster: Cluster, tmp_path: Path) -> None:
    hosts = cluster.hosts_file(names=["h1"])
    result = run(
        cluster,
        ["launch", "-n", "14", "-s", "0", "--", PYTHON, BY_TASK, "*=exit:0"],
        tmp_path,
        hosts=hosts,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("@h1] ready worker.") == 14


def test_48_hosts_start_fail_fast_and_leave_nothing(
    make_cluster: Callable[[int], Cluster], tmp_path: Path
) -> None:
    cluster = make_cluster(48)
    hosts = cluster.hosts_file(slots=2)
    result = run(
        cluster,
        ["launch", "-n", "96", "-s", "0", "--", PYTHON, BY_TASK, "worker.95=exit:7:2", "*=sleep"],
        tmp_path,
        hosts=hosts,
        timeout_s=180,
    )
    assert result.returncode == 7, result.stderr
    assert "worker.95 exits with 7" in result.stdout + result.stderr
    on_hosts = {line.split("@", 1)[1].split("]", 1)[0] for line in result.stdout.splitlines()
                if "] ready worker." in line}  # fmt: skip
    assert len(on_hosts) == 48
    assert_nothing_left(cluster, latest_job(tmp_path).name)


SECRET = "s3cr3t value; $(id) 'q' \"dq\"\nline2 ✓"


def test_env_never_appears_in_any_process_argv(cluster: Cluster, tmp_path: Path) -> None:
    # A secret passed the safe way: exported here, named (not valued) on the command line.
    proc = start(
        cluster,
        ["launch", "-n", "3", "-s", "0", "--env", "SECRET_TOKEN", "--", PYTHON, BY_TASK, "*=sleep"],
        tmp_path,
        env=dict(os.environ, SECRET_TOKEN=SECRET),
    )
    try:
        job = wait_running(tmp_path, 4)  # the scheduler and three workers
        table = procs.snapshot()
        for pid in table:
            cmdline = " ".join(procs.read_cmdline(pid))
            assert "s3cr3t" not in cmdline, cmdline
        for pid in cluster_tasks(cluster, job):
            assert (procs.read_environ(pid) or {}).get("SECRET_TOKEN") == SECRET
    finally:
        proc.send_signal(signal.SIGINT)
        proc.communicate(timeout=30)
    assert proc.returncode == 130


arg_text = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=40
)


@settings(
    max_examples=12,
    deadline=None,
    suppress_health_check=[HealthCheck.function_scoped_fixture, HealthCheck.too_slow],
)
@given(value=arg_text, args=st.lists(arg_text, max_size=3))
def test_arguments_and_env_values_arrive_byte_exact_on_remote_hosts(
    cluster: Cluster, tmp_path: Path, value: str, args: list[str]
) -> None:
    hosts = cluster.hosts_file(names=["h2"])
    result = run(
        cluster,
        [
            "launch",
            "-n",
            "1",
            "-s",
            "0",
            "--json",
            "--env",
            f"PROBE={value}",
            "--",
            PYTHON,
            program("print_env.py"),
            "PROBE",
            *args,
        ],
        tmp_path,
        hosts=hosts,
    )
    assert result.returncode == 0, result.stderr
    document = json.loads(result.stdout)
    log = Path(document["data"]["result"]["tasks"][0]["log"])
    printed = json.loads((tmp_path / log).read_text())
    assert printed["env"] == {"PROBE": value}
    assert printed["argv"] == ["PROBE", *args]


def test_no_variable_dtrain_manages_leaks_from_a_hosts_environment(
    cluster: Cluster, tmp_path: Path
) -> None:
    managed = sorted({name for names in proto.MANAGED_VARS.values() for name in names})
    exports = " ".join(f"{name}=stale" for name in managed)
    hosts = cluster.hosts_file(names=["h2", "h3"])
    args = ["launch", "-n", "2", "-s", "1", "--setup", f"export {exports}", "--"]
    command = [PYTHON, program("print_env.py"), ",".join(managed)]
    result = run(cluster, [*args, *command], tmp_path, hosts=hosts)
    assert result.returncode == 0, result.stderr
    logs = latest_job(tmp_path)
    for task in job_document(tmp_path)["plan"]["tasks"]:
        seen = json.loads((logs / f"{task['name']}.log").read_text().splitlines()[0])["env"]
        assert seen == {k: v for k, v in task["env"].items() if k in managed}, task["name"]


# ---- the fault matrix -------------------------------------------------------------------------


def test_worker_killed_on_a_remote_host_fails_the_job_everywhere(
    cluster: Cluster, tmp_path: Path
) -> None:
    proc = start(
        cluster,
        ["launch", "-n", "3", "-s", "2", "--grace", "2", "--", PYTHON, BY_TASK, "*=tree"],
        tmp_path,
    )
    job = wait_running(tmp_path, 6 * 3)
    victim = next(
        pid
        for pid in cluster_tasks(cluster, job)
        if procs.read_environ(pid).get("DTRAIN_TASK") == "worker.1"
        and procs.read_stat(pid)[2] == pid  # the task leader
    )
    killed_at = time.monotonic()
    subprocess.run(["kill", "-9", str(victim)], check=True)
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 137, stderr
    assert time.monotonic() - killed_at < 2 + 3
    assert "failed: worker.1@h2 was killed by SIGKILL from outside dtrain" in stderr
    assert "5 other tasks were stopped by dtrain" in stderr
    assert_nothing_left(cluster, job)


# A daemon that leaves its task's process group and drops the job's tag on its way out.
DAEMON_SLEEP = ["sleep", "1613"]
DAEMON = 'setsid env -i sleep 1613 & sleep 0.5; [ "$DTRAIN_TASK" != worker.0 ] || exit {code}'


def daemons_on(cluster: Cluster) -> list[int]:
    """Root-namespace pids of DAEMON's sleeps on any cluster host."""
    return [
        pid
        for host in cluster.hosts
        for pid in cluster.host_pids(host)
        if procs.read_cmdline(pid) == DAEMON_SLEEP
    ]


def test_daemons_that_left_their_group_and_tag_stop_with_the_job_on_every_host(
    cluster: Cluster, tmp_path: Path
) -> None:
    hosts = cluster.hosts_file(names=["h1", "h2"])
    for code in (3, 0):  # the job fails; the job ends
        command = DAEMON.format(code=code)
        args = ["launch", "--framework", "torch", "-n", "2", "--grace", "1", "--"]
        result = run(cluster, [*args, "bash", "-c", command], tmp_path, hosts=hosts)
        deadline = time.monotonic() + 10
        while daemons_on(cluster) and time.monotonic() < deadline:
            time.sleep(0.1)
        left = daemons_on(cluster)
        for pid in left:
            os.kill(pid, signal.SIGKILL)  # the test's own leftovers: by pid
        assert result.returncode == code, result.stderr
        assert left == [], f"daemons outlived the job (exit {code})"


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGKILL, -9)])
def test_ctrl_c_or_sigkill_of_dtrain_leaves_nothing_on_any_host(
    cluster: Cluster, tmp_path: Path, signum: int, code: int
) -> None:
    proc = start(
        cluster,
        [
            "launch",
            "-n",
            "3",
            "-s",
            "2",
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
    job = wait_running(tmp_path, 6)
    proc.send_signal(signum)
    proc.communicate(timeout=30)
    assert proc.returncode == code
    assert_nothing_left(cluster, job, within_s=1 + 5)


def test_partitioned_host_is_lost_and_its_tasks_stop_themselves(
    cluster: Cluster, tmp_path: Path
) -> None:
    proc = start(
        cluster,
        [
            "launch",
            "-n",
            "3",
            "-s",
            "0",
            "--grace",
            "1",
            "--heartbeat-timeout",
            "3",
            "--",
            PYTHON,
            BY_TASK,
            "*=sleep",
        ],
        tmp_path,
    )
    job = wait_running(tmp_path, 4)  # the scheduler and three workers
    cluster.partition("h3")
    cut = time.monotonic()
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 255, stderr
    assert time.monotonic() - cut < 3 + 5
    assert "worker.2@h3 was lost: no heartbeat from h3" in stderr
    # No FIN reaches h3: its agent notices the silence itself (lease = heartbeat timeout).
    assert_nothing_left(cluster, job, within_s=3 + 1 + 3)


def test_host_whose_sshd_dies_mid_run_is_named(cluster: Cluster, tmp_path: Path) -> None:
    proc = start(
        cluster,
        ["launch", "-n", "3", "-s", "0", "--", PYTHON, BY_TASK, "*=sleep"],
        tmp_path,
    )
    job = wait_running(tmp_path, 4)  # the scheduler and three workers
    cluster.stop_host("h2")
    _, stderr = proc.communicate(timeout=30)
    assert proc.returncode == 255, stderr
    assert "worker.1@h2 was lost: the connection to h2 closed" in stderr
    assert_nothing_left(cluster, job)


def test_unreachable_host_at_start_starts_nothing_anywhere(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.partition("h2", all_traffic=True)
    started = time.monotonic()
    result = run(
        cluster,
        [
            "launch",
            "-n",
            "3",
            "-s",
            "0",
            "--connect-timeout",
            "1",
            "--",
            PYTHON,
            BY_TASK,
            "*=sleep",
        ],
        tmp_path,
    )
    assert result.returncode == 3, result.stderr
    assert time.monotonic() - started < 10
    assert "cannot reach 1 of 3 hosts; nothing was started" in result.stderr
    assert f"h2 ({host_address(2)}:22): connection timed out after 1s" in result.stderr
    assert not (tmp_path / "dtrain-logs").exists()
    assert cluster_tasks(cluster) == []


def test_refused_connection_is_named(cluster: Cluster, tmp_path: Path) -> None:
    cluster.stop_host("h3")
    result = run(cluster, ["launch", "-n", "3", "-s", "0", "--", PYTHON, BY_TASK], tmp_path)
    assert result.returncode == 3
    assert f"h3 ({host_address(3)}:22): connection refused" in result.stderr


def test_unknown_host_key_fails_with_fingerprint_unless_accepted(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.forget_host_key("h1")
    result = run(cluster, ["launch", "-n", "3", "-s", "0", "--", PYTHON, BY_TASK], tmp_path)
    assert result.returncode == 3, result.stderr
    assert re.search(
        rf"h1 \({re.escape(host_address(1))}:22\): unknown host key ssh-ed25519 SHA256:\S+",
        result.stderr,
    )
    assert "--accept-new-host-keys" in result.stderr
    accepted = run(
        cluster,
        ["launch", "-n", "3", "-s", "0", "--accept-new-host-keys", "--", PYTHON, BY_TASK],
        tmp_path,
    )
    assert accepted.returncode == 0, accepted.stderr
    assert f"{host_address(1)} ssh-ed25519" in cluster.known_hosts.read_text()
    again = run(cluster, ["launch", "-n", "3", "-s", "0", "--", PYTHON, BY_TASK], tmp_path)
    assert again.returncode == 0, again.stderr


def test_changed_host_key_always_fails(cluster: Cluster, tmp_path: Path) -> None:
    cluster.rotate_host_key("h2")
    result = run(
        cluster,
        ["launch", "-n", "3", "-s", "0", "--accept-new-host-keys", "--", PYTHON, BY_TASK],
        tmp_path,
    )
    assert result.returncode == 3
    assert f"h2 ({host_address(2)}:22): HOST KEY CHANGED" in result.stderr
    assert "ssh-keygen -R" in result.stderr


def test_host_without_our_key_fails_at_once_without_prompting(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.revoke_key("h3")
    result = run(cluster, ["launch", "-n", "3", "-s", "0", "--", PYTHON, BY_TASK], tmp_path)
    assert result.returncode == 3
    assert f"h3 ({host_address(3)}:22): the server refused our keys as user root" in result.stderr
    assert "authorized_keys" in result.stderr


def test_password_only_host_fails_at_once(cluster: Cluster, tmp_path: Path) -> None:
    cluster.sshd_override("h1", "PubkeyAuthentication no\nPasswordAuthentication yes")
    started = time.monotonic()
    result = run(cluster, ["launch", "-n", "3", "-s", "0", "--", PYTHON, BY_TASK], tmp_path)
    assert result.returncode == 3
    assert time.monotonic() - started < 10
    assert "accepts only password" in result.stderr


def test_sync_copies_the_workdir_to_every_host_and_tasks_run_there(
    cluster: Cluster, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text(
        "import os, socket; print('cwd', os.getcwd(), open('data.txt').read())\n"
    )
    (tmp_path / "data.txt").write_text("payload-42")
    result = run(
        cluster,
        ["launch", "-n", "3", "-s", "0", "--sync-dst-dir", "/srv/job", "--", PYTHON, "train.py"],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("cwd /srv/job payload-42") == 3
    for host in cluster.hosts:
        assert (cluster.private_dir(host) / "job" / "data.txt").read_text() == "payload-42"
    assert "synced" in result.stderr


def test_sync_failure_on_one_host_aborts_before_anything_starts(
    cluster: Cluster, tmp_path: Path
) -> None:
    (tmp_path / "train.py").write_text("print('never')\n")
    (cluster.private_dir("h2") / "job").write_text("a file where the directory should be")
    result = run(
        cluster,
        ["launch", "-n", "3", "-s", "0", "--sync-dst-dir", "/srv/job", "--", PYTHON, "train.py"],
        tmp_path,
    )
    assert result.returncode == 3, result.stderr
    assert "--sync-dst-dir failed on 1 host(s); nothing was started" in result.stderr
    assert "h2: sync to /srv/job failed" in result.stderr
    assert "never" not in result.stdout


SHARED_ROUNDS = 6  # the old copy lost the race in about one run in two: 6 rounds miss 1 in 64
LINKS = 10


def temporary_files(root: Path) -> list[str]:
    return sorted(str(p) for p in root.rglob("*.dtrain-*.tmp")) if root.exists() else []


def test_sync_into_a_directory_every_host_shares_never_collides(
    cluster: Cluster, tmp_path: Path
) -> None:
    """/tmp is one directory for all hosts here, as an NFS home is on a real cluster: three
    agents make the same symlinks and write the same files there at the same moment."""
    src = tmp_path / "src"
    src.mkdir()
    (src / "train.py").write_text("import os; print('link', os.readlink('alias0.py'))\n")
    for i in range(LINKS):
        (src / f"mod{i}.py").write_text(f"value = {i}\n")
        (src / f"alias{i}.py").symlink_to(f"mod{i}.py")
    for round_ in range(SHARED_ROUNDS):
        dst = tmp_path / f"shared-{round_}"  # new each round: every link is made again
        args = ["launch", "-n", "3", "-s", "0", "--sync-dst-dir", str(dst), "--"]
        result = run(cluster, [*args, PYTHON, "train.py"], src)
        assert result.returncode == 0, f"round {round_}: {result.stderr}"
        assert all(f"@{h.name}] link mod0.py" in result.stdout for h in cluster.hosts)
        assert {os.readlink(dst / f"alias{i}.py") for i in range(LINKS)} == {
            f"mod{i}.py" for i in range(LINKS)
        }
        assert temporary_files(dst) == []


@pytest.mark.parametrize("how", ["sigint", "sigkill"])
def test_dtrain_stopped_mid_sync_leaves_no_temporary_file_on_any_host(
    cluster: Cluster, tmp_path: Path, how: str
) -> None:
    with open(tmp_path / "big.bin", "wb") as big:
        big.truncate(300 << 20)  # sparse here, written out on the hosts: seconds to copy
    popen = start(
        cluster,
        ["launch", "-n", "3", "-s", "0", "--sync-dst-dir", "/srv/job", "--", PYTHON, "-c", "0"],
        tmp_path,
    )
    dsts = [cluster.private_dir(host) / "job" for host in cluster.hosts]
    try:
        wait_for(lambda: any(temporary_files(d) for d in dsts), 60, "a half-copied file")
        popen.send_signal(signal.SIGINT if how == "sigint" else signal.SIGKILL)
        popen.communicate(timeout=30)
        wait_for(lambda: not any(temporary_files(d) for d in dsts), 10, "no temporary file")
        assert popen.returncode == (130 if how == "sigint" else -signal.SIGKILL)
    finally:
        if popen.poll() is None:
            popen.kill()
            popen.communicate()


def test_a_second_job_beside_a_running_one_is_warned_about_not_refused(
    cluster: Cluster, tmp_path: Path
) -> None:
    first_dir, second_dir = tmp_path / "first", tmp_path / "second"
    first_dir.mkdir()
    second_dir.mkdir()
    first = start(
        cluster, ["launch", "-n", "3", "-s", "0", "--", PYTHON, BY_TASK, "*=sleep"], first_dir
    )
    try:
        first_job = wait_running(first_dir, 4)  # the scheduler and three workers
        second = run(
            cluster, ["launch", "-n", "3", "-s", "0", "--", PYTHON, BY_TASK, "*=exit:0"], second_dir
        )
        assert second.returncode == 0, second.stderr
        assert f"another job is running here ({first_job})" in second.stderr
        assert len(job_pids(first_job)) == 4  # untouched
    finally:
        first.send_signal(signal.SIGINT)
        first.communicate(timeout=30)
    assert_nothing_left(cluster, first_job)


def test_each_host_is_connected_once(cluster: Cluster, tmp_path: Path) -> None:
    result = run_dtrain(
        ["--debug", "launch", *ssh_args(cluster), "-n", "3", "-s", "0", "--", "true"], tmp_path
    )
    assert result.returncode == 0, result.stderr
    for host in cluster.hosts:  # one connection served every step: none wasted
        said = [
            line for line in cluster.sshd_log(host).splitlines() if f"{BRIDGE_ADDRESS} " in line
        ]
        assert len(said) == 1, said
        assert "Accepted publickey for root" in said[0]


def test_proxyjump_hosts_are_reached_through_the_jump_host(
    cluster: Cluster, tmp_path: Path
) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host h3\n  ProxyJump h1\n\n" + cluster.ssh_config.read_text())
    hosts = cluster.hosts_file(names=["h2", "h3"])
    result = run_dtrain(
        [
            "--debug",
            "launch",
            "-H",
            str(hosts),
            "--ssh-config",
            str(config),
            "-n",
            "2",
            "-s",
            "0",
            "--",
            PYTHON,
            BY_TASK,
            "*=exit:0",
        ],
        tmp_path,
        timeout_s=90,
    )
    assert result.returncode == 0, result.stderr
    assert f"Accepted publickey for root from {host_address(1)}" in cluster.sshd_log("h3")
    assert cluster.sshd_log("h2").count("Accepted publickey for root") == 1
    plan = job_document(tmp_path)["plan"]
    worker = next(t for t in plan["tasks"] if t["name"] == "worker.1")
    assert worker["env"]["DMLC_NODE_HOST"] == host_address(3)  # the address, not the alias


def test_a_passphrase_protected_key_fails_at_once_with_what_to_do(
    cluster: Cluster, tmp_path: Path
) -> None:
    key = tmp_path / "locked_key"
    subprocess.run(
        ["ssh-keygen", "-q", "-t", "ed25519", "-N", "secret phrase", "-f", str(key)], check=True
    )
    config = tmp_path / "ssh_config"
    text = cluster.ssh_config.read_text().replace(str(cluster.key), str(key))
    config.write_text(text)
    started = time.monotonic()
    result = run_dtrain(
        [
            "launch",
            "-H",
            str(cluster.hosts_file(names=["h1"])),
            "--ssh-config",
            str(config),
            "-n",
            "1",
            "-s",
            "0",
            "--",
            PYTHON,
            BY_TASK,
        ],
        tmp_path,
        timeout_s=60,
    )
    assert result.returncode == 3
    assert time.monotonic() - started < 10
    assert "protected by a passphrase and dtrain never prompts" in result.stderr
    assert "ssh-add" in result.stderr


def test_a_host_without_a_usable_python_for_the_agent_is_named(
    cluster: Cluster, tmp_path: Path
) -> None:
    result = run(
        cluster,
        [
            "launch",
            "-n",
            "3",
            "-s",
            "0",
            "--remote-python",
            "/nonexistent/python3",
            "--",
            PYTHON,
            BY_TASK,
        ],
        tmp_path,
    )
    assert result.returncode == 3, result.stderr
    assert "no python3 >= 3.6 for the agent on h1 (tried /nonexistent/python3)" in result.stderr
    assert "--remote-python PATH" in result.stderr
