"""The local launcher end to end: real dtrain processes, real tasks, real signals."""

from __future__ import annotations

import json
import os
import re
import shlex
import signal
import socket
import subprocess
import time
from pathlib import Path
from typing import Any

import pytest

from dtrain.remote import procs, proto
from tests.conftest import (
    PYTHON,
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


def log_dir_of(cwd: Path) -> Path:
    dirs = [p for p in (cwd / "dtrain-logs").iterdir() if not p.is_symlink()]
    assert len(dirs) == 1, dirs
    return dirs[0]


def job_json(cwd: Path) -> dict[str, Any]:
    document: dict[str, Any] = json.loads((log_dir_of(cwd) / "job.json").read_text())
    return document


def test_success_exits_zero_with_prefixed_output_logs_and_job_json(workdir: Path) -> None:
    result = run_dtrain(
        ["launch", "-n", "2", "-s", "1", "--", PYTHON, BY_TASK, "*=exit:0"], workdir
    )
    assert result.returncode == 0, result.stderr
    stdout_lines = set(result.stdout.splitlines())
    for task in ("scheduler", "server.0", "worker.0", "worker.1"):
        assert any(line.startswith(f"[{task}] ready {task} ") for line in stdout_lines)
        assert f"[{task}] {task} exits with 0" in result.stderr
    logs = log_dir_of(workdir)
    assert (workdir / "dtrain-logs" / "latest").resolve() == logs.resolve()
    worker_log = (logs / "worker.1.log").read_text()
    assert worker_log.startswith("ready worker.1 ")  # unprefixed
    assert "worker.1 exits with 0" in worker_log
    document = job_json(workdir)
    assert document["state"] == "succeeded"
    assert document["result"]["exit_code"] == 0
    tasks = {t["task"]: t for t in document["result"]["tasks"]}
    assert set(tasks) == {"scheduler", "server.0", "worker.0", "worker.1"}
    assert all(t["pid"] for t in tasks.values())
    assert tasks["worker.0"]["exit_code"] == 0
    assert "succeeded: 4 tasks" in result.stderr


def test_first_failure_stops_the_rest_and_its_exit_code_is_dtrains(workdir: Path) -> None:
    started = time.monotonic()
    result = run_dtrain(
        [
            "launch",
            "-n",
            "3",
            "-s",
            "1",
            "--grace",
            "2",
            "--",
            PYTHON,
            BY_TASK,
            "worker.1=exit:7:0.5",
            "*=sleep",
        ],
        workdir,
    )
    elapsed = time.monotonic() - started
    assert result.returncode == 7, result.stderr
    assert elapsed < 10
    summary = result.stderr[result.stderr.index("dtrain: job") :]
    assert re.search(
        r"failed: worker\.1 exited with code 7 at \d\d:\d\d:\d\d \(first failure\)", result.stderr
    )
    assert "| worker.1 exits with 7" in result.stderr
    assert "full log: dtrain-logs/" in result.stderr and "worker.1.log" in result.stderr
    assert "4 other tasks were stopped by dtrain after this failure" in result.stderr
    document = job_json(workdir)
    root = document["result"]["root_cause"]
    assert root["task"] == "worker.1" and root["exit_code"] == 7
    stopped = [t for t in document["result"]["tasks"] if t["stopped_by_dtrain"]]
    assert len(stopped) == 4
    assert summary


def test_death_by_signal_exits_128_plus_n(workdir: Path) -> None:
    result = run_dtrain(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "0",
            "--",
            PYTHON,
            BY_TASK,
            "worker.0=kill-self:9:0.2",
            "*=sleep",
        ],
        workdir,
    )
    assert result.returncode == 128 + 9, result.stderr
    assert "worker.0 was killed by SIGKILL from outside dtrain" in result.stderr


