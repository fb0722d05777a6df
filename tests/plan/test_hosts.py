from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtrain.errors import ExitCode, HostsFileError
from dtrain.plan.hosts import Host, check_same_targets, format_hosts, is_loopback, parse_hosts


def parse(text: str) -> tuple[Host, ...]:
    return parse_hosts(text, "hosts")


@pytest.mark.parametrize(
    ("line", "expected"),
    [
        ("node1", Host("node1")),
        ("node1:2222", Host("node1", port=2222)),
        ("alice@node1", Host("node1", user="alice")),
        ("alice@node1:2222", Host("node1", port=2222, user="alice")),
        ("198.18.0.11", Host("198.18.0.11")),
        ("198.18.0.11:22", Host("198.18.0.11", port=22)),
        ("[fd00::7]:2200", Host("fd00::7", port=2200)),
        ("[fd00::7]", Host("fd00::7")),
        ("fd00::7", Host("fd00::7")),
        ("bob@[fd00::7]:22 slots=2", Host("fd00::7", port=22, user="bob", slots=2)),
        ("gpu-node_01.cluster slots=8", Host("gpu-node_01.cluster", slots=8)),
        ("  node1   slots=3  # comment", Host("node1", slots=3)),
        ("my_alias", Host("my_alias")),
    ],
)
def test_parses_every_documented_form(line: str, expected: Host) -> None:
    assert parse(line) == (expected,)


def test_dmlc_tracker_hosts_file_parses() -> None:
    # launch.py's format: one host or host:port per line, nothing else.
    text = "172-31-0-1\n172-31-0-2:22\nworker3\n"
    assert [h.name for h in parse(text)] == ["172-31-0-1", "172-31-0-2", "worker3"]


def test_comments_and_blank_lines_are_skipped_and_lines_keep_their_numbers() -> None:
    hosts = parse("# cluster\n\nnode1\n   \n# gpu\nnode2 slots=2 # two GPUs\n")
    assert [(h.name, h.slot_count) for h in hosts] == [("node1", 1), ("node2", 2)]
    assert [str(h.origin) for h in hosts] == ["hosts:3", "hosts:6"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("node1\nnode3:22x\n", 'hosts:2: "22x" is not a valid port (expected 1-65535)'),
        ("node1:0", 'hosts:1: "0" is not a valid port (expected 1-65535)'),
        ("node1:70000", 'hosts:1: "70000" is not a valid port (expected 1-65535)'),
        ("node1 slots=0", 'hosts:1: "0" is not a valid slots (expected 1-4096)'),
        ("node1 slots=two", 'hosts:1: "two" is not a valid slots (expected 1-4096)'),
        ("node1 slot=2", 'hosts:1: unknown option "slot=2" (the only option is slots=N)'),
        ("node1 gpus", 'hosts:1: unknown option "gpus" (the only option is slots=N)'),
        ("node1 slots=1 slots=2", "hosts:1: slots given twice"),
        ("-oProxyCommand=x", 'hosts:1: "-oProxyCommand=x" is not a valid host name or address'),
        ("node;rm", 'hosts:1: "node;rm" is not a valid host name or address'),
        ("a b@c", 'hosts:1: unknown option "b@c" (the only option is slots=N)'),
        ("@node1", 'hosts:1: "" is not a valid user name'),
        ("[fd00::7", 'hosts:1: "[fd00::7" has no closing "]"'),
        ("[nothex::]:22", 'hosts:1: "nothex::" is not a valid IPv6 address'),
        ("[fd00::7]x", 'hosts:1: unexpected "x" after "]"'),
        ("node1\n\nnode1\n", 'hosts:3: duplicate host "node1" (first listed on line 1)'),
        ("NODE1\nnode1\n", 'hosts:2: duplicate host "node1" (first listed on line 1)'),
        ("::1:22", 'hosts:1: "::1:22" is ambiguous: the address ::1:22, or ::1 port 22?'),
        (
            "fd00::7:2200",
            'hosts:1: "fd00::7:2200" is ambiguous: the address fd00::7:2200, or fd00::7 port 2200?',
        ),
        (
            "\ufefflocalhost\n",
            'hosts:1: "\\ufefflocalhost" is not a valid host name or address: '
            "the hosts file has a byte-order mark",
        ),
        (
            "node1\nnode\x002\n",
            'hosts:2: "node\\x002" is not a valid host name or address: the hosts file has a '
            "NUL byte",
        ),
        ("node\x07", 'hosts:1: "node\\x07" is not a valid host name or address'),
        ("# only comments\n\n", "hosts: no hosts in this file (only blank lines or comments)"),
    ],
)
def test_bad_lines_name_file_and_line(text: str, message: str) -> None:
    with pytest.raises(HostsFileError) as caught:
        parse(text)
    rendered = str(caught.value)
    assert rendered.splitlines()[0] == message
    assert "hint:" in rendered
    assert caught.value.exit_code == ExitCode.USAGE


