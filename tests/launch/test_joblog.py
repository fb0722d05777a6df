"""The job's log directory: refused before anything starts, private, survives a full disk, and
job.json tells the truth even when dtrain itself was killed."""

from __future__ import annotations

import contextlib
import dataclasses
import json
import os
import shlex
import shutil
import stat
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import psutil
import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtrain.launch import joblog
from dtrain.launch.joblog import RESERVE_FILE, launcher_is_gone, this_launcher
from dtrain.processes.launcher import Launcher
from dtrain.remote import procs
from tests.conftest import (
    PYTHON,
    ROOT,
    dtrain_argv,
    job_pids,
    program,
    run_dtrain,
    start_dtrain,
    wait_for_latest,
    wait_for_line,
    wait_gone,
)

BY_TASK = program("by_task.py")
IS_ROOT = os.geteuid() == 0


@contextlib.contextmanager
def tmpfs(where: Path, options: str) -> Iterator[Path]:
    """A small tmpfs at `where` (root only), unmounted whatever the test did."""
    where.mkdir()
    subprocess.run(
        ["mount", "-t", "tmpfs", "-o", options, "dtrain-test", str(where)], check=True, timeout=10
    )
    try:
        yield where
    finally:
        subprocess.run(["umount", "-l", str(where)], check=False, timeout=10)


@pytest.fixture
def read_only_dir(tmp_path: Path) -> Iterator[Path]:
    if not IS_ROOT:
        pytest.skip("mounting a read-only tmpfs needs root")
    with tmpfs(tmp_path / "ro", "ro,size=1m") as mounted:
        yield mounted


def unusable_log_dirs(tmp_path: Path, read_only: Path | None) -> list[tuple[str, str]]:
    """(--log-dir, the reason dtrain gives) for directories that cannot be made or written."""
    (tmp_path / "a-file").write_text("")
    cases = [
        (str(tmp_path / "a-file" / "logs"), "Not a directory"),
        (str(tmp_path / "a-file"), "it exists and is not a directory"),
        ("/proc/dtrain-logs", "No such file or directory"),
        ("", "the path is empty"),
    ]
    if read_only is not None:
        cases.append((str(read_only / "logs"), "Read-only file system"))
    return cases


@pytest.mark.parametrize("as_json", [False, True])
def test_a_log_dir_that_cannot_be_made_exits_2_before_any_host_is_connected(
    tmp_path: Path, read_only_dir: Path, as_json: bool
) -> None:
    # A host that refuses at once (loopback port 1): reaching it would exit 3, not 2.
    hosts = tmp_path / "hosts"
    hosts.write_text("127.0.0.1:1\n")
    for log_dir, reason in unusable_log_dirs(tmp_path, read_only_dir):
        args = ["launch", "--log-dir", log_dir, "-n", "1", "-H", str(hosts), "--", "true"]
        result = run_dtrain(["launch", "--json", *args[1:]] if as_json else args, tmp_path)
        assert result.returncode == 2, (log_dir, result.stderr, result.stdout)
        shown = log_dir or "''"
        message = f"cannot create log directory {shown} (--log-dir): {reason}"
        if as_json:
            document = json.loads(result.stdout)
            assert document["exit_code"] == 2 and document["data"] is None
            [error] = document["errors"]
            assert error["code"] == "log_dir" and error["message"] == message
            assert "--log-dir" in error["hint"]
        else:
            assert result.stdout == ""
            assert result.stderr.startswith(f"dtrain: {message}\n  hint: "), result.stderr
        assert "Traceback" not in result.stderr
    assert not (tmp_path / "dtrain-logs").exists()


# Root enters any directory, whatever its mode: a user who cannot is played by `nobody`, with
# the system's python (root's own interpreter may live where nobody can read it).
SYSTEM_PYTHON = f"/usr/bin/python{sys.version_info.major}.{sys.version_info.minor}"


@pytest.fixture
def as_nobody() -> Iterator[tuple[list[str], Path]]:
    """(argv prefix running dtrain as nobody, a scratch directory nobody may use)."""
    if not IS_ROOT or shutil.which("setpriv") is None or not os.path.exists(SYSTEM_PYTHON):
        pytest.skip("needs root, setpriv and the system's python of this version")
    scratch = Path(tempfile.mkdtemp(prefix="dtrain-nobody-"))
    scratch.chmod(0o777)
    paths = [str(ROOT), *(p for p in sys.path if p.endswith("site-packages"))]
    argv = [
        *("setpriv", "--reuid=nobody", "--regid=nogroup", "--clear-groups"),
        *("env", f"HOME={scratch}", f"PYTHONPATH={os.pathsep.join(paths)}"),
        *(SYSTEM_PYTHON, "-m", "dtrain"),
    ]
    try:
        yield argv, scratch
    finally:
        shutil.rmtree(scratch, ignore_errors=True)


