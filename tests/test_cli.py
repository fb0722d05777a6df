"""The command line as a user meets it: help, errors that say what to do, clean stdout."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import time
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from dtrain import __version__
from dtrain.cli import cli, failure, hoist_debug
from tests.conftest import dtrain_argv, run_dtrain, start_dtrain
from tests.transport.test_connect_errors import Listener


def commands() -> list[str]:
    return sorted(cli.commands)


@pytest.mark.parametrize("name", commands())
def test_every_command_has_help_with_an_example(name: str) -> None:
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output
    assert f"dtrain {name}" in result.output


def test_group_help_and_version() -> None:
    runner = CliRunner()
    assert "Examples:" in runner.invoke(cli, ["--help"]).output
    assert __version__ in runner.invoke(cli, ["--version"]).output
    assert isinstance(cli, click.Group)


def test_bad_hosts_line_is_a_located_usage_error(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("node1\nnode3:22x\n")
    result = run_dtrain(["launch", "-n", "1", "-H", str(hosts), "--", "true"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f'{hosts}:2: "22x" is not a valid port (expected 1-65535)',
        "  hint: write one host per line as [user@]host[:port] [slots=N]; see hosts.example",
    ]
    assert result.stdout == ""


def test_duplicate_host_is_a_usage_error(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("node1\n# again\nnode1 slots=2\n")
    result = run_dtrain(["launch", "-n", "1", "-H", str(hosts), "--", "true"], tmp_path)
    assert result.returncode == 2
    assert 'hosts:3: duplicate host "node1" (first listed on line 1)' in result.stderr


def test_missing_hosts_file_says_what_to_do(tmp_path: Path) -> None:
    result = run_dtrain(["launch", "-n", "1", "-H", "nohosts", "--", "true"], tmp_path)
    assert result.returncode == 2
    assert "dtrain: hosts file nohosts (-H) does not exist" in result.stderr
    assert "hint:" in result.stderr


def test_unknown_framework_lists_the_valid_ones(tmp_path: Path) -> None:
    result = run_dtrain(["launch", "--framework", "jax", "--", "true"], tmp_path)
    assert result.returncode == 2
    assert 'unknown framework "jax"' in result.stderr
    assert "mxnet" in result.stderr and "pytorch" in result.stderr


def test_missing_command_is_a_usage_error(tmp_path: Path) -> None:
    result = run_dtrain(["launch", "-n", "2"], tmp_path)
    assert result.returncode == 2
    assert "no command to run" in result.stderr
    assert "Traceback" not in result.stderr


def test_usage_errors_in_json_mode_are_one_json_document(tmp_path: Path) -> None:
    result = run_dtrain(["launch", "--json", "-n", "0", "--", "true"], tmp_path)
    assert result.returncode == 2
    document = json.loads(result.stdout)
    assert document["status"] == "failed" and document["exit_code"] == 2
    assert document["errors"][0]["code"] == "usage"


def test_the_training_scripts_own_flags_are_not_eaten(tmp_path: Path) -> None:
    result = run_dtrain(
        ["launch", "--dry-run", "--json", "-n", "1", "python", "t.py", "--num-workers", "9", "-s"],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)["data"]["plan"]
    assert plan["tasks"][-1]["argv"] == ["python", "t.py", "--num-workers", "9", "-s"]
    assert len(plan["tasks"]) == 3


def test_a_hosts_file_that_is_not_a_regular_file_is_refused_not_read_forever(
    tmp_path: Path,
) -> None:
    fifo = tmp_path / "hosts.fifo"
    os.mkfifo(fifo)
    for path in (fifo, Path("/dev/zero")):
        result = run_dtrain(
            ["launch", "--dry-run", "-n", "1", "-H", str(path), "--", "true"], tmp_path
        )
        assert result.returncode == 2
        kind = "a FIFO" if path == fifo else "a character device"
        assert result.stderr.splitlines() == [
            f"dtrain: hosts file {path} (-H) is {kind}, not a regular file",
            "  hint: pass -H FILE, a text file with one host per line (see hosts.example), "
            "or leave -H out to run everything on this machine",
        ]


def test_a_hosts_file_larger_than_any_real_one_is_refused(tmp_path: Path) -> None:
    huge = tmp_path / "hosts"
    with huge.open("wb") as out:
        out.truncate(4 * 1024**3)  # sparse: 4 GiB of NULs that take no disk
    result = run_dtrain(["ps", "-H", str(huge)], tmp_path)
    assert result.returncode == 2
    assert f"dtrain: hosts file {huge} (-H) is larger than 16 MiB" in result.stderr
    assert "Traceback" not in result.stderr


def test_a_byte_order_mark_is_shown_escaped_and_named(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_bytes(b"\xef\xbb\xbflocalhost\n")
    result = run_dtrain(
        ["launch", "--dry-run", "-n", "1", "-H", str(hosts), "--", "true"], tmp_path
    )
    assert result.returncode == 2
    assert result.stderr.splitlines()[0] == (
        f'{hosts}:1: "\\ufefflocalhost" is not a valid host name or address: '
        "the hosts file has a byte-order mark"
    )


@pytest.mark.parametrize("name", ["localhost", "127.0.0.1", "[::ffff:127.0.0.1]"])
def test_a_dry_run_on_a_hosts_file_of_only_this_machine_plans_a_job_here(
    tmp_path: Path, name: str
) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text(f"{name}\n")
    result = run_dtrain(
        ["launch", "--dry-run", "--json", "-n", "2", "-H", str(hosts), "--", "true"], tmp_path
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)["data"]["plan"]
    assert all(t["address"] in ("127.0.0.1", "::ffff:127.0.0.1") for t in plan["tasks"])


@pytest.mark.parametrize(
    ("args", "flag"),
    [
        (["launch", "--timeout", "nan", "--", "true"], "--timeout"),
        (["launch", "--grace", "nan", "--", "true"], "--grace"),
        (["launch", "--grace", "inf", "--", "true"], "--grace"),
        (["launch", "--traceback-timeout", "nan", "--", "true"], "--traceback-timeout"),
        (["launch", "--heartbeat-timeout", "nan", "--", "true"], "--heartbeat-timeout"),
        (["launch", "--connect-timeout", "nan", "--", "true"], "--connect-timeout"),
        (["ps", "--connect-timeout", "inf"], "--connect-timeout"),
        (["kill", "--grace", "nan"], "--grace"),
        (["doctor", "--connect-timeout", "nan"], "--connect-timeout"),
    ],
)
def test_durations_that_are_not_finite_numbers_are_usage_errors(args: list[str], flag: str) -> None:
    result = CliRunner().invoke(cli, args)
    assert result.exit_code == 2
    assert f"'{flag}'" in result.output
    assert "Traceback" not in result.output


@pytest.mark.parametrize("command", ["launch", "doctor"])
def test_an_empty_workdir_is_a_usage_error_not_this_directory(command: str) -> None:
    result = CliRunner().invoke(cli, [command, "--workdir", "", "--", "true"])
    assert result.exit_code == 2
    assert "'--workdir': is empty" in result.output


@pytest.mark.parametrize(
    ("args", "expected"),
    [
        (["launch", "--debug", "-n", "1", "--", "x"], ["--debug", "launch", "-n", "1", "--", "x"]),
        (["launch", "--", "x", "--debug"], ["launch", "--", "x", "--debug"]),
        (["--debug", "launch", "--", "x"], ["--debug", "launch", "--", "x"]),
        (["launch", "-n", "1", "x", "--debug"], ["launch", "-n", "1", "x", "--debug"]),
    ],
)
def test_debug_after_the_command_name_means_debug(args: list[str], expected: list[str]) -> None:
    assert hoist_debug(args) == expected


def test_debug_among_a_commands_flags_without_double_dash_says_where_it_goes(
    tmp_path: Path,
) -> None:
    result = run_dtrain(["launch", "--debug", "-n", "1", "--dry-run", "python", "x"], tmp_path)
    assert result.returncode == 2
    assert result.stderr == (
        "dtrain: --debug goes before the command's name (dtrain --debug launch ...), "
        "or before the -- that starts your command\n"
    )


def signalled_while_connecting(
    tmp_path: Path, signum: int, flags: tuple[str, ...] = ()
) -> tuple[int, str, str]:
    """`dtrain launch` to a host that accepts and never answers, sent `signum` while it waits
    for the ssh banner: (exit code, stdout, stderr)."""
    silent = Listener()
    try:
        (tmp_path / "hosts").write_text(f"127.0.0.1:{silent.port}\n")
        args = ["launch", *flags, "-n", "1", "-H", "hosts", "--ssh-config", "/dev/null"]
        proc = start_dtrain([*args, "--", "true"], tmp_path)
        deadline = time.monotonic() + 20
        while silent.accepted == 0 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert silent.accepted == 1
        proc.send_signal(signum)
        stdout, stderr = proc.communicate(timeout=20)
    finally:
        silent.stop()
    return proc.returncode, stdout, stderr


def test_sigterm_while_connecting_says_nothing_was_started(tmp_path: Path) -> None:
    code, _, stderr = signalled_while_connecting(tmp_path, signal.SIGTERM)
    assert code == 143
    assert stderr == "dtrain: stopped by SIGTERM before any task started; nothing is running\n"


@pytest.mark.parametrize(
    ("signum", "exit_code", "problem"),
    [(signal.SIGINT, 130, "interrupted"), (signal.SIGTERM, 143, "terminated")],
)
def test_a_signal_before_the_plan_under_json_is_one_json_document(
    tmp_path: Path, signum: int, exit_code: int, problem: str
) -> None:
    code, stdout, stderr = signalled_while_connecting(tmp_path, signum, ("--json",))
    assert code == exit_code, stderr
    document = json.loads(stdout)
    assert document["exit_code"] == exit_code and document["errors"][0]["code"] == problem
    assert "Traceback" not in stderr


def test_output_to_a_pipe_arrives_whole_before_the_program_exits(tmp_path: Path) -> None:
    """What the program printed is flushed before it exits."""
    result = run_dtrain(["--help"], tmp_path)
    assert result.returncode == 0
    assert result.stdout.startswith("Usage: dtrain")
    assert isinstance(cli, click.Group)
    last = sorted(cli.commands)[-1]  # the help lists the commands in order: the last line
    assert result.stdout.rstrip("\n").splitlines()[-1].split()[0] == last
    assert result.stderr == ""


def test_a_reader_that_goes_away_early_gets_no_traceback(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # `dtrain launch --help | true`, with the reader already gone
    try:
        result = subprocess.run(
            dtrain_argv("launch", "--help"),
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=write,
            stderr=subprocess.PIPE,
            text=True,
            timeout=60,
        )
    finally:
        os.close(write)
    assert result.returncode in (0, 1)
    assert "Traceback" not in result.stderr
    assert "Exception ignored" not in result.stderr


@pytest.mark.parametrize(
    "args",
    [
        ["launch", "--json", "--no-such-flag", "--", "true"],
        ["launch", "--json", "-n", "many", "--", "true"],
        ["ps", "--json", "--connect-timeout", "nan"],
        ["kill", "--no-such-flag", "--json"],
        ["doctor", "--json", "--launcher", "yarn"],
    ],
)
def test_option_parser_errors_under_json_are_one_json_document(
    tmp_path: Path, args: list[str]
) -> None:
    result = run_dtrain(args, tmp_path)
    assert result.returncode == 2
    document = json.loads(result.stdout)
    assert document["command"] == args[0] and document["exit_code"] == 2
    [error] = document["errors"]
    assert error["code"] == "usage" and error["message"] in result.stderr


def test_json_after_the_users_command_is_the_users_flag(tmp_path: Path) -> None:
    result = run_dtrain(["launch", "--no-such-flag", "python", "t.py", "--json"], tmp_path)
    assert result.returncode == 2
    assert result.stdout == ""
    assert "--no-such-flag" in result.stderr


# Ctrl-C while the program's modules load: a real SIGINT, sent by the process to itself the
# moment it starts importing click (the seam that makes "the first fraction of a second"
# happen every time).
INTERRUPTED_WHILE_LOADING = """
import os, signal, sys
class InterruptOnImport:
    def find_spec(self, name, path=None, target=None):
        if name == "click":
            sys.meta_path.remove(self)
            os.kill(os.getpid(), signal.SIGINT)
        return None
