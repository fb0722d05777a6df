"""The launcher off Linux against real sshd hosts: launch with the scheduler on a host, doctor,
ps, kill and stacks, with `os.sched_getaffinity`, `select.epoll` and /proc gone from the
launcher's interpreter (tests/programs/off_linux.py), answer as they do on Linux."""

from __future__ import annotations

import json
from pathlib import Path

from tests.cluster.netcluster import Cluster
from tests.cluster.test_doctor import dtrain_env
from tests.cluster.test_launch_ssh import assert_nothing_left, ssh_args
from tests.conftest import run_dtrain
from tests.test_off_linux import REFUSED, run_off_linux

DARWIN = ["--platform", "darwin"]  # what only the interpreter's sys.platform says
NEEDS_LINUX = "dtrain's agent needs Linux (this machine runs darwin)"


def command(args: list[str], cluster: Cluster) -> list[str]:
    """`dtrain NAME -H hosts --ssh-config ... REST`."""
    name, *rest = args
    return [name, *ssh_args(cluster), *rest]


def test_launch_with_the_scheduler_on_a_host_runs_off_linux(
    cluster: Cluster, tmp_path: Path
) -> None:
    args = command(["launch", "-n", "2", "-s", "1", "--scheduler-host", "h1"], cluster)
    result = run_off_linux([*DARWIN, *args, "--", "true"], tmp_path, timeout_s=90)
    assert result.returncode == 0, result.stderr
    assert REFUSED not in result.stderr
    document = json.loads((tmp_path / "dtrain-logs" / "latest" / "job.json").read_text())
    hosts = {task["host"]["name"] for task in document["plan"]["tasks"]}
    assert hosts <= {"h1", "h2", "h3"}, hosts  # nothing on this machine
    assert document["launcher"]["create_time"] > document["launcher"]["boot_time"] > 0
    assert document["result"]["exit_code"] == 0
    assert_nothing_left(cluster, document["plan"]["job_id"])


def test_doctor_ps_kill_stacks_and_their_dry_runs_answer_off_linux_as_on_linux(
    cluster: Cluster, tmp_path: Path
) -> None:
    env = dtrain_env(cluster)
    for args in (
        ["doctor", "--json"],
        ["ps", "--json"],
        ["kill", "--dry-run", "--json"],
        ["kill", "--json"],
        ["stacks", "--json"],
        ["launch", "-n", "4", "-s", "2", "--dry-run", "--json"],
        ["launch", "-n", "4", "-s", "2", "--scheduler-host", "h2", "--dry-run", "--json"],
    ):
        full = command(args, cluster)
        if args[0] == "launch":
            full += ["--", "true"]
        off = run_off_linux([*DARWIN, *full], tmp_path, timeout_s=90, env=env)
        assert REFUSED not in off.stderr, (args, off.stderr)
        on = run_dtrain(full, tmp_path, timeout_s=90, env=env)
        off_document, on_document = json.loads(off.stdout), json.loads(on.stdout)
        if args[0] == "doctor":  # every host's checks; this machine's agent needs Linux, and
            # the scheduler's, which would run here, are skipped
            assert rows(off_document, "h") == rows(on_document, "h"), off.stderr
            assert {r[2] for r in rows(off_document, "h", "scheduler")} == {"skip"}
            here = [r for r in off_document["data"]["results"] if not r["host"].startswith("h")]
            assert here and any(NEEDS_LINUX in str(r) for r in here), here
            continue
        assert off.returncode == on.returncode, (args, off.stderr, on.stderr)
        assert off_document["status"] == on_document["status"], (args, off.stderr)


def test_doctor_with_the_scheduler_on_a_host_passes_off_linux(
    cluster: Cluster, tmp_path: Path
) -> None:
    """What the hint off Linux says: with --scheduler-host this machine runs nothing of the
    job, so doctor checks only the hosts, all of which pass."""
    args = command(["doctor", "--json", "--scheduler-host", "h1"], cluster)
    off = run_off_linux([*DARWIN, *args], tmp_path, timeout_s=90, env=dtrain_env(cluster))
    assert off.returncode == 0, off.stderr
    document = json.loads(off.stdout)
    assert {r[1] for r in rows(document, "")} == {"h1", "h2", "h3"}
    assert NEEDS_LINUX not in off.stdout + off.stderr


def rows(
    document: dict[str, object], prefix: str, check: str | None = None
) -> list[tuple[str, str, str]]:
    """The doctor's checks (all but the scheduler's, or only `check`) of the hosts named
    `prefix...`: what, where, and how it went."""
    data = document["data"]
    assert isinstance(data, dict)
    return sorted(
        (r["check"], r["host"], r["status"])
        for r in data["results"]
        if r["host"].startswith(prefix)
        and (r["check"] == check if check else r["check"] != "scheduler")
    )
