"""How dtrain reads OpenSSH client config (`ssh -G`), and how it refuses a broken one, or a
machine without an OpenSSH client, before connecting.

No network: every case here resolves settings or fails before the first connection. Reaching
hosts through these settings is tested on the cluster (tests/cluster/test_launch_ssh.py).
"""

from __future__ import annotations

import os
import shutil
import threading
import time
from pathlib import Path

import pytest

from dtrain.agents.group import AgentGroup
from dtrain.errors import ExitCode, UsageError
from dtrain.plan.hosts import Host
from dtrain.transport.options import DEFAULT_CONNECT_TIMEOUT_S, SshOptions
from dtrain.transport.ssh import SshTransport
from dtrain.transport.sshtarget import SshTarget
from tests.conftest import run_dtrain

CONFIG = """\
Host node*
  HostName 127.0.0.9
  User trainer
  Port 2222
  IdentityFile ~/keys/id_node
  IdentitiesOnly yes
  UserKnownHostsFile /etc/cluster/known_hosts
  StrictHostKeyChecking accept-new
  ConnectTimeout 3
  ProxyJump gate@bastion:2200
"""


def transport_for(tmp_path: Path, text: str, timeout_s: float | None = None) -> SshTransport:
    """A transport over `text`, as `ssh -F` reads it."""
    config = tmp_path / "ssh_config"
    config.write_text(text)
    options = SshOptions(
        config_file=str(config), connect_timeout_s=timeout_s, user_config_dir=str(tmp_path)
    )
    return SshTransport(options)


def test_every_supported_setting_is_read_for_a_matching_alias(tmp_path: Path) -> None:
    target = transport_for(tmp_path, CONFIG).target(Host(name="node1"))
    assert (target.hostname, target.port, target.user) == ("127.0.0.9", 2222, "trainer")
    assert target.identity_files == (str(Path("~/keys/id_node").expanduser()),)
    assert target.identities_only is True
    assert target.known_hosts_files == (
        "/etc/cluster/known_hosts",
        "/etc/ssh/ssh_known_hosts",
        "/etc/ssh/ssh_known_hosts2",
    )
    assert target.strict_host_keys == "accept-new"
    assert target.connect_timeout_s == 3.0
    assert target.proxy_jump == "gate@bastion:2200"


def test_the_hosts_file_and_the_flag_win_over_the_config(tmp_path: Path) -> None:
    transport = transport_for(tmp_path, CONFIG, timeout_s=0.5)
    target = transport.target(Host(name="node1", user="me", port=2022))
    assert (target.user, target.port, target.connect_timeout_s) == ("me", 2022, 0.5)


def test_an_unmatched_host_gets_openssh_defaults(tmp_path: Path) -> None:
    target = transport_for(tmp_path, CONFIG).target(Host(name="127.0.0.2"))
    assert (target.hostname, target.port, target.proxy_jump) == ("127.0.0.2", 22, None)
    assert target.connect_timeout_s == DEFAULT_CONNECT_TIMEOUT_S
    assert target.strict_host_keys == "ask"
    assert target.known_hosts_files[0] == str(Path("~/.ssh/known_hosts").expanduser())


@pytest.mark.parametrize(
    "line",
    [
        "Port abc",
        "Port 70000",
        "Port 0",
        "ConnectTimeout soon",
        "ProxyJump [::1",
        "ProxyJump me@[fd00::1:2200",
        "ProxyJump gate,,b",
        "ProxyJump [::1]:x",
    ],
)
def test_a_bad_value_is_refused_in_openssh_words_naming_the_file_and_host(
    tmp_path: Path, line: str
) -> None:
    transport = transport_for(tmp_path, f"Host node1\n  {line}\n")
    with pytest.raises(UsageError) as caught:
        transport.target(Host(name="node1"))
    assert "OpenSSH refuses the ssh config for host node1: " in str(caught.value)
    assert f"{tmp_path / 'ssh_config'} line 2" in str(caught.value)
    assert caught.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize("command", [["launch", "-n", "1"], ["doctor"], ["ps"], ["kill"]])
def test_every_command_refuses_a_broken_config_before_connecting(
    tmp_path: Path, command: list[str]
) -> None:
    (tmp_path / "hosts").write_text("127.0.0.2\n")
    (tmp_path / "cfg").write_text("Host 127.0.0.2\n  Port 99999\n")
    tail = ["--", "true"] if command[0] in ("launch", "doctor") else []
    args = [*command, "-H", "hosts", "--ssh-config", "cfg", *tail]
    result = run_dtrain(args, tmp_path, timeout_s=30)
    assert result.returncode == ExitCode.USAGE, result.stderr
    first = result.stderr.splitlines()[0]
    # OpenSSH's own words (`ssh -G`)
    assert first.startswith("dtrain: ") and "127.0.0.2" in first and "cfg" in first, first
    assert "99999" in first
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


class FakeClient:
    """Stands in for a connection: the sharing of jump hosts is logic, not network."""

    def __init__(self, name: str) -> None:
        self.name = name
        self.closed = False

    def close(self) -> None:
        self.closed = True