def test_servers_that_never_exit_are_stopped_after_workers_succeed(workdir: Path) -> None:
    result = run_dtrain(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "2",
            "--grace",
            "0.5",
            "--",
            PYTHON,
            BY_TASK,
            "worker.0=exit:0",
            "worker.1=exit:0:0.3",
            "*=sleep",
        ],
        workdir,
        timeout_s=30,
    )
    assert result.returncode == 0, result.stderr
    tasks = {t["task"]: t for t in job_json(workdir)["result"]["tasks"]}
    assert tasks["server.0"]["stopped_by_dtrain"] and tasks["scheduler"]["stopped_by_dtrain"]
    assert not tasks["worker.1"]["stopped_by_dtrain"]


def test_sigterm_ignoring_task_is_killed_after_the_grace(workdir: Path) -> None:
    started = time.monotonic()
    result = run_dtrain(
        [
            "launch",
            "-n",
            "1",
            "-s",
            "1",
            "--grace",
            "1",
            "--",
            PYTHON,
            BY_TASK,
            "worker.0=exit:3:0.3",
            "*=ignore-term",
        ],
        workdir,
    )
    assert result.returncode == 3
    assert time.monotonic() - started < 10
    tasks = {t["task"]: t for t in job_json(workdir)["result"]["tasks"]}
    assert tasks["server.0"]["signal"] == signal.SIGKILL


def test_traceback_then_hang_is_a_failure_named_as_the_root_cause(workdir: Path) -> None:
    result = run_dtrain(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "1",
            "--traceback-timeout",
            "1",
            "--grace",
            "1",
            "--",
            PYTHON,
            BY_TASK,
            "worker.0=traceback",
            "*=sleep",
        ],
        workdir,
        timeout_s=30,
    )
    assert result.returncode == 1, result.stderr
    assert "worker.0 printed an unhandled Python traceback and then hung" in result.stderr
    assert "RuntimeError: injected failure in worker.0" in result.stderr


def test_a_handled_traceback_while_computing_is_not_a_hang(workdir: Path) -> None:
    result = run_dtrain(
        [
            "launch",
            "-n",
            "1",
            "-s",
            "0",
            "--framework",
            "torch",
            "--traceback-timeout",
            "0.5",
            "--",
            PYTHON,
            program("handled_traceback.py"),
            "2",
        ],
        workdir,
        timeout_s=30,
    )
    assert result.returncode == 0, result.stderr
    assert "[worker.0] done True" in result.stdout


def test_timeout_stops_the_job_with_exit_124(workdir: Path) -> None:
    result = run_dtrain(
        [
            "launch",
            "-n",
            "1",
            "-s",
            "1",
            "--timeout",
            "1",
            "--grace",
            "1",
            "--",
            PYTHON,
            BY_TASK,
            "*=sleep",
        ],
        workdir,
    )
    assert result.returncode == 124, result.stderr
    assert "reached its --timeout of 1s with 3 task(s) still running" in result.stderr
    assert "timed out after 1s" in result.stderr


def test_descendants_die_with_their_task_even_outside_its_group(workdir: Path) -> None:
    result = run_dtrain(
        [
            "launch",
            "-n",
            "2",
            "-s",
            "0",
            "--",
            PYTHON,
            BY_TASK,
            "worker.0=tree-exit:0.3",
            "worker.1=tree-exit:0.3",
        ],
        workdir,
    )
    assert result.returncode == 0, result.stderr
    pids = [
        int(p)
        for line in result.stdout.splitlines()
        if "descendants" in line
        for p in line.split()[-2:]
    ]
    assert len(pids) == 4
    assert wait_gone(pids, 5) == []


def start_and_wait(
    workdir: Path, args: list[str], ready: str = "ready worker.0"
) -> tuple[subprocess.Popen[str], str]:
    proc = start_dtrain(args, workdir)
    log_dir = wait_for_latest(workdir, timeout_s=20)
    wait_for_line(log_dir / "worker.0.log", ready)
    return proc, log_dir.name


