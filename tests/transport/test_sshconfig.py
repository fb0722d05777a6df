"""`ssh -G` read the way dtrain reads it: parse, tokens, what dtrain refuses; and the
ProxyCommand process's lifetime (a local process, no network)."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from dtrain.errors import ExitCode, UsageError
from dtrain.plan.hosts import Host
from dtrain.transport import sshconfig
from dtrain.transport.options import SshOptions
from dtrain.transport.proxy import ProxySocket
from dtrain.transport.ssh import SshTransport
from tests.conftest import run_dtrain, start_dtrain

LOCAL = sshconfig.Local(user="me", home="/home/me", hostname="laptop.lan", uid=1000)
needs_openssh = pytest.mark.skipif(shutil.which("ssh") is None, reason="no OpenSSH client")


def test_parse_keeps_every_value_of_a_repeated_keyword() -> None:
    text = "host n1\nhostname 198.18.0.11\nidentityfile ~/a\nidentityfile ~/b\nport 2222\n"
    found = sshconfig.parse_ssh_g(text)
    assert found["identityfile"] == ("~/a", "~/b")
    assert found["hostname"] == ("198.18.0.11",)
    assert sshconfig.one(found, "port", "22") == "2222"


def test_tokens_expand_as_openssh_defines_them() -> None:
    settings = {"hostname": ("198.18.0.11",), "port": ("2222",), "user": ("bob",)}
    text = "ssh -W %h:%p -l %r %n %u %d %L %i %%"
    got = sshconfig.expand_tokens(text, settings, "n1", LOCAL)
    assert got == "ssh -W 198.18.0.11:2222 -l bob n1 me /home/me laptop 1000 %"
    assert sshconfig.expand_tokens("~/.ssh/id_%h", settings, "n1", LOCAL) == (
        "/home/me/.ssh/id_198.18.0.11"
    )
    assert len(sshconfig.expand_tokens("%C", settings, "n1", LOCAL)) == 40


@pytest.mark.parametrize(
    ("text", "keyword"),
    [
        ("pkcs11provider /usr/lib/opensc-pkcs11.so\n", "PKCS11Provider"),
        ("pubkeyauthentication no\ngssapiauthentication yes\n", "GSSAPIAuthentication"),
        ("pubkeyauthentication no\n", "PubkeyAuthentication"),
        ("controlpath ~/.ssh/cm-%C\ncontrolmaster false\n", "ControlPath"),
        ("proxyusefdpass yes\n", "ProxyUseFdpass"),
    ],
)
def test_settings_dtrain_cannot_honour_are_named(text: str, keyword: str) -> None:
    refused = sshconfig.refused_settings(sshconfig.parse_ssh_g(text))
    assert [r[0] for r in refused][:1] == [keyword]


def test_ordinary_settings_are_not_refused() -> None:
    text = (
        "pubkeyauthentication true\ngssapiauthentication no\ncontrolmaster auto\n"
        "controlpath ~/.ssh/cm-%C\nidentityagent none\nproxyusefdpass no\n"
        "identityagent ~/.1password/agent.sock\n"
    )
    assert sshconfig.refused_settings(sshconfig.parse_ssh_g(text)) == []


@needs_openssh
def test_an_unhonourable_setting_names_file_line_and_host(tmp_path: Path) -> None:
    config = tmp_path / "cfg"
    config.write_text("Host n*\n  HostName 198.18.0.11\n  PKCS11Provider /usr/lib/p11.so\n")
    transport = SshTransport(SshOptions(config_file=str(config), user_config_dir=str(tmp_path)))
    with pytest.raises(UsageError) as caught:
        transport.target(Host(name="n1"))
    assert f"{config}:3 sets PKCS11Provider /usr/lib/p11.so for host n1" in str(caught.value)
    assert caught.value.exit_code == ExitCode.USAGE


@needs_openssh
def test_launch_with_an_unhonourable_setting_exits_2_before_connecting(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("n1\n")
    (tmp_path / "cfg").write_text("Host n1\n  HostName 198.18.0.11\n  PubkeyAuthentication no\n")
    args = ["launch", "-n", "1", "-H", "hosts", "--ssh-config", "cfg", "--", "true"]
    result = run_dtrain(args, tmp_path, timeout_s=30)
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert result.stderr.startswith("dtrain: ssh config cfg:3 sets PubkeyAuthentication no")
    assert "for host n1" in result.stderr and "Traceback" not in result.stderr


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat") as stat:
            return stat.read().split(")")[-1].split()[0] != "Z"
    except FileNotFoundError:
        return False


def _wait_gone(pid: int, timeout_s: float = 5.0) -> bool:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if not _alive(pid):
            return True
        time.sleep(0.05)
    return False


def test_a_proxycommand_carries_bytes_and_ends_with_close() -> None:
    proxy = ProxySocket("cat")
    proxy.settimeout(5)
    proxy.sendall(b"SSH-2.0-x\r\n")
    assert proxy.recv(100) == b"SSH-2.0-x\r\n"
    pid = proxy.pid
    proxy.close()
    assert _wait_gone(pid)


def test_a_proxycommand_dies_when_dtrain_is_sigkilled(tmp_path: Path) -> None:
    """A launcher stand-in that opens a ProxyCommand ignoring stdin EOF, then is SIGKILLed."""
    pid_file = tmp_path / "pid"
    code = (
        "import sys, time\n"
        "from dtrain.transport.proxy import ProxySocket\n"
        f"p = ProxySocket('sh -c \"trap : HUP; echo $$ > {pid_file}; exec sleep 60\"')\n"
        "print('up', flush=True)\n"
        "time.sleep(60)\n"
    )
    env = {**os.environ, "PYTHONPATH": str(Path(__file__).resolve().parents[2])}
    launcher = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, env=env)
    try:
        assert launcher.stdout is not None and launcher.stdout.readline() == b"up\n"
        deadline = time.monotonic() + 5
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline
            time.sleep(0.05)
        proxy_pid = int(pid_file.read_text())
        assert _alive(proxy_pid)
        launcher.send_signal(signal.SIGKILL)
        launcher.wait(timeout=5)
        assert _wait_gone(proxy_pid), "the ProxyCommand outlived a SIGKILLed launcher"
    finally:
        if launcher.poll() is None:
            launcher.kill()
            launcher.wait()


@needs_openssh
def test_ctrl_c_while_ssh_g_waits_on_a_match_exec_leaves_nothing_running(tmp_path: Path) -> None:
    """`ssh -G` runs a Match exec that hangs: Ctrl-C ends dtrain with 130 at once, and that
    command with it (it used to run on, and with it `ssh -G`, until it ended by itself)."""
    pid_file = tmp_path / "exec.pid"
    config = tmp_path / "ssh_config"
    config.write_text(
        f'Match exec "echo $$ > {pid_file}; exec sleep 60"\n  User x\n'
        "Host gpu9\n  HostName 127.0.0.9\n"
    )
    (tmp_path / "hosts").write_text("gpu9\n")
    args = ["launch", "-n", "1", "-H", "hosts", "--ssh-config", str(config), "--", "true"]
    proc = start_dtrain(args, tmp_path)
    pid = None
    try:
        deadline = time.monotonic() + 30
        while not pid_file.exists() or not pid_file.read_text().strip():
            assert time.monotonic() < deadline, "the Match exec did not start"
            time.sleep(0.05)
        pid = int(pid_file.read_text())
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=15)
        assert proc.returncode == 130, stderr
        assert _wait_gone(pid), "the Match exec's command outlived dtrain"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pid is not None and _alive(pid):
            os.kill(pid, signal.SIGKILL)