sys.meta_path.insert(0, InterruptOnImport())
sys.argv[0] = "dtrain"
from dtrain.__main__ import main
main()
"""


@pytest.mark.parametrize("as_json", [False, True])
def test_ctrl_c_while_the_program_loads_is_no_traceback(tmp_path: Path, as_json: bool) -> None:
    json_flag = ["--json"] if as_json else []
    result = subprocess.run(
        [dtrain_argv()[0], "-c", INTERRUPTED_WHILE_LOADING, "launch", *json_flag, "--", "true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
    )
    assert result.returncode == 130, result.stderr
    assert result.stderr == "dtrain: interrupted before any task started; nothing is running\n"
    if as_json:
        document = json.loads(result.stdout)
        assert document["exit_code"] == 130 and document["errors"][0]["code"] == "interrupted"
    else:
        assert result.stdout == ""
    assert not (tmp_path / "dtrain-logs").exists()


def test_a_dtrain_started_with_sigint_ignored_keeps_ignoring_it(tmp_path: Path) -> None:
    """`dtrain launch ... &` from a script: the shell made it immune to Ctrl-C."""
    result = subprocess.run(
        [dtrain_argv()[0], "-c", INTERRUPTED_WHILE_LOADING, "launch", "--dry-run", "--", "true"],
        cwd=tmp_path,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        preexec_fn=lambda: signal.signal(signal.SIGINT, signal.SIG_IGN),
    )
    assert result.returncode == 0, result.stderr
    assert result.stdout.startswith("job ")


def no_scontrol_env(**slurm: str) -> dict[str, str]:
    """This shell inside a Slurm allocation, with dtrain's own reading of the node list."""
    return {**os.environ, "PATH": "/nonexistent", "SLURM_JOB_ID": "7", **slurm}


