"""`dtrain doctor` and launch's preflight on the real sshd cluster, one fault per host at a time.

Each case names the host (and pair, package, pid) at fault, leaves the other hosts' verdicts
alone, and ends in bounded time.
"""

from __future__ import annotations

import json
import os
import re
import secrets
import shutil
import subprocess
import time
from collections.abc import Callable, Iterator
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from dtrain.doctor.judge import CHECKS
from tests.cluster.netcluster import Cluster
from tests.conftest import PYTHON, program, run_dtrain

BY_TASK = program("by_task.py")
COMPARED_ENV = ("OMP_NUM_THREADS", "LD_LIBRARY_PATH", "CUDA_VISIBLE_DEVICES")
Results = dict[tuple[str, str], dict[str, Any]]


def dtrain_env(cluster: Cluster) -> dict[str, str]:
    """This shell as a healthy host's login shell: same PATH, none of the compared variables."""
    login_path = cluster.ssh_run(cluster.hosts[-1], "echo $PATH", check=True).stdout.strip()
    env = {
        k: v
        for k, v in os.environ.items()
        if not k.startswith(("DMLC_", "PS_")) and k not in COMPARED_ENV
    }
    env["PATH"] = login_path
    return env


def doctor_run(
    cluster: Cluster,
    args: list[str],
    cwd: Path,
    hosts: Path | None = None,
    timeout_s: float = 90,
) -> tuple[subprocess.CompletedProcess[str], float]:
    """run_dtrain against the cluster under dtrain_env; the result and its wall time (which
    includes reading the login PATH for dtrain_env)."""
    command, *rest = args
    dtrain_args = [
        command,
        "-H",
        str(hosts or cluster.hosts_file()),
        "--ssh-config",
        str(cluster.ssh_config),
        *rest,
    ]
    started = time.monotonic()
    result = run_dtrain(dtrain_args, cwd, timeout_s=timeout_s, env=dtrain_env(cluster))
    return result, time.monotonic() - started


def doctor(
    cluster: Cluster, args: list[str], cwd: Path, hosts: Path | None = None
) -> tuple[int, Results, float]:
    """`dtrain doctor --json ARGS`: exit code, results by (check, host), wall time."""
    result, elapsed = doctor_run(cluster, ["doctor", "--json", *args], cwd, hosts)
    document = json.loads(result.stdout)  # exactly one document, whatever happened
    assert document["command"] == "doctor", result.stderr
    results = {(r["check"], r["host"]): r for r in document["data"]["results"]}
    return result.returncode, results, elapsed


def this_machine(results: Results) -> str:
    """The launching machine's row: the one host doctor reaches without ssh."""
    (name,) = {h for (check, h), r in results.items() if check == "ssh" and r["status"] == "skip"}
    return name


def statuses(results: Results, host: str) -> dict[str, str]:
    return {check: results[(check, host)]["status"] for check in CHECKS}


@pytest.fixture
def script_dir(tmp_path: Path) -> Path:
    (tmp_path / "train.py").write_text("print('training')\n")
    return tmp_path


def test_healthy_hosts_pass_every_check(cluster: Cluster, script_dir: Path) -> None:
    code, results, _ = doctor(cluster, ["--", PYTHON, "train.py"], script_dir)
    assert code == 0, results
    for host in cluster.hosts:
        assert set(statuses(results, host.name).values()) == {"pass"}, statuses(results, host.name)
    assert "train.py in " in results[("workdir", "h2")]["detail"]
    text, _ = doctor_run(cluster, ["doctor", "--", PYTHON, "train.py"], script_dir)
    assert text.returncode == 0, text.stderr
    assert text.stdout.splitlines()[0].split() == ["HOST", *CHECKS]
    assert re.search(r"^h3 +PASS +PASS", text.stdout, re.MULTILINE)
    assert "FAIL" not in text.stdout


def test_the_scheduler_is_checked_on_the_host_scheduler_host_names(
    cluster: Cluster, script_dir: Path
) -> None:
    """As launch --scheduler-host runs it: h2 listens, the others reach it there, and this
    machine, which runs nothing of the job, is not checked; a name not in -H is one line."""
    code, results, _ = doctor(
        cluster, ["--scheduler-host", "h2", "--", PYTHON, "train.py"], script_dir
    )
    assert code == 0, results
    assert {host for _, host in results} == {"h1", "h2", "h3"}
    h2 = cluster.host("h2").address
    assert re.fullmatch(
        rf"the scheduler can listen on {re.escape(h2)}:\d+ here",
        results[("scheduler", "h2")]["detail"],
    )
    for name in ("h1", "h3"):
        detail = results[("scheduler", name)]["detail"]
        assert detail.startswith(f"reaches the scheduler at {h2}:"), detail
    wrong, _ = doctor_run(cluster, ["doctor", "--scheduler-host", "h9", "--", "true"], script_dir)
    assert wrong.returncode == 2
    assert wrong.stderr.splitlines()[0] == 'dtrain: --scheduler-host "h9" is not in the hosts file'