@pytest.mark.parametrize(("signum", "code"), [(signal.SIGINT, 130), (signal.SIGTERM, 143)])
def test_ctrl_c_or_sigterm_stops_every_task(workdir: Path, signum: int, code: int) -> None:
    proc, job_id = start_and_wait(
        workdir, ["launch", "-n", "2", "-s", "1", "--grace", "2", "--", PYTHON, BY_TASK, "*=tree"]
    )
    deadline = time.monotonic() + 20
    while len(pids := job_pids(job_id)) < 4 * 3 and time.monotonic() < deadline:
        time.sleep(0.05)
    assert len(pids) == 4 * 3  # every task with its two descendants
    proc.send_signal(signum)
    _, stderr = proc.communicate(timeout=20)
    assert proc.returncode == code, stderr
    assert "stopping every task" in stderr
    assert wait_gone(pids, 3) == []


def test_second_ctrl_c_kills_at_once(workdir: Path) -> None:
    proc, job_id = start_and_wait(
        workdir,
        ["launch", "-n", "1", "-s", "1", "--grace", "60", "--", PYTHON, BY_TASK, "*=ignore-term"],
    )
    pids = job_pids(job_id)
    proc.send_signal(signal.SIGINT)
    time.sleep(0.5)
    started = time.monotonic()
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=20)
    assert time.monotonic() - started < 10
    assert proc.returncode == 130
    assert "killing every task now" in stderr
    assert wait_gone(pids, 3) == []


def test_sigkill_of_dtrain_still_takes_every_task_down(workdir: Path) -> None:
    proc, job_id = start_and_wait(
        workdir,
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
            BY_TASK,
            "worker.0=ignore-term",
            "*=tree",
        ],
    )
    pids = job_pids(job_id)
    assert pids
    proc.kill()
    proc.communicate(timeout=10)
    assert wait_gone(pids, 1 + 4) == [], procs.describe(procs.snapshot(), pids)


def test_command_not_found_starts_nothing(workdir: Path) -> None:
    result = run_dtrain(["launch", "-n", "1", "--", "no-such-trainer", "x"], workdir)
    assert result.returncode == 3
    assert "command not found: no-such-trainer" in result.stderr
    assert "nothing was started" in result.stderr
    assert "Traceback" not in result.stderr


def test_missing_workdir_starts_nothing(workdir: Path) -> None:
    result = run_dtrain(
        ["launch", "-n", "1", "--workdir", str(workdir / "nope"), "--", PYTHON, BY_TASK], workdir
    )
    assert result.returncode == 3
    assert "working directory" in result.stderr and "does not exist" in result.stderr


TRICKY = [
    "two words",
    'it\'s "quoted"',
    "$HOME and $(rm -rf /) and `id`",
    "a;b|c&d>e<f",
    "line1\nline2\n",
    "ünïcödé ✓ 训练",
    "",
    "--num-workers",
    "-s",
    "\\back\\slash",
    "*?[glob]",
    "tab\there",
]


def test_argv_and_env_values_arrive_byte_exact(workdir: Path) -> None:
    args = ["launch", "-n", "1", "-s", "0"]
    for i, value in enumerate(TRICKY):
        args += ["--env", f"TRICKY_{i}={value}"]
    keys = ",".join(f"TRICKY_{i}" for i in range(len(TRICKY)))
    result = run_dtrain([*args, "--", PYTHON, program("print_env.py"), keys, *TRICKY], workdir)
    assert result.returncode == 0, result.stderr
    for line in (log_dir_of(workdir) / "worker.0.log").read_text().splitlines():
        document = json.loads(line)
        assert document["argv"] == [keys, *TRICKY]
        assert document["env"] == {f"TRICKY_{i}": v for i, v in enumerate(TRICKY)}
        assert document["cwd"] == str(workdir)
    assert "TRICKY_0" not in " ".join(
        " ".join(p["cmdline"]) for p in procs.describe(procs.snapshot(), list(procs.snapshot()))
    )