@pytest.mark.parametrize("as_json", [False, True])
def test_an_allocation_with_no_task_on_any_node_is_a_usage_error(
    tmp_path: Path, as_json: bool
) -> None:
    env = no_scontrol_env(SLURM_JOB_NODELIST="n[1-2]", SLURM_TASKS_PER_NODE="0(x2)")
    args = ["launch", *(["--json"] if as_json else []), "--dry-run", "--", "true"]
    result = run_dtrain(args, tmp_path, env=env)
    assert result.returncode == 2, result.stderr
    message = 'SLURM_TASKS_PER_NODE="0(x2)" gives no node a task'
    if as_json:
        assert json.loads(result.stdout)["errors"][0]["message"] == message
    else:
        assert result.stderr.splitlines()[0] == f"dtrain: {message}"
    assert "Traceback" not in result.stderr


def test_a_log_dir_that_is_not_utf8_works_and_is_shown_escaped(tmp_path: Path) -> None:
    log_dir = os.fsdecode(b"logs-\xff")
    result = run_dtrain(
        ["launch", "-n", "1", "-s", "0", "--log-dir", log_dir, "--", "true"], tmp_path
    )
    assert result.returncode == 0, result.stderr
    assert "Traceback" not in result.stderr
    assert "logs in logs-\\udcff/" in result.stderr
    latest = tmp_path / log_dir / "latest"
    assert (latest.resolve() / "job.json").is_file()