@pytest.mark.parametrize(
    ("action", "evidence"),
    [
        ("drop", r"h1 → h2:\d+: timed out after 2\.0s \(dropped"),
        ("reject", r"h1 → h2:\d+: refused in (\d+) ms \(rejected"),
    ],
)
def test_firewalled_host_fails_naming_each_blocked_pair(
    cluster: Cluster, script_dir: Path, action: str, evidence: str
) -> None:
    cluster.firewall("h2", (1024, 65535), action)  # type: ignore[arg-type]
    code, results, elapsed = doctor(cluster, ["--", PYTHON, "train.py"], script_dir)
    assert code == 3
    blocked = results[("firewall", "h2")]
    assert blocked["status"] == "fail"
    found = re.search(evidence, blocked["detail"])
    assert found, blocked["detail"]
    if action == "reject":
        assert int(found.group(1)) < 500  # refused at once, not after the probe timeout
    assert re.search(r"h3 → h2:\d+", blocked["detail"])
    assert "nft: table inet dtcl_firewall" in blocked["hint"]
    assert results[("firewall", "h1")]["status"] == "pass"
    assert results[("firewall", "h3")]["status"] == "pass"
    assert elapsed < 20


def test_other_python_on_one_host_fails_naming_both_versions(
    cluster: Cluster, script_dir: Path
) -> None:
    cluster.blank_bashrc("h2")  # its login shell now finds the system python3
    version = "python3 -c 'import sys; print(sys.version.split()[0])'"
    usual = cluster.ssh_run("h1", version, check=True).stdout.strip()
    other = cluster.ssh_run("h2", version, check=True).stdout.strip()
    if usual == other:
        pytest.skip(f"python3 is {usual} with and without ~/.bashrc on this machine")
    code, results, _ = doctor(cluster, ["--", "python3", "train.py"], script_dir)
    assert code == 3
    odd = results[("python", "h2")]
    assert odd["status"] == "fail"
    assert f"{other} on h2; 3 of 4 hosts run" in odd["detail"]
    assert usual in odd["detail"]
    assert results[("python", "h1")]["status"] == "pass"


def test_package_missing_on_one_host_fails_naming_it_with_its_version(
    cluster: Cluster, script_dir: Path
) -> None:
    dist = metadata.distribution("idna")
    site = Path(str(dist.locate_file("")))
    cluster.hide_path("h3", site / "idna", next(site.glob("idna-*.dist-info")))
    code, results, _ = doctor(cluster, ["--", PYTHON, "train.py"], script_dir)
    assert code == 3
    odd = results[("packages", "h3")]
    assert odd["status"] == "fail"
    assert f"idna missing (others: {dist.version})" in odd["detail"]
    assert f"-m pip install idna=={dist.version}" in odd["hint"]
    assert results[("packages", "h2")]["status"] == "pass"


@pytest.fixture
def local_srv_dir() -> Iterator[Callable[[], Path]]:
    """A directory under /srv on this machine; each cluster host has its own /srv."""
    made: list[Path] = []

    def make() -> Path:
        path = Path("/srv") / f"dtrain-doctor-{secrets.token_hex(4)}"
        path.mkdir()
        made.append(path)
        return path

    yield make
    for path in made:
        shutil.rmtree(path, ignore_errors=True)


def test_script_that_differs_or_is_missing_on_a_host_fails_naming_it(
    cluster: Cluster, local_srv_dir: Callable[[], Path]
) -> None:
    here = local_srv_dir()
    (here / "train.py").write_text("print('v2')\n")
    for name, content in (("h1", "print('v2')\n"), ("h2", "print('v1')\n"), ("h3", None)):
        remote = cluster.private_dir(name) / here.name
        remote.mkdir(parents=True)
        if content is not None:
            (remote / "train.py").write_text(content)
    code, results, _ = doctor(cluster, ["--", PYTHON, "train.py"], here)
    assert code == 3
    assert results[("workdir", "h1")]["status"] == "pass"
    assert results[("workdir", "h2")]["status"] == "fail"
    assert f"train.py in {here} differs from the copy here" in results[("workdir", "h2")]["detail"]
    assert results[("workdir", "h3")]["status"] == "fail"
    assert "No such file" in results[("workdir", "h3")]["detail"]


def test_stale_copies_in_the_sync_dir_only_warn_since_launch_replaces_them(
    cluster: Cluster, script_dir: Path
) -> None:
    (cluster.private_dir("h2") / "job").mkdir()
    (cluster.private_dir("h2") / "job" / "train.py").write_text("old\n")
    code, results, _ = doctor(
        cluster, ["--sync-dst-dir", "/srv/job", "--", PYTHON, "train.py"], script_dir
    )
    assert code == 0
    assert results[("workdir", "h2")]["status"] == "warn"
    assert "--sync-dst-dir /srv/job" in results[("workdir", "h2")]["hint"]
    assert "not there yet" in results[("workdir", "h1")]["detail"]