def test_same_host_on_two_ports_is_two_hosts() -> None:
    assert len(parse("node1:22\nnode1:2222\n")) == 2


@pytest.mark.parametrize(
    ("text", "keys", "displays"),
    [
        ("a\nb:2222\n", ["a", "b:2222"], ["a", "b"]),
        (
            "127.0.0.1:2201\n127.0.0.1:2202\n",
            ["127.0.0.1:2201", "127.0.0.1:2202"],
            ["127.0.0.1:2201", "127.0.0.1:2202"],
        ),
        ("Node1\nnode1:2222\n", ["node1", "node1:2222"], ["Node1", "node1:2222"]),
        (
            "[fd00::7]:22\n[fd00::7]:23\n",
            ["[fd00::7]:22", "[fd00::7]:23"],
            ["[fd00::7]:22", "[fd00::7]:23"],
        ),
    ],
)
def test_a_host_is_known_by_name_and_port_and_shows_its_port_only_where_names_collide(
    text: str, keys: list[str], displays: list[str]
) -> None:
    hosts = parse(text)
    assert [h.key for h in hosts] == keys
    assert [h.display for h in hosts] == displays


@pytest.mark.parametrize(
    ("text", "targets", "message"),
    [
        (
            "node1\nnode1:22\n",
            [("198.18.9.1", 22, "root"), ("198.18.9.1", 22, "root")],
            'hosts:2: duplicate host: "node1:22" and "node1" on line 1 '
            "both reach root@198.18.9.1:22",
        ),
        (
            "gpu-a\n# alias\n198.18.9.7\n",
            [("198.18.9.7", 22, "me"), ("198.18.9.7", 22, "me")],
            'hosts:3: duplicate host: "198.18.9.7" and "gpu-a" on line 1 '
            "both reach me@198.18.9.7:22",
        ),
    ],
)
def test_lines_that_ssh_resolves_to_one_target_are_one_duplicate(
    text: str, targets: list[tuple[str, int, str]], message: str
) -> None:
    with pytest.raises(HostsFileError) as caught:
        check_same_targets(parse(text), targets)
    assert str(caught.value).splitlines()[0] == message
    assert caught.value.exit_code == ExitCode.USAGE


def test_same_machine_on_other_ports_or_as_other_users_is_not_a_duplicate() -> None:
    hosts = parse("node1\nnode1:2222\nbob@h2\n")
    check_same_targets(hosts, [("n", 22, "me"), ("n", 2222, "me"), ("n", 22, "bob")])


@pytest.mark.parametrize(
    ("address", "loopback"),
    [
        ("127.0.0.1", True),
        ("127.0.1.1", True),
        ("::1", True),
        ("::ffff:127.0.0.1", True),
        ("::ffff:198.18.9.1", False),
        ("198.18.9.1", False),
        ("localhost", False),
    ],
)
def test_loopback_addresses_include_ipv4_mapped_ones(address: str, loopback: bool) -> None:
    assert is_loopback(address) is loopback


names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,20}", fullmatch=True)
users = st.none() | st.from_regex(r"[a-z_][a-z0-9_-]{0,8}", fullmatch=True)
ports = st.none() | st.integers(1, 65535)
slots = st.none() | st.integers(1, 4096)
ipv6 = st.ip_addresses(v=6).map(str)


@st.composite
def host_lists(draw: st.DrawFn) -> list[Host]:
    count = draw(st.integers(1, 6))
    hosts: list[Host] = []
    seen: set[tuple[str, int | None]] = set()
    for _ in range(count):
        name = draw(names | ipv6)
        port = draw(ports)
        if (name.lower(), port) in seen:
            continue
        seen.add((name.lower(), port))
        hosts.append(Host(name, port=port, user=draw(users), slots=draw(slots)))
    return hosts


@given(host_lists())
def test_format_then_parse_round_trips(hosts: list[Host]) -> None:
    assert list(parse(format_hosts(hosts))) == hosts


@given(st.text(max_size=200))
def test_any_text_parses_or_fails_with_a_located_message(text: str) -> None:
    try:
        hosts = parse(text)
    except HostsFileError as exc:
        assert str(exc).startswith("hosts")
        assert exc.exit_code == ExitCode.USAGE
    else:
        assert hosts
        for host in hosts:
            assert host.name and not host.name.startswith("-")
            assert " " not in host.name


def test_the_documented_example_file_parses() -> None:
    from pathlib import Path

    path = Path(__file__).resolve().parents[2] / "hosts.example"
    hosts = parse_hosts(path.read_text(), str(path))
    assert [h.name for h in hosts] == ["node1", "node2", "node3", "fd00::7", "gpu-box"]
