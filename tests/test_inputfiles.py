"""Files named on the command line (-H, --setup-file, --ssh-config): a FIFO, a device, a
directory or a huge file is one line naming the flag and the path, exit 2, at once."""

from __future__ import annotations

import json
import os
import resource
import subprocess
from pathlib import Path

import pytest

from tests.conftest import dtrain_argv

MEMORY_BOUND = 3 * 1024**3  # the old code read /dev/zero until this ran out: MemoryError
WHAT = {"-H": "hosts file", "--setup-file": "setup file", "--ssh-config": "ssh config"}


def bound_memory() -> None:
    resource.setrlimit(resource.RLIMIT_AS, (MEMORY_BOUND, MEMORY_BOUND))


def run_bounded(args: list[str], cwd: Path) -> subprocess.CompletedProcess[str]:
    """dtrain (and the `ssh -G` it starts) in bounded memory and time: a FIFO must not hang."""
    return subprocess.run(
        dtrain_argv(*args),
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=60,
        stdin=subprocess.DEVNULL,
        preexec_fn=bound_memory,
    )


def bad_input(tmp_path: Path, kind: str) -> tuple[Path, str]:
    """A path that is not a file to read (nothing ever writes to the FIFO), and its fault."""
    if kind == "device":
        return Path("/dev/zero"), "is a character device, not a regular file"
    if kind == "fifo":
        os.mkfifo(tmp_path / "fifo")
        return tmp_path / "fifo", "is a FIFO, not a regular file"
    if kind == "directory":
        (tmp_path / "dir").mkdir()
        return tmp_path / "dir", "is a directory, not a regular file"
    with (tmp_path / "huge").open("wb") as out:
        out.truncate(4 * 1024**3)  # sparse: 4 GiB of NULs that take no disk
    return tmp_path / "huge", "is larger than 16 MiB"


@pytest.mark.parametrize("kind", ["device", "fifo", "directory", "huge"])
@pytest.mark.parametrize("flag", ["-H", "--setup-file", "--ssh-config"])
def test_a_file_flag_naming_what_cannot_be_read_is_one_line_and_exit_2(
    tmp_path: Path, flag: str, kind: str
) -> None:
    path, fault = bad_input(tmp_path, kind)
    (tmp_path / "hosts").write_text("node1\n")  # so that `ssh -G -F` reads --ssh-config
    hosts = [] if flag == "-H" else ["-H", "hosts"]
    args = ["launch", "--dry-run", "-n", "1", *hosts, flag, str(path), "--", "true"]
    result = run_bounded(args, tmp_path)
    assert result.returncode == 2, result.stderr
    first, *rest = result.stderr.splitlines()
    assert first == f"dtrain: {WHAT[flag]} {path} ({flag}) {fault}"
    assert len(rest) == 1 and rest[0].startswith(f"  hint: pass {flag} FILE"), rest
    assert result.stdout == ""


@pytest.mark.parametrize("command", ["ps", "kill", "stacks", "doctor"])
@pytest.mark.parametrize("flag", ["-H", "--ssh-config"])
def test_every_command_refuses_a_fifo_at_once(tmp_path: Path, command: str, flag: str) -> None:
    path, fault = bad_input(tmp_path, "fifo")
    (tmp_path / "hosts").write_text("node1\n")
    hosts = [] if flag == "-H" else ["-H", "hosts"]
    result = run_bounded([command, "--json", *hosts, flag, str(path)], tmp_path)
    assert result.returncode == 2, result.stderr
    [error] = json.loads(result.stdout)["errors"]
    assert error["message"] == f"{WHAT[flag]} {path} ({flag}) {fault}"
    assert error["code"] == "input_file"


def test_a_setup_file_is_read_as_utf8_text(tmp_path: Path) -> None:
    (tmp_path / "setup.sh").write_bytes(b"echo \xff\n")
    result = run_bounded(["doctor", "--setup-file", "setup.sh", "--", "true"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.startswith(
        "dtrain: setup file setup.sh (--setup-file) is not UTF-8 text (invalid start byte)\n"
    )


def test_an_ssh_config_that_includes_a_fifo_is_named_once_ssh_g_waits_on_it(
    tmp_path: Path,
) -> None:
    """dtrain reads no Include itself: `ssh -G` hangs on the FIFO until its timeout, and
    then the file is named (not "a Match exec that hangs?")."""
    os.mkfifo(tmp_path / "cluster.conf")  # nothing ever writes to it
    (tmp_path / "ssh_config").write_text(f"Include {tmp_path / 'cluster.conf'}\n")
    (tmp_path / "hosts").write_text("node1\n")
    args = ["launch", "--dry-run", "-n", "1", "-H", "hosts", "--ssh-config", "ssh_config"]
    result = run_bounded([*args, "--", "true"], tmp_path)
    assert result.returncode == 2, result.stderr
    assert result.stderr.splitlines()[0] == (
        f"dtrain: ssh config {tmp_path / 'cluster.conf'} is a FIFO, not a regular file: "
        "`ssh -G` waits on it forever"
    )


@pytest.mark.parametrize("kind", ["device", "fifo", "huge"])
@pytest.mark.parametrize("setting", ["IdentityFile", "CertificateFile", "UserKnownHostsFile"])
def test_an_ssh_file_the_config_names_is_checked_before_paramiko_reads_it(
    tmp_path: Path, setting: str, kind: str
) -> None:
    """Keys and known_hosts come from the ssh config, not a flag: the same guard, naming the
    setting and the host. Nothing listens on loopback's port 9: no connection is made."""
    path, fault = bad_input(tmp_path, kind)
    if setting == "UserKnownHostsFile":  # a site's known_hosts may list many hosts
        fault = fault.replace("16 MiB", "256 MiB")
    config = tmp_path / "ssh_config"
    config.write_text(f"Host node1\n  HostName 127.0.0.1\n  Port 9\n  {setting} {path}\n")
    (tmp_path / "hosts").write_text("node1\n")
    args = ["launch", "-n", "1", "-s", "0", "-H", "hosts", "--ssh-config", str(config)]
    result = run_bounded([*args, "--no-preflight", "--", "true"], tmp_path)
    assert result.returncode == 2, result.stderr
    first = result.stderr.splitlines()[0]
    assert first == f"dtrain: ssh file {path} ({setting} for host node1) {fault}", first