def test_a_reader_that_goes_away_does_not_change_the_jobs_exit_code(tmp_path: Path) -> None:
    read, write = os.pipe()
    os.close(read)  # `dtrain launch ... 2>&1 | head -n 1`, the reader gone after its line
    try:
        result = subprocess.run(
            dtrain_argv("launch", "-n", "1", "-s", "0", "--", "true"),
            cwd=tmp_path,
            stdin=subprocess.DEVNULL,
            stdout=write,
            stderr=write,
            timeout=60,
        )
    finally:
        os.close(write)
    assert result.returncode == 0
    document = json.loads((tmp_path / "dtrain-logs" / "latest" / "job.json").read_text())
    assert document["result"]["exit_code"] == 0


def test_an_unexpected_error_is_one_line_and_a_hint_without_debug() -> None:
    exit_code, text, [problem] = failure(ZeroDivisionError("integer modulo by zero"))
    assert exit_code == 1
    assert text.splitlines() == [
        "dtrain: internal error: ZeroDivisionError: integer modulo by zero",
        "  hint: run it again with --debug for the traceback, and report it",
    ]
    assert problem.code == "internal"


def test_ps_shows_a_job_id_and_command_line_with_newlines_on_one_line(tmp_path: Path) -> None:
    job = f"forged\njob {os.getpid()}"
    env = {**os.environ, "DTRAIN_JOB_ID": job, "DTRAIN_TASK": "worker.0"}
    code = "import time; time.sleep(60)"
    proc = subprocess.Popen(
        [dtrain_argv()[0], "-c", code, "line one\nline two"], env=env, start_new_session=True
    )
    try:
        result = run_dtrain(["ps", "--job", job], tmp_path)
    finally:
        proc.kill()
        proc.wait(timeout=10)
    assert result.returncode == 0, result.stderr
    assert f"  job forged\\njob {os.getpid()}\n" in result.stdout
    [row] = [line for line in result.stdout.splitlines() if line.lstrip().startswith(str(proc.pid))]
    assert row.endswith("line one\\nline two")