def test_hosts_behind_one_proxyjump_share_one_connection_to_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    transport = transport_for(tmp_path, "Host node*\n  ProxyJump gate@bastion:2200\n")
    opened: list[FakeClient] = []
    lock = threading.Lock()

    def fake_connect(target: SshTarget) -> FakeClient:
        if target.proxy_jump:  # a host behind the jump: reach it through the shared client
            transport._jump_client(target.proxy_jump)
            return FakeClient(target.hostname)
        time.sleep(0.05)  # the jump host: slow enough that every host asks while it connects
        client = FakeClient(target.hostname)
        with lock:
            opened.append(client)
        return client

    monkeypatch.setattr(transport, "_connect", fake_connect)
    hosts = [Host(name=f"node{i}") for i in range(8)]
    assert transport.try_connect_all(hosts) == {}
    assert [client.name for client in opened] == ["bastion"]
    transport.close()
    assert opened[0].closed


@pytest.mark.parametrize(
    ("config", "path"),
    [
        # OpenSSH finds these loops itself
        ("Host node1\n  ProxyJump node1\n", "jumphost loop via node1"),
        ("Host node1\n  ProxyJump gate\nHost gate\n  ProxyJump node1\n", "node1 -> gate -> node1"),
        (
            "Host node1\n  ProxyJump a\nHost a\n  ProxyJump b\nHost b\n  ProxyJump a\n",
            "node1 -> a -> b -> a",
        ),
        ("Host *\n  ProxyJump bastion\n", "jumphost loop via bastion"),
        ("Host node1\n  ProxyJump a,b,a\n", "node1 -> a -> b -> a"),
    ],
)
def test_a_proxyjump_loop_is_an_error_naming_the_chain(
    tmp_path: Path, config: str, path: str
) -> None:
    transport = transport_for(tmp_path, config)
    with pytest.raises(UsageError) as caught:
        transport.target(Host(name="node1"))
    ours = f"ProxyJump loops: {path} (each reached through the next)"
    loop = path if "jumphost" in path else ours
    assert loop in str(caught.value)
    assert caught.value.exit_code == ExitCode.USAGE


def test_a_proxyjump_loop_stops_launch_before_connecting(tmp_path: Path) -> None:
    (tmp_path / "hosts").write_text("127.0.0.2\n")
    (tmp_path / "cfg").write_text(
        "Host 127.0.0.2\n  ProxyJump gate\nHost gate\n  ProxyJump 127.0.0.2\n"
    )
    args = ["launch", "-n", "1", "-H", "hosts", "--ssh-config", "cfg", "--", "true"]
    result = run_dtrain(args, tmp_path, timeout_s=30)
    assert result.returncode == ExitCode.USAGE, result.stderr
    assert result.stderr.splitlines()[0] == (
        "dtrain: ssh config cfg: ProxyJump loops: 127.0.0.2 -> gate -> 127.0.0.2 "
        "(each reached through the next)"
    )
    assert "Recursion" not in result.stderr and result.stdout == ""


