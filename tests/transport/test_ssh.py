"""How dtrain reads OpenSSH client config, and how it refuses a broken one before connecting.

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
from dtrain.plan.hosts import Host, local_host
from dtrain.transport.options import DEFAULT_CONNECT_TIMEOUT_S, SshOptions
from dtrain.transport.ssh import (
    SshTarget,
    SshTransport,
    jump_chain,
    split_jump_hop,
)
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


def transport_for(
    tmp_path: Path, text: str, timeout_s: float | None = None, use_openssh: bool = False
) -> SshTransport:
    """A transport over `text`; by default dtrain's own reading of it (no OpenSSH client)."""
    config = tmp_path / "ssh_config"
    config.write_text(text)
    options = SshOptions(
        config_file=str(config),
        connect_timeout_s=timeout_s,
        user_config_dir=str(tmp_path),
        use_openssh=use_openssh,
    )
    return SshTransport(options)


def test_every_supported_setting_is_read_for_a_matching_alias(tmp_path: Path) -> None:
    target = transport_for(tmp_path, CONFIG).target(Host(name="node1"))
    assert (target.hostname, target.port, target.user) == ("127.0.0.9", 2222, "trainer")
    assert target.identity_files == (str(Path("~/keys/id_node").expanduser()),)
    assert target.identities_only is True
    assert target.known_hosts_files == ("/etc/cluster/known_hosts", "/etc/ssh/ssh_known_hosts")
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
    assert target.known_hosts_files[0] == str(tmp_path / "known_hosts")


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("Port abc", 'sets Port "abc" for host node1, which is not a port (1-65535)'),
        ("Port 70000", 'sets Port "70000" for host node1, which is not a port (1-65535)'),
        ("Port 0", 'sets Port "0" for host node1, which is not a port (1-65535)'),
        ("ConnectTimeout soon", "which is not a positive number of seconds"),
        ("ProxyJump gate:ssh", 'sets ProxyJump "gate:ssh" for host node1: "ssh" is not a port'),
    ],
)
def test_a_bad_value_names_the_file_the_host_and_the_value(
    tmp_path: Path, line: str, message: str
) -> None:
    transport = transport_for(tmp_path, f"Host node1\n  {line}\n")
    with pytest.raises(UsageError) as caught:
        transport.target(Host(name="node1"))
    assert message in str(caught.value)
    assert str(tmp_path / "ssh_config") in str(caught.value)
    assert caught.value.exit_code == ExitCode.USAGE


def test_an_unparsable_line_names_the_file(tmp_path: Path) -> None:
    with pytest.raises(UsageError, match=r"ssh_config: Unparsable line Port"):
        transport_for(tmp_path, "Host node1\n  HostName 127.0.0.2\n  Port\n")


def test_the_default_configs_are_named_one_by_one(tmp_path: Path) -> None:
    (tmp_path / "config").write_text("Host *\n  User\n")
    with pytest.raises(UsageError, match=rf"ssh config {tmp_path}/config: Unparsable line User"):
        SshTransport(SshOptions(user_config_dir=str(tmp_path), use_openssh=False))


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
    # OpenSSH's own words (`ssh -G`), or dtrain's reading of the file without an OpenSSH client
    assert first.startswith("dtrain: ") and "127.0.0.2" in first and "cfg" in first, first
    assert "99999" in first
    assert "Traceback" not in result.stderr
    assert result.stdout == ""


@pytest.mark.parametrize(
    ("hop", "parts"),
    [
        ("bastion", ("", "bastion", "")),
        ("gate@bastion:2200", ("gate", "bastion", "2200")),
        ("[fd00::1]:2200", ("", "fd00::1", "2200")),
        ("me@[fd00::1]", ("me", "fd00::1", "")),
    ],
)
def test_proxy_jump_hops_split_like_openssh(hop: str, parts: tuple[str, str, str]) -> None:
    assert split_jump_hop(hop) == parts


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
        ("Host node1\n  ProxyJump node1\n", "node1 -> node1"),
        ("Host node1\n  ProxyJump gate\nHost gate\n  ProxyJump node1\n", "node1 -> gate -> node1"),
        (
            "Host node1\n  ProxyJump a\nHost a\n  ProxyJump b\nHost b\n  ProxyJump a\n",
            "node1 -> a -> b -> a",
        ),
        ("Host *\n  ProxyJump bastion\n", "node1 -> bastion -> bastion"),
        ("Host node1\n  ProxyJump a,b,a\n", "node1 -> a -> b -> a"),
    ],
)
def test_a_proxyjump_loop_is_an_error_naming_the_chain(
    tmp_path: Path, config: str, path: str
) -> None:
    transport = transport_for(tmp_path, config)
    with pytest.raises(UsageError) as caught:
        transport.target(Host(name="node1"))
    assert f"ProxyJump loops: {path} (each reached through the next)" in str(caught.value)
    assert caught.value.exit_code == ExitCode.USAGE


@pytest.mark.parametrize(
    ("config", "chain"),
    [
        ("Host node1\n  ProxyJump gate\n", ["gate"]),
        ("Host node1\n  ProxyJump a,b\nHost a\n  ProxyJump c\n", ["b", "a", "c"]),
        ("Host node1\n  ProxyJump a,b\nHost b\n  ProxyJump node1\n", ["b", "a"]),  # b's own unused
        ("Host * !bastion\n  ProxyJump bastion\n", ["bastion"]),
        ("Host node1\n  ProxyJump none\n", []),
        ("Host node1\n  ProxyJump gate,node1:2222\n", ["node1", "gate"]),  # another sshd
    ],
)
def test_the_jump_chain_follows_openssh(tmp_path: Path, config: str, chain: list[str]) -> None:
    transport = transport_for(tmp_path, config)
    assert jump_chain("node1", transport.config, transport.options) == chain