@pytest.mark.parametrize("as_json", [False, True])
def test_a_log_dir_under_a_directory_the_user_cannot_enter_exits_2(
    as_nobody: tuple[list[str], Path], as_json: bool
) -> None:
    argv, scratch = as_nobody
    (scratch / "locked").mkdir(mode=0o700)  # root's: nobody may not even look inside
    flags = ["--json"] if as_json else []
    args = ["launch", *flags, "-n", "1", "-s", "0", "--log-dir", "locked/logs", "--", "true"]
    result = subprocess.run([*argv, *args], cwd=scratch, capture_output=True, text=True, timeout=60)
    assert result.returncode == 2, result.stderr
    message = "cannot create log directory locked/logs (--log-dir): Permission denied"
    if as_json:
        document = json.loads(result.stdout)
        assert document["exit_code"] == 2 and document["errors"][0]["message"] == message
    else:
        assert result.stderr.startswith(f"dtrain: {message}\n  hint: ")
    assert "Traceback" not in result.stderr


def test_ps_skips_a_job_file_that_is_a_fifo_instead_of_waiting_on_it(tmp_path: Path) -> None:
    (tmp_path / "dtrain-logs" / "20261122-143005-3fa2").mkdir(parents=True)
    os.mkfifo(tmp_path / "dtrain-logs" / "20261122-143005-3fa2" / "job.json")  # no writer
    result = run_dtrain(["ps", "--json"], tmp_path, timeout_s=60)
    assert result.returncode == 0, result.stderr
    assert json.loads(result.stdout)["data"]["launcher_died"] == []


def test_a_job_directory_removed_unstarted_takes_its_latest_link_along(tmp_path: Path) -> None:
    paths = joblog.create(tmp_path / "logs", "20261122-143005-3fa2")
    paths.latest.symlink_to(paths.job_id)  # as `populate` points it, before a task started
    joblog.remove(paths)
    assert not paths.latest.is_symlink()
    assert not (tmp_path / "logs").exists()


def test_a_launch_that_starts_nothing_leaves_no_log_directory_behind(workdir: Path) -> None:
    result = run_dtrain(
        ["launch", "--log-dir", "runs/today", "-n", "1", "--", "no-such-trainer"], workdir
    )
    assert result.returncode == 3, result.stderr
    assert "nothing was started" in result.stderr
    assert list(workdir.iterdir()) == []


def test_job_directory_is_0700_and_every_file_in_it_0600(workdir: Path) -> None:
    old = os.umask(0o022)
    try:
        result = run_dtrain(
            [
                "launch",
                "-n",
                "1",
                "-s",
                "1",
                "--env",
                "WANDB_API_KEY=s3cret",
                "--",
                PYTHON,
                BY_TASK,
            ],
            workdir,
        )
    finally:
        os.umask(old)
    assert result.returncode == 0, result.stderr
    job_dir = wait_for_latest(workdir)
    assert stat.S_IMODE(job_dir.stat().st_mode) == 0o700
    files = [p for p in job_dir.iterdir() if not p.is_symlink()]
    assert {p.name for p in files} >= {"job.json", "worker.0.log", "server.0.log"}
    assert {p.name: stat.S_IMODE(p.stat().st_mode) for p in files} == {p.name: 0o600 for p in files}
    assert "s3cret" in (job_dir / "job.json").read_text()  # private, so it may hold it
    document = json.loads((job_dir / "job.json").read_text())
    assert document["started_at"] <= document["tasks_started_at"]  # every task got going


@pytest.mark.skipif(not IS_ROOT, reason="mounting a small tmpfs needs root")
@pytest.mark.parametrize("as_json", [False, True])
def test_a_full_disk_stops_the_log_not_the_job(tmp_path: Path, as_json: bool) -> None:
    megabytes = 3  # into a 1 MB disk
    lines = int(megabytes * 1024 * 1024 / 100)
    command = f"{shlex.quote(PYTHON)} {shlex.quote(program('write_lots.py'))} {megabytes}; exit 7"
    with tmpfs(tmp_path / "small", "size=1m") as disk:
        result = run_dtrain(
            [
                "--debug",  # says when job.json needed its reserve
                "launch",
                *(["--json"] if as_json else []),
                "--log-dir",
                str(disk),
                "--framework",
                "torch",
                "-n",
                "1",
                "--",
                "sh",
                "-c",
                command,
            ],
            tmp_path,
            timeout_s=120,
        )
        assert result.returncode == 7, result.stderr[-2000:]
        console = result.stderr if as_json else result.stdout
        printed = [line for line in console.splitlines() if line.startswith("[worker.0] ")]
        assert len(printed) == lines
        assert printed[-1].startswith(f"[worker.0] {lines - 1:08d} ")
        job_dir = (disk / "latest").resolve()
        warnings = [line for line in result.stderr.splitlines() if "cannot write" in line]
        assert len(warnings) == 1, warnings
        assert warnings[0].startswith(
            f"dtrain: cannot write worker.0's log {job_dir}/worker.0.log: No space left on device"
        )
        assert "job.json does not fit" in result.stderr  # the disk was full at the end
        assert f"  log: {job_dir}/worker.0.log (incomplete: No space left on device)" in (
            result.stderr
        )
        document = json.loads((job_dir / "job.json").read_text())
        assert document["state"] == "failed"
        assert document["result"]["exit_code"] == 7
        assert document["result"]["root_cause"]["log_error"] == "No space left on device"
        assert not (job_dir / RESERVE_FILE).exists()
        if as_json:
            assert json.loads(result.stdout)["exit_code"] == 7