@pytest.mark.parametrize(
    ("debug", "shown"),
    [
        (False, "dtrain: HOST KEY CHANGED for h1\n"),
        (True, "dtrain: dtrain.transport.ssh: HOST KEY CHANGED for h1\n"),
    ],
)
def test_a_warning_reads_as_dtrains_own_line_and_names_its_module_under_debug(
    tmp_path: Path, debug: bool, shown: str
) -> None:
    code = (
        "import logging, sys\n"
        "from dtrain.cli import cli\n"
        "cli.main(args=[*sys.argv[1:], 'ps', '--help'], standalone_mode=False)\n"
        "logging.getLogger('dtrain.transport.ssh').warning('HOST KEY CHANGED for %s', 'h1')\n"
    )
    flags = ["--debug"] if debug else []
    result = subprocess.run(
        [dtrain_argv()[0], "-c", code, *flags], capture_output=True, text=True, timeout=60
    )
    assert result.returncode == 0, result.stderr
    assert result.stderr == shown


def test_an_ipv6_host_is_shown_with_its_port_after_brackets(tmp_path: Path) -> None:
    with socket.socket(socket.AF_INET6) as probe:
        probe.bind(("::1", 0))  # a loopback port nothing listens on once it is closed
        port = probe.getsockname()[1]
    (tmp_path / "hosts").write_text(f"[::1]:{port}\n")
    args = ["launch", "-n", "1", "-H", "hosts", "--ssh-config", "/dev/null", "--", "true"]
    result = run_dtrain(args, tmp_path)
    assert result.returncode == 3, result.stderr
    assert f"  [::1]:{port}: connection refused" in result.stderr.splitlines()