def test_a_sync_dir_launch_could_not_make_fails_doctor_as_it_fails_launch(
    cluster: Cluster, script_dir: Path
) -> None:
    (cluster.private_dir("h2") / "job").write_text("a file where the directory should be")
    (cluster.private_dir("h3") / "ro").mkdir()
    cluster.run("h3", ["mount", "--bind", "-o", "ro", "/srv/ro", "/srv/ro"], check=True)
    args = ["--sync-dst-dir", "/srv/job", "--", PYTHON, "train.py"]
    code, results, _ = doctor(cluster, args, script_dir)
    assert code == 3
    h2 = results[("workdir", "h2")]
    assert h2["status"] == "fail"
    assert h2["detail"] == "--sync-dst-dir /srv/job cannot be made there: Not a directory: /srv/job"
    assert "not there yet" in results[("workdir", "h1")]["detail"]  # launch makes it there
    launch = ["launch", "-n", "3", "-s", "0", "--no-preflight", *args]
    refused, _ = doctor_run(cluster, launch, script_dir)
    assert refused.returncode == 3
    assert "h2: sync to /srv/job failed: cannot prepare /srv/job: Not a directory" in (
        refused.stderr
    )

    deeper = ["--sync-dst-dir", "/srv/ro/job", "--", PYTHON, "train.py"]
    code, results, _ = doctor(cluster, deeper, script_dir)
    assert code == 3
    assert results[("workdir", "h3")]["detail"] == (
        "--sync-dst-dir /srv/ro/job cannot be made there: Read-only file system: /srv/ro"
    )
    assert results[("workdir", "h1")]["status"] == "warn"


def test_leftover_dmlc_process_fails_doctor_and_launch_preflight_with_its_pid(
    cluster: Cluster, script_dir: Path
) -> None:
    leftover = cluster.spawn("h2", ["sleep", "60"], env={"DMLC_ROLE": "worker"})
    code, results, _ = doctor(cluster, ["--", PYTHON, "train.py"], script_dir)
    assert code == 3
    stale = results[("stale", "h2")]
    assert stale["status"] == "fail"
    assert f"pid {leftover.host_pid} (DMLC_ROLE=worker, age " in stale["detail"]
    assert re.search(r"stop them: dtrain kill -H \S+ --ssh-config \S+$", stale["hint"])
    assert results[("stale", "h1")]["status"] == "pass"
    assert results[("stale", this_machine(results))]["status"] != "fail"  # it shows up here too

    launch = ["launch", "-n", "3", "-s", "0", "--", PYTHON, BY_TASK, "*=exit:0"]
    refused, _ = doctor_run(cluster, launch, script_dir)
    assert refused.returncode == 3, refused.stderr
    assert "preflight failed on 1 host(s); nothing was started" in refused.stderr
    left = "h2: 1 job process left behind by an earlier job (its launcher is gone)"
    assert f"{left}: pid {leftover.host_pid}" in refused.stderr
    assert "--no-preflight" in refused.stderr
    assert not (script_dir / "dtrain-logs").exists()
    forced, _ = doctor_run(cluster, [launch[0], "--no-preflight", *launch[1:]], script_dir)
    assert forced.returncode == 0, forced.stderr
    assert leftover.is_alive()


def test_preflight_refuses_a_launch_whose_scheduler_port_is_blocked(
    cluster: Cluster, script_dir: Path
) -> None:
    cluster.firewall("h1", (9000, 9100), "reject")
    args = ["-n", "2", "-s", "0", "--scheduler-host", "h1", "--port", "9050"]
    result, elapsed = doctor_run(cluster, ["launch", *args, "--", PYTHON, BY_TASK], script_dir)
    assert result.returncode == 3, result.stderr
    assert re.search(
        r"h2: cannot reach the scheduler: h2 → h1:9050: refused in \d+ ms", result.stderr
    )
    assert "open TCP port 9050 in the firewall of h1" in result.stderr
    assert not (script_dir / "dtrain-logs").exists()
    assert elapsed < 15


def test_unreachable_hosts_fail_by_name_and_the_other_hosts_are_still_checked(
    make_cluster: Callable[[int], Cluster], script_dir: Path
) -> None:
    cluster = make_cluster(8)
    cluster.revoke_key("h1")
    cluster.forget_host_key("h2")
    cluster.partition("h3", all_traffic=True)
    code, results, elapsed = doctor(
        cluster, ["--connect-timeout", "1", "--", PYTHON, "train.py"], script_dir
    )
    assert code == 3
    assert "refused our keys" in results[("ssh", "h1")]["detail"]
    assert "unknown host key" in results[("ssh", "h2")]["detail"]
    assert "timed out after 1s" in results[("ssh", "h3")]["detail"]
    for name in ("h1", "h2", "h3"):
        assert results[("ssh", name)]["status"] == "fail"
        assert results[("python", name)]["status"] == "skip"
    for name in ("h4", "h5", "h6", "h7", "h8"):
        assert set(statuses(results, name).values()) == {"pass"}, statuses(results, name)
    assert elapsed < 1 + 2 * 2 + 10  # connect timeout, a retry, then one probe round