def test_launcher_killed_shows_in_ps_and_in_job_json_and_the_next_launch(workdir: Path) -> None:
    launch = start_dtrain(
        ["launch", "-n", "1", "-s", "0", "--grace", "1", "--", PYTHON, BY_TASK, "*=sleep"],
        workdir,
    )
    try:
        job_dir = wait_for_latest(workdir)
        wait_for_line(job_dir / "worker.0.log", "ready worker.0")
        pids = job_pids(job_dir.name)
        started = psutil.Process(launch.pid).create_time()
    finally:
        launch.kill()
        launch.communicate(timeout=10)
    assert wait_gone(pids, 10) == []  # the agent stops its tasks by itself
    document = json.loads((job_dir / "job.json").read_text())
    assert document["state"] == "running"  # nobody has looked yet
    assert document["launcher"]["pid"] == launch.pid
    assert document["launcher"]["create_time"] == started
    assert document["launcher"]["boot_time"] == psutil.boot_time()

    listed = run_dtrain(["ps", "--json"], workdir)
    assert listed.returncode == 0, listed.stderr
    [dead] = json.loads(listed.stdout)["data"]["launcher_died"]
    assert dead["job_id"] == job_dir.name and dead["launcher"]["pid"] == launch.pid
    assert dead["processes_left"] == 0
    assert json.loads((job_dir / "job.json").read_text())["state"] == "launcher_died"

    text = run_dtrain(["ps", "--log-dir", "dtrain-logs"], workdir)
    assert f"job {job_dir.name}: launcher died (pid {launch.pid} " in text.stdout
    elsewhere = run_dtrain(["ps", "--log-dir", str(workdir / "nothing-here")], workdir)
    assert "launcher died" not in elsewhere.stdout


def test_the_next_launch_says_the_previous_launcher_died(workdir: Path) -> None:
    launch = start_dtrain(
        ["launch", "-n", "1", "-s", "0", "--grace", "1", "--", PYTHON, BY_TASK, "*=sleep"],
        workdir,
    )
    try:
        job_dir = wait_for_latest(workdir)
        wait_for_line(job_dir / "worker.0.log", "ready worker.0")
        pids = job_pids(job_dir.name)
    finally:
        launch.kill()
        launch.communicate(timeout=10)
    assert wait_gone(pids, 10) == []
    result = run_dtrain(["launch", "-n", "1", "-s", "0", "--", PYTHON, BY_TASK], workdir)
    assert result.returncode == 0, result.stderr
    assert (
        f"dtrain: the previous job {job_dir.name} never recorded its end: launcher died "
        f"(pid {launch.pid})"
    ) in result.stderr
    assert json.loads((job_dir / "job.json").read_text())["state"] == "launcher_died"


def test_a_live_launcher_is_not_reported_dead(workdir: Path) -> None:
    launch = start_dtrain(
        ["launch", "-n", "1", "-s", "0", "--grace", "1", "--", PYTHON, BY_TASK, "*=sleep"],
        workdir,
    )
    try:
        job_dir = wait_for_latest(workdir)
        wait_for_line(job_dir / "worker.0.log", "ready worker.0")
        listed = run_dtrain(["ps", "--json", "--job", job_dir.name], workdir)
    finally:
        launch.terminate()
        launch.communicate(timeout=30)
    assert json.loads(listed.stdout)["data"]["launcher_died"] == []
    assert json.loads((job_dir / "job.json").read_text())["state"] == "interrupted"