def test_json_puts_exactly_one_document_on_stdout(workdir: Path) -> None:
    result = run_dtrain(
        [
            "launch",
            "--json",
            "-n",
            "1",
            "-s",
            "1",
            "--",
            PYTHON,
            BY_TASK,
            "worker.0=exit:5",
            "*=sleep",
        ],
        workdir,
    )
    assert result.returncode == 5
    document = json.loads(result.stdout)
    assert document["dtrain_json"] == 1
    assert document["command"] == "launch"
    assert document["status"] == "failed"
    assert document["exit_code"] == 5
    assert document["data"]["result"]["root_cause"]["task"] == "worker.0"
    assert document["errors"][0]["code"] == "task_failed"
    assert "[worker.0] ready worker.0" in result.stderr


def test_dry_run_starts_nothing_and_json_is_the_plan(workdir: Path) -> None:
    result = run_dtrain(
        ["launch", "--dry-run", "--json", "-n", "2", "--", PYTHON, BY_TASK], workdir
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)["data"]["plan"]
    assert [t["name"] for t in plan["tasks"]] == [
        "scheduler",
        "server.0",
        "server.1",
        "worker.0",
        "worker.1",
    ]
    assert not (workdir / "dtrain-logs").exists()
    text = run_dtrain(["launch", "--dry-run", "-n", "1", "--", "python", "x.py"], workdir)
    assert "DMLC_ROLE=worker" in text.stdout and "nothing was started" in text.stdout


def test_environment_of_the_launching_shell_reaches_local_tasks(workdir: Path) -> None:
    env = dict(os.environ, PS_VERBOSE="1", MY_SETTING="kept")
    result = run_dtrain(
        [
            "launch",
            "-n",
            "1",
            "-s",
            "0",
            "--",
            PYTHON,
            program("print_env.py"),
            "PS_VERBOSE,MY_SETTING,DMLC_ROLE",
        ],
        workdir,
        env=env,
    )
    assert result.returncode == 0, result.stderr
    line = next(x for x in result.stdout.splitlines() if x.startswith("[worker.0]"))
    document = json.loads(line.split("] ", 1)[1])
    assert document["env"] == {"PS_VERBOSE": "1", "MY_SETTING": "kept", "DMLC_ROLE": "worker"}


@pytest.mark.parametrize(
    "layout",
    [
        ["-n", "1", "-s", "1"],
        ["--framework", "torch", "-n", "2"],
        ["--framework", "tf", "-n", "1", "-s", "1"],
        ["--framework", "paddle", "-n", "2"],
        ["--framework", "paddle", "-n", "1", "-s", "1"],
    ],
    ids=["dmlc", "torch", "tf", "paddle", "paddle-ps"],
)
def test_no_variable_dtrain_manages_leaks_from_the_launchers_environment(
    workdir: Path, layout: list[str]
) -> None:
    managed = sorted({name for names in proto.MANAGED_VARS.values() for name in names})
    env = dict(os.environ, **{name: "stale" for name in managed})
    names = ",".join(managed)
    command = ["launch", *layout, "--", PYTHON, program("print_env.py"), names]
    result = run_dtrain(command, workdir, env=env)
    assert result.returncode == 0, result.stderr
    planned = {t["name"]: t["env"] for t in job_json(workdir)["plan"]["tasks"]}
    for name, task_env in planned.items():
        line = (log_dir_of(workdir) / f"{name}.log").read_text().splitlines()[0]
        seen = json.loads(line)["env"]
        assert seen == {k: v for k, v in task_env.items() if k in managed}, name


# A daemon that leaves its task's process group and drops the job's tag on its way out.
DAEMON = 'setsid env -i sleep 1000 & echo "$!" > daemon.pid; sleep 0.5; exit {code}'


@pytest.mark.parametrize("code", [3, 0], ids=["task-fails", "task-ends"])
def test_a_daemon_that_left_its_group_and_tag_is_stopped_with_the_job(
    workdir: Path, code: int
) -> None:
    command = ["launch", "--framework", "torch", "-n", "1", "--grace", "1"]
    result = run_dtrain([*command, "--", "bash", "-c", DAEMON.format(code=code)], workdir)
    daemon = int((workdir / "daemon.pid").read_text())
    left = wait_gone([daemon], 10.0)
    if left:
        os.kill(daemon, signal.SIGKILL)  # the test's own leftover: by its pid
    assert result.returncode == code, result.stderr
    assert not left, f"the daemon {daemon} outlived its job"


