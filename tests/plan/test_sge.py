"""Grid Engine's job variables and PE_HOSTFILE, and the qrsh -inherit command (pure)."""

from __future__ import annotations

import shlex

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtrain.errors import UsageError
from dtrain.plan import sge
from dtrain.plan.hosts import Host, Origin

JOB = {"JOB_ID": "17", "SGE_ROOT": "/opt/sge", "PE": "mpi", "PE_HOSTFILE": "/spool/pe_hostfile"}


def test_the_hostfile_gives_hosts_in_its_order_with_their_slots_and_lines() -> None:
    text = "node3 2 all.q@node3 UNDEFINED\nnode1 1 all.q@node1 UNDEFINED\n"

    job = sge.job_from(JOB, text)

    assert job.job_id == "17" and job.pe == "mpi"
    assert job.hosts == (Host("node3", slots=2), Host("node1", slots=1))
    assert [h.origin for h in job.hosts] == [
        Origin("/spool/pe_hostfile", 1),
        Origin("/spool/pe_hostfile", 2),
    ]
    assert job.summary() == "2 hosts node3, node1 (PE mpi, 3 slots)"


def test_a_host_granted_slots_in_two_queues_is_one_host_with_their_sum() -> None:
    text = "a 2 all.q@a UNDEFINED\nb 1 all.q@b UNDEFINED\nA 3 gpu.q@a 0-3\n\n"

    hosts = sge.parse_hostfile(text, "f")

    assert hosts == (Host("a", slots=5), Host("b", slots=1))
    assert hosts[0].origin == Origin("f", 1)


@pytest.mark.parametrize(
    ("text", "why"),
    [
        ("node1 2\n", 'f:1: "node1 2" is not "host slots queue processors"'),
        ("ok 1 q@ok U\nnode1 x all.q@node1 U\n", 'f:2: "x" is not a slot count'),
        ("node1 0 all.q@node1 U\n", 'f:1: "0" is not a slot count'),
        ("-x 1 q U\n", 'f:1: "-x" is not a host name'),
        ("", "f names no host"),
        ("\n  \n", "f names no host"),
    ],
)
def test_a_hostfile_that_cannot_be_read_is_one_error_naming_file_and_line(
    text: str, why: str
) -> None:
    with pytest.raises(UsageError) as caught:
        sge.parse_hostfile(text, "f")
    assert why in str(caught.value)


@pytest.mark.parametrize(
    ("env", "inside"),
    [
        (JOB, True),
        ({"JOB_ID": "3", "SGE_ROOT": "/x"}, True),  # a job without -pe: said at hostfile_path
        ({"SGE_ROOT": "/x"}, False),  # a login node's shell
        ({"JOB_ID": "3"}, False),  # another tool's JOB_ID
        ({"JOB_ID": "", "SGE_ROOT": "/x"}, False),
        ({}, False),
    ],
)
def test_inside_a_job_needs_both_its_id_and_the_cells_root(
    env: dict[str, str], inside: bool
) -> None:
    assert sge.in_job(env) is inside


def test_a_job_without_a_parallel_environment_says_how_to_submit_one() -> None:
    with pytest.raises(UsageError) as caught:
        sge.hostfile_path({"JOB_ID": "9", "SGE_ROOT": "/x"})
    assert "inside Grid Engine job 9, which has no parallel environment" in str(caught.value)
    assert "qsub -pe NAME SLOTS" in str(caught.value)


def test_qrsh_inherit_gets_the_command_as_one_quoted_word_and_no_stdin() -> None:
    argv = sge.inherit_argv("node2", ["sh", "-c", 'echo "$0"', "a b'c\nd"])

    assert argv[:5] == ["qrsh", "-inherit", "-nostdin", "-V", "node2"]
    assert len(argv) == 6
    assert shlex.split(argv[5]) == ["sh", "-c", 'echo "$0"', "a b'c\nd"]


host_names = st.from_regex(r"[A-Za-z0-9_][A-Za-z0-9_.-]{0,12}", fullmatch=True)


@given(st.lists(st.tuples(host_names, st.integers(1, 64)), min_size=1, max_size=12))
def test_any_hostfile_keeps_first_appearance_order_and_sums_slots(
    lines: list[tuple[str, int]],
) -> None:
    text = "".join(f"{name} {n} all.q@{name} UNDEFINED\n" for name, n in lines)

    hosts = sge.parse_hostfile(text, "f")

    expected: dict[str, int] = {}
    for name, n in lines:
        expected[name.lower()] = expected.get(name.lower(), 0) + n
    assert [h.name.lower() for h in hosts] == list(expected)
    assert [h.slots for h in hosts] == list(expected.values())


@given(st.text(max_size=200))
def test_any_text_is_hosts_or_one_usage_error(text: str) -> None:
    try:
        hosts = sge.parse_hostfile(text, "f")
    except UsageError as exc:
        assert "\n" not in exc.what
    else:
        assert hosts and all(h.slots is not None and h.slots >= 1 for h in hosts)


@given(st.lists(st.text(max_size=20), min_size=1, max_size=6))
def test_any_command_survives_qrsh_joining_it_for_the_shell(command: list[str]) -> None:
    argv = sge.inherit_argv("h", command)
    assert shlex.split(argv[-1]) == command


@pytest.mark.parametrize(
    ("hostname", "names", "found"),
    [
        ("node1", ["node2", "node1"], "node1"),
        ("NODE1", ["node1"], "node1"),
        ("node1", ["node1.cluster", "node2.cluster"], "node1.cluster"),
        ("node1.cluster", ["node1"], "node1"),
        ("login", ["node1", "node2"], None),
        ("node1", ["node10"], None),
    ],
)
def test_this_machine_is_the_job_host_with_its_name_or_first_label(
    hostname: str, names: list[str], found: str | None
) -> None:
    assert sge.local_name(hostname, names) == found