@pytest.mark.skipif(not IS_ROOT, reason="mounting a small tmpfs needs root")
def test_a_full_disk_under_redirected_stdout_silences_stdout_not_the_job(tmp_path: Path) -> None:
    command = f"{shlex.quote(PYTHON)} {shlex.quote(program('write_lots.py'))} 2; exit 7"
    with tmpfs(tmp_path / "small", "size=512k") as disk, open(disk / "out.log", "wb") as out:
        result = subprocess.run(
            [
                *dtrain_argv("launch", "--framework", "torch", "-n", "1"),
                *("--", "sh", "-c", command),
            ],
            cwd=tmp_path,
            stdout=out,
            stderr=subprocess.PIPE,
            stdin=subprocess.DEVNULL,
            text=True,
            timeout=120,
        )
    assert result.returncode == 7, result.stderr[-2000:]
    warnings = [line for line in result.stderr.splitlines() if "cannot write to stdout" in line]
    assert warnings == [
        "dtrain: cannot write to stdout: No space left on device; task output goes on "
        "to the logs and stderr only"
    ]
    assert "Traceback" not in result.stderr
    log = (tmp_path / "dtrain-logs" / "latest" / "worker.0.log").read_text().splitlines()
    assert len(log) == int(2 * 1024 * 1024 / 100)


# ---- who ran the job (pure, and this process) ------------------------------------------------


@pytest.mark.parametrize(
    ("entry", "expected"),
    [
        (None, None),
        ("1234", None),
        ({"pid": "1234", "host": "h"}, None),
        ({"pid": 1234}, None),
        ({"pid": True, "host": "h"}, None),
        ({"pid": 1234, "host": "h"}, Launcher(1234, "h")),
        (
            {"pid": 1234, "host": "h", "create_time": 99.5, "boot_time": 7},
            Launcher(1234, "h", 99.5, 7.0),
        ),
        ({"pid": 1234, "host": "h", "create_time": "99", "boot_time": True}, Launcher(1234, "h")),
        ({"pid": 1234, "host": "h", "create_time": float("nan")}, Launcher(1234, "h")),
        ({"pid": 1234, "host": "h", "start_ticks": 99, "boot_id": "b"}, Launcher(1234, "h")),
    ],
)
def test_launcher_from_job_json(entry: object, expected: Launcher | None) -> None:
    assert Launcher.from_dict(entry) == expected


JSON = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats() | st.text(),
    lambda inner: st.lists(inner) | st.dictionaries(st.text(), inner),
    max_leaves=10,
)


@given(st.dictionaries(st.sampled_from(["pid", "host", "create_time", "boot_time"]), JSON) | JSON)
def test_any_launcher_entry_reads_as_a_launcher_or_none(entry: object) -> None:
    launcher = Launcher.from_dict(entry)
    assert launcher is None or Launcher.from_dict(launcher.to_dict()) == launcher


def test_a_launcher_is_gone_only_when_this_host_no_longer_runs_that_very_process() -> None:
    me = this_launcher("here")
    assert me.create_time is not None and me.boot_time is not None
    assert not launcher_is_gone(me, "here")
    reused = dataclasses.replace(me, create_time=me.create_time - 60)  # an earlier process
    assert launcher_is_gone(reused, "here")
    rebooted = dataclasses.replace(me, boot_time=me.boot_time - 3600)
    assert launcher_is_gone(rebooted, "here")
    assert not launcher_is_gone(reused, "elsewhere")
    older_file = dataclasses.replace(me, create_time=None, boot_time=None)
    assert not launcher_is_gone(older_file, "here")


def test_a_step_of_the_clock_leaves_a_running_launcher_running() -> None:
    """Both times move with the clock; the span between them is the process's."""
    me = this_launcher("here")
    assert me.create_time is not None and me.boot_time is not None
    stepped = dataclasses.replace(
        me, create_time=me.create_time + 3600, boot_time=me.boot_time + 3600
    )
    assert not launcher_is_gone(stepped, "here")


def test_a_launcher_that_ended_is_gone_a_zombie_too_and_its_start_is_the_kernels() -> None:
    """Its time after boot is what the agent's own /proc reader says (an oracle apart)."""
    code = (
        "import json, time\n"
        "from dtrain.launch.joblog import this_launcher\n"
        "print(json.dumps(this_launcher('here').to_dict()), flush=True)\n"
        "time.sleep(60)\n"
    )
    child = subprocess.Popen([PYTHON, "-c", code], stdout=subprocess.PIPE, text=True)
    try:
        assert child.stdout is not None
        launcher = Launcher.from_dict(json.loads(child.stdout.readline()))
        assert launcher is not None and launcher.pid == child.pid
        assert launcher.create_time is not None and launcher.boot_time is not None
        ticks = procs.read_stat(child.pid)[5]
        since_boot = launcher.create_time - launcher.boot_time
        assert abs(since_boot - ticks / os.sysconf("SC_CLK_TCK")) < 0.02
        assert not launcher_is_gone(launcher, "here")
        child.kill()
        deadline = time.monotonic() + 10
        while procs.read_stat(child.pid)[0] != "Z":  # dead, not yet reaped
            assert time.monotonic() < deadline
            time.sleep(0.01)
        assert launcher_is_gone(launcher, "here")
    finally:
        child.kill()
        child.wait(timeout=10)
    assert launcher_is_gone(launcher, "here")