def test_a_reader_that_goes_away_silences_output_but_not_the_job(workdir: Path) -> None:
    command = " ".join(
        shlex.quote(arg)
        for arg in dtrain_argv(
            "launch",
            "-n",
            "1",
            "-s",
            "0",
            "--framework",
            "torch",
            "--",
            PYTHON,
            program("write_lots.py"),
            "5",
        )
    )
    result = subprocess.run(
        ["bash", "-c", f"{command} | head -1; exit ${{PIPESTATUS[0]}}"],
        cwd=workdir,
        capture_output=True,
        text=True,
        timeout=120,
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("[worker.0] 00000000 ")
    lines = (log_dir_of(workdir) / "worker.0.log").read_text().splitlines()
    assert len(lines) == int(5 * 1024 * 1024 / 100)  # the log has everything


def test_missing_python_script_here_starts_nothing_and_exits_3(workdir: Path) -> None:
    result = run_dtrain(["launch", "-n", "1", "--", PYTHON, "nosuch.py"], workdir)
    assert result.returncode == 3, result.stderr
    assert "nosuch.py: no such file in" in result.stderr
    assert "nothing was started" in result.stderr
    assert not (workdir / "dtrain-logs").exists()


@pytest.mark.parametrize("shell", [["bash"], ["sh", "-x"], ["bash", "-e", "-o", "pipefail"]])
def test_a_missing_shell_script_starts_nothing_and_exits_3(workdir: Path, shell: list[str]) -> None:
    result = run_dtrain(["launch", "-n", "1", "--", *shell, "missing.sh"], workdir)
    assert result.returncode == 3, result.stderr
    assert "missing.sh: no such file in" in result.stderr
    assert "nothing was started" in result.stderr
    assert not (workdir / "dtrain-logs").exists()


def test_a_shell_script_bash_finds_on_path_and_bash_c_are_not_refused(workdir: Path) -> None:
    folder = workdir / "bin"
    folder.mkdir()
    (folder / "on_path.sh").write_text("echo found on PATH\n")
    env = {**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"}
    args = ["launch", "--framework", "torch", "-n", "1", "--"]
    result = run_dtrain([*args, "bash", "on_path.sh"], workdir, env=env)
    assert result.returncode == 0, result.stderr
    assert "[worker.0] found on PATH" in result.stdout
    assert run_dtrain([*args, "bash", "-c", "exit 0"], workdir).returncode == 0


def test_a_gpu_this_machine_lacks_gets_a_note_and_the_job_still_runs(workdir: Path) -> None:
    if os.path.exists("/proc/driver/nvidia/gpus/") or os.path.exists("/dev/kfd"):
        pytest.skip("this machine has GPUs: the note is checked without them")
    args = ["launch", "--framework", "torch", "--gpus", "7", "--", PYTHON, "-c", "pass"]
    result = run_dtrain(args, workdir)
    assert result.returncode == 0, result.stderr
    assert (
        ": worker.0: CUDA_VISIBLE_DEVICES=7, but this host has no GPU 7 "
        "(the NVIDIA driver shows no GPU)\n"
    ) in result.stderr


def test_a_directory_as_the_command_says_it_is_a_directory(workdir: Path) -> None:
    result = run_dtrain(["launch", "-n", "1", "--", str(workdir)], workdir)
    assert result.returncode == 3, result.stderr
    assert f"{workdir} is a directory, not a program" in result.stderr


def test_a_taken_port_here_fails_the_preflight_before_any_task_starts(workdir: Path) -> None:
    with socket.socket() as held:
        held.bind(("127.0.0.1", 0))
        held.listen()
        port = held.getsockname()[1]
        result = run_dtrain(
            ["launch", "-n", "1", "--port", str(port), "--", PYTHON, BY_TASK], workdir
        )
    assert result.returncode == 3, result.stderr
    assert f"port {port} is in use" in result.stderr
    assert "nothing was started" in result.stderr
    assert not (workdir / "dtrain-logs").exists()