@pytest.mark.parametrize(
    ("jump", "problem"),
    [
        ("[::1", '"[::1" lacks the "]" that closes its address'),
        ("me@[fd00::1:2200", '"me@[fd00::1:2200" lacks the "]" that closes its address'),
        ("gate,,b", '"" names no host'),
        ("[::1]:x", '"x" is not a port'),
    ],
)
def test_a_malformed_proxyjump_hop_says_what_is_wrong(
    tmp_path: Path, jump: str, problem: str
) -> None:
    transport = transport_for(tmp_path, f"Host node1\n  ProxyJump {jump}\n")
    with pytest.raises(UsageError) as caught:
        transport.target(Host(name="node1"))
    assert f'sets ProxyJump "{jump}" for host node1: {problem}' in str(caught.value)


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


def test_without_openssh_an_include_is_refused_not_ignored(tmp_path: Path) -> None:
    transport = transport_for(tmp_path, "Include ~/.ssh/config.d/*\nHost n1\n  User u\n")
    with pytest.raises(UsageError, match=r"sets include ~/.ssh/config.d/\* for host n1"):
        transport.target(Host(name="n1"))


def test_without_openssh_a_proxycommand_is_honoured_with_tokens(tmp_path: Path) -> None:
    text = "Host n1\n  HostName 198.18.0.11\n  ProxyCommand ssh -W %h:%p gate\n"
    target = transport_for(tmp_path, text).target(Host(name="n1"))
    assert target.proxy_command == "ssh -W 198.18.0.11:22 gate"


def test_with_openssh_tokens_and_include_resolve_as_ssh_does(tmp_path: Path) -> None:
    (tmp_path / "d").mkdir()
    (tmp_path / "d" / "x.conf").write_text("Host n1\n  HostName 198.18.0.11\n  User bob\n")
    text = f"Include {tmp_path}/d/*\nHost n*\n  ProxyCommand ssh -W %h:%p -l %r gate\n"
    target = transport_for(tmp_path, text, use_openssh=True).target(Host(name="n1"))
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


def group_over(tmp_path: Path, text: str, use_openssh: bool = True) -> AgentGroup:
    """An agent group whose ssh config is `text` (OpenSSH resolves it, by default)."""
    config = tmp_path / "ssh_config"
    config.write_text(text)
    return AgentGroup(SshOptions(config_file=str(config), use_openssh=use_openssh))


def test_ssh_g_started_ahead_is_what_the_transport_uses(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = logged_ssh(tmp_path, monkeypatch)
    group = group_over(tmp_path, "Host n*\n  HostName 198.18.0.11\n  User bob\n")
    hosts = [Host(name="n1"), Host(name="n2", port=2200), Host(name="n1")]
    group.resolve_ahead(hosts)
    targets = group.ssh.distinct_targets(hosts[:2])
    assert [(t.hostname, t.port, t.user) for t in targets] == [
        ("198.18.0.11", 22, "bob"),
        ("198.18.0.11", 2200, "bob"),
    ]
    assert group.ssh.target(Host(name="n3")).hostname == "198.18.0.11"  # not asked ahead
    asked = log.read_text().splitlines()
    assert sorted(line.split()[-1] for line in asked) == ["n1", "n2", "n3"]  # once per host
    assert asked[-1].endswith(" n3")  # n1 and n2 came first, in parallel
    assert all(line.startswith("-G ") for line in asked)


def test_a_config_openssh_refuses_fails_the_same_when_resolved_ahead(tmp_path: Path) -> None:
    group = group_over(tmp_path, "Host n1\n  NoSuchKeyword yes\n")
    group.resolve_ahead([Host(name="n1")])
    with pytest.raises(UsageError, match="OpenSSH refuses the ssh config for host n1"):
        group.ssh.distinct_targets([Host(name="n1")])


def test_nothing_is_resolved_ahead_for_local_hosts_or_without_openssh(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    log = logged_ssh(tmp_path, monkeypatch)
    text = "Host n1\n  HostName 198.18.0.11\n"
    group_over(tmp_path, text).resolve_ahead([local_host("localhost")])
    group_over(tmp_path, text, use_openssh=False).resolve_ahead([Host(name="n1")])
    for thread in threading.enumerate():  # an `ssh -G` started ahead would have logged by then
        if thread.name.startswith("dtrain-ssh-G"):
            thread.join(timeout=10)
    assert not log.exists()


@pytest.mark.parametrize("use_openssh", [False, True])
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
    tmp_path: Path, use_openssh: bool, lines: str, limit: float | None
) -> None:
    text = f"Host n1\n  HostName 198.18.0.11\n{lines}"
    target = transport_for(tmp_path, text, use_openssh=use_openssh).target(Host(name="n1"))
    assert target.silence_limit_s == limit


@pytest.mark.parametrize("use_openssh", [False, True])
@pytest.mark.parametrize(
    ("value", "word"),
    [("yes", "yes"), ("no", "no"), ("off", "no"), ("accept-new", "accept-new"), ("ask", "ask")],
)
def test_strict_host_key_checking_reads_the_same_with_or_without_openssh(
    tmp_path: Path, use_openssh: bool, value: str, word: str
) -> None:
    text = f"Host n1\n  HostName 198.18.0.11\n  StrictHostKeyChecking {value}\n"
    target = transport_for(tmp_path, text, use_openssh=use_openssh).target(Host(name="n1"))
    assert target.strict_host_keys == word
