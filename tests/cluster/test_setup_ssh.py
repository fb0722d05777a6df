"""`--setup` on the real sshd cluster belongs to the job: a hang is stopped after its own time
and named, Ctrl-C or a killed dtrain stops it, what it starts in the background carries the
job's tag (`dtrain ps` lists it) and ends with the job, and its output is shown as it comes.

"Nothing left" here means no process at all on any host but sshd: the old setup's shell and
its children carried no tag, so a tag lookup alone would not have seen them.
"""

from __future__ import annotations

import contextlib
import json
import signal
import time
from pathlib import Path

import pytest

from tests.cluster.netcluster import Cluster, ClusterError
from tests.cluster.test_launch_ssh import run, start, wait_running
from tests.conftest import PYTHON, program

BY_TASK = program("by_task.py")
LAUNCH = ["launch", "-n", "3", "-s", "0"]


def host_processes(cluster: Cluster) -> dict[str, list[int]]:
    """Every process on every host but its sshd, by host name."""
    found = {}
    for host in cluster.hosts:
        with contextlib.suppress(ClusterError):
            found[host.name] = cluster.host_pids(host)
    return found


def assert_hosts_empty(cluster: Cluster, within_s: float = 10) -> None:
    deadline = time.monotonic() + within_s
    left = host_processes(cluster)
    while any(left.values()) and time.monotonic() < deadline:
        time.sleep(0.1)
        left = host_processes(cluster)
    described = {
        name: [Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ") for pid in pids]
        for name, pids in left.items()
        if pids
    }
    assert not any(left.values()), described


def wait_setup_running(cluster: Cluster, per_host: int, timeout_s: float = 30) -> None:
    """Wait until each host runs at least `per_host` processes (its agent and setup)."""
    deadline = time.monotonic() + timeout_s
    while not all(len(p) >= per_host for p in host_processes(cluster).values()):
        assert time.monotonic() < deadline, host_processes(cluster)
        time.sleep(0.05)


def test_a_hanging_setup_is_stopped_after_its_own_time_and_nothing_of_it_stays(
    cluster: Cluster, tmp_path: Path
) -> None:
    hang = 'test "$(uname -n)" != h2 || { sleep 1000 & echo waiting-on-h2 >&2; sleep 1000; }'
    started = time.monotonic()
    result = run(
        cluster, [*LAUNCH, "--setup-timeout", "3", "--setup", hang, "--", "true"], tmp_path
    )
    assert result.returncode == 3, result.stderr
    assert "h2: the setup did not finish within 3s" in result.stderr, result.stderr
    assert "waiting-on-h2" in result.stderr and "--setup-timeout" in result.stderr
    assert "check the load and network" not in result.stderr
    assert time.monotonic() - started < 30  # generous: its own 3 s, not a request's 30
    assert_hosts_empty(cluster)


def test_hosts_whose_setup_ended_wait_for_a_slow_one_without_losing_the_launcher(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The agents' lease (15 s until the hello sets it) runs while h2's setup takes longer."""
    slow = 'test "$(uname -n)" != h2 || sleep 17'
    result = run(cluster, [*LAUNCH, "--setup", slow, "--", "true"], tmp_path, timeout_s=90)
    assert result.returncode == 0, result.stderr
    assert_hosts_empty(cluster)


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGKILL, -9)])
def test_ctrl_c_or_dtrain_killed_during_the_setup_leaves_nothing_on_any_host(
    cluster: Cluster, tmp_path: Path, signum: int, code: int
) -> None:
    launch = start(cluster, [*LAUNCH, "--setup", "sleep 1000 & sleep 1000", "--", "true"], tmp_path)
    try:
        wait_setup_running(cluster, 3)  # the setup's shell and its two sleeps, at least
        launch.send_signal(signum)
        _, stderr = launch.communicate(timeout=30)
    finally:
        launch.kill()
        launch.wait()
    assert launch.returncode == code, stderr
    assert_hosts_empty(cluster)


def test_what_the_setup_starts_in_the_background_is_listed_with_the_job_and_ends_with_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    launch = start(
        cluster,
        [*LAUNCH, "--setup", "sleep 1000 &", "--", PYTHON, BY_TASK, "*=exit:0:4"],
        tmp_path,
    )
    try:
        job = wait_running(tmp_path, 4)
        listed = run(cluster, ["ps", "--json", "--job", job], tmp_path)
        _, stderr = launch.communicate(timeout=60)
    finally:
        launch.kill()
        launch.wait()
    assert launch.returncode == 0, stderr
    scans = json.loads(listed.stdout)["data"]["hosts"]
    for scan in scans:
        assert f"setup@{scan['host']}" in {p["task"] for p in scan["processes"]}, scan
    assert_hosts_empty(cluster)


def test_an_ssh_agent_the_setup_starts_serves_the_tasks_and_ends_with_the_job(
    cluster: Cluster, tmp_path: Path
) -> None:
    ask = "ssh-add -l >/dev/null; echo ssh-add-said-$?"  # 1: no keys; 2: no agent reached
    result = run(
        cluster, [*LAUNCH, "--setup", "eval $(ssh-agent -s)", "--", "sh", "-c", ask], tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.count("ssh-add-said-1") == 4, result.stdout  # the scheduler here too
    assert_hosts_empty(cluster)


def test_a_failing_setup_shows_its_stderr_and_exit_code_without_a_python_hint(
    cluster: Cluster, tmp_path: Path
) -> None:
    check = 'test "$(uname -n)" != h2 || { sleep 1000 & echo no-gpu-here >&2; exit 4; }'
    result = run(cluster, [*LAUNCH, "--setup", check, "--", "true"], tmp_path)
    assert result.returncode == 3, result.stderr
    assert "[setup@h2] no-gpu-here" in result.stderr, result.stderr
    assert f"h2: setup command `{check}` exited the setup shell with code 4" in result.stderr
    assert "its stderr ended: no-gpu-here" in result.stderr
    assert "--remote-python" not in result.stderr
    assert_hosts_empty(cluster)


def test_megabytes_of_setup_output_are_shown_as_they_come(cluster: Cluster, tmp_path: Path) -> None:
    """~2 MB from each host's setup: every line on stderr, prefixed with its host."""
    lines = "i=0; while [ $i -lt 20000 ]; do echo line-$i-" + "x" * 90 + "; i=$((i+1)); done"
    result = run(cluster, [*LAUNCH, "--setup", lines, "--", "true"], tmp_path, timeout_s=120)
    assert result.returncode == 0, result.stderr[-2000:]
    for host in ("h1", "h2", "h3"):
        shown = [line for line in result.stderr.splitlines() if line.startswith(f"[setup@{host}]")]
        assert len(shown) == 20000, (host, len(shown))
    assert_hosts_empty(cluster)


def test_setup_output_is_not_the_tasks_and_json_stays_clean(
    cluster: Cluster, tmp_path: Path
) -> None:
    result = run(
        cluster,
        [*LAUNCH, "--json", "--setup", "echo from-setup", "--", "true"],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["status"] == "ok"
    assert "[setup@h1] from-setup" in result.stderr