def test_each_hop_of_a_proxyjump_chain_is_reached_through_the_hops_before_it(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """`ProxyJump a,b` goes through a to b, whatever b's own ProxyJump says (as `ssh -J a,b`)."""
    transport = transport_for(tmp_path, "Host node1\n  ProxyJump a,b\nHost b\n  ProxyJump node1\n")
    connected: list[tuple[str, str | None]] = []

    def fake_connect(target: SshTarget) -> FakeClient:
        connected.append((target.hostname, target.proxy_jump))
        if target.proxy_jump:
            transport._jump_client(target.proxy_jump)
        return FakeClient(target.hostname)

    monkeypatch.setattr(transport, "_connect", fake_connect)
    assert transport.try_connect_all([Host(name="node1")]) == {}
    assert connected == [("node1", "a,b"), ("b", "a"), ("a", None)]
    transport.close()


def test_with_openssh_tokens_and_include_resolve_as_ssh_does(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.conf").write_text("Host n1\n  HostName 198.18.0.11\n  User bob\n")
    text = f"Include {tmp_path}/d/*\nHost n*\n  ProxyCommand ssh -W %h:%p -l %r gate\n"
    target = transport_for(tmp_path, text).target(Host(name="n1"))
    assert (target.hostname, target.user) == ("198.18.0.11", "bob")
    assert target.proxy_command == "ssh -W 198.18.0.11:22 -l bob gate"


def logged_ssh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """An `ssh` first in PATH that notes each command line, then runs OpenSSH's client."""
    real = shutil.which("ssh")
    assert real is not None, "the OpenSSH client is part of the test install"
    folder, log = tmp_path / "bin", tmp_path / "ssh.log"
    folder.mkdir()
    (folder / "ssh").write_text(f'#!/bin/sh\necho "$*" >> {log}\nexec {real} "$@"\n')
    (folder / "ssh").chmod(0o755)
    monkeypatch.setenv("PATH", f"{folder}:{os.environ['PATH']}")
    return log


def group_over(tmp_path: Path, text: str) -> AgentGroup:
    """An agent group whose ssh config is `text`."""
    config = tmp_path / "ssh_config"
    config.write_text(text)
    return AgentGroup(SshOptions(config_file=str(config)))


def test_ssh_g_is_asked_once_per_host_and_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = logged_ssh(tmp_path, monkeypatch)
    group = group_over(tmp_path, "Host n*\n  HostName 198.18.0.11\n  User bob\n")
    hosts = [Host(name="n1"), Host(name="n2", port=2200), Host(name="n1")]
    targets = group.ssh.distinct_targets(hosts[:2])
    assert [(t.hostname, t.port, t.user) for t in targets] == [
        ("198.18.0.11", 22, "bob"),
        ("198.18.0.11", 2200, "bob"),
    ]
    assert group.ssh.target(Host(name="n3")).hostname == "198.18.0.11"  # asked when needed
    asked = log.read_text().splitlines()
    assert sorted(line.split()[-1] for line in asked) == ["n1", "n2", "n3"]  # once per host
    assert asked[-1].endswith(" n3")  # n1 and n2 came first, in parallel
    assert all(line.startswith("-G ") for line in asked)


def test_a_config_openssh_refuses_is_an_error_naming_the_host(tmp_path: Path) -> None:
    group = group_over(tmp_path, "Host n1\n  NoSuchKeyword yes\n")
    with pytest.raises(UsageError, match="OpenSSH refuses the ssh config for host n1"):
        group.ssh.distinct_targets([Host(name="n1")])


@pytest.mark.parametrize(
    ("lines", "limit"),
    [
        ("", None),
        ("  ServerAliveInterval 0\n", None),  # OpenSSH's "off"
        ("  ServerAliveInterval 2\n", 6.0),  # ServerAliveCountMax defaults to 3
        ("  ServerAliveInterval 2\n  ServerAliveCountMax 2\n", 4.0),
        # OpenSSH fills in ServerAliveInterval 300 for BatchMode yes: not the user's choice
        ("  BatchMode yes\n", None),
        ("  BatchMode yes\n  ServerAliveInterval 300\n", 900.0),
        ("  BatchMode yes\n  ServerAliveInterval 2\n  ServerAliveCountMax 2\n", 4.0),
    ],
)
def test_server_alive_settings_give_the_silence_a_host_may_keep(
    tmp_path: Path, lines: str, limit: float | None
) -> None:
    text = f"Host n1\n  HostName 198.18.0.11\n{lines}"
    target = transport_for(tmp_path, text).target(Host(name="n1"))
    assert target.silence_limit_s == limit


@pytest.mark.parametrize(
    ("value", "word"),
    [("yes", "yes"), ("no", "no"), ("off", "no"), ("accept-new", "accept-new"), ("ask", "ask")],
)
def test_strict_host_key_checking_reads_as_one_word(tmp_path: Path, value: str, word: str) -> None:
    text = f"Host n1\n  HostName 198.18.0.11\n  StrictHostKeyChecking {value}\n"
    target = transport_for(tmp_path, text).target(Host(name="n1"))
    assert target.strict_host_keys == word


def path_without_ssh(tmp_path: Path) -> dict[str, str]:
    """The environment with a PATH that has every command of this one but `ssh`."""
    folder = tmp_path / "no-ssh-bin"
    folder.mkdir()
    for entry in os.environ["PATH"].split(os.pathsep):
        if not os.path.isdir(entry):
            continue
        for name in os.listdir(entry):
            if name != "ssh" and not (folder / name).exists():
                (folder / name).symlink_to(os.path.join(entry, name))
    env = dict(os.environ, PATH=str(folder))
    assert shutil.which("ssh", path=env["PATH"]) is None
    return env


@pytest.mark.parametrize("command", [["launch", "-n", "1"], ["ps"], ["kill"], ["stacks"]])
def test_without_an_openssh_client_a_command_says_so_in_one_line(
    tmp_path: Path, command: list[str]
) -> None:
    (tmp_path / "hosts").write_text("198.18.0.11\n")
    tail = ["--", "true"] if command[0] == "launch" else []
    result = run_dtrain([*command, "-H", "hosts", *tail], tmp_path, 60, path_without_ssh(tmp_path))
    assert result.returncode == ExitCode.ENVIRONMENT, result.stderr
    lines = result.stderr.splitlines()
    assert lines[0] == (
        "dtrain: no OpenSSH client (ssh) on PATH: dtrain reads each host's ssh config with `ssh -G`"
    ), result.stderr
    assert lines[1].startswith("  hint: install the OpenSSH client") and len(lines) == 2
    assert result.stdout == ""


def test_without_an_openssh_client_doctor_reports_it_per_host_and_checks_this_machine(
    tmp_path: Path,
) -> None:
    (tmp_path / "hosts").write_text("198.18.0.11\n")
    result = run_dtrain(["doctor", "-H", "hosts"], tmp_path, 120, path_without_ssh(tmp_path))
    assert result.returncode == ExitCode.ENVIRONMENT, result.stderr
    assert "198.18.0.11: no OpenSSH client (ssh) on PATH" in result.stdout + result.stderr
    assert "Traceback" not in result.stderr
