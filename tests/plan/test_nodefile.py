"""A PBS or LSF job's node file -> hosts and slots (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtrain.errors import UsageError
from dtrain.plan import nodefile
from dtrain.plan.hosts import Host, Origin
from dtrain.plan.nodefile import Job, Scheduler


@pytest.mark.parametrize(
    ("text", "expected"),
    [
        ("n1\n", [("n1", 1)]),
        ("n1\nn1\nn1\nn1\n", [("n1", 4)]),  # PBS: one line per core
        ("n2\nn2\nn1\nn1\nn3\n", [("n2", 2), ("n1", 2), ("n3", 1)]),  # first seen, not sorted
        ("n1\nn2\nn1\n", [("n1", 2), ("n2", 1)]),  # interleaved (LSF, round robin)
        ("  n1  \n\n\nn2\r\n", [("n1", 1), ("n2", 1)]),  # blanks and CRLF
        ("gpu-01.cluster.example\n" * 3, [("gpu-01.cluster.example", 3)]),
    ],
)
def test_hosts_are_de_duplicated_in_order_and_their_lines_counted_as_slots(
    text: str, expected: list[tuple[str, int]]
) -> None:
    hosts = nodefile.parse_node_file(text, "/var/spool/pbs/aux/42.pbs")
    assert [(h.name, h.slots) for h in hosts] == expected


def test_each_host_points_at_its_first_line() -> None:
    hosts = nodefile.parse_node_file("\nn2\nn1\nn2\n", "nodes")
    assert [h.origin for h in hosts] == [Origin("nodes", 2), Origin("nodes", 3)]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("", "nodes names no host"),
        ("\n  \n", "nodes names no host"),
        ("n1\nn2 slots=4\n", 'nodes:2: "n2 slots=4" is not a host name'),
    ],
)
def test_a_file_that_is_not_a_node_file_is_refused_naming_its_line(text: str, message: str) -> None:
    with pytest.raises(UsageError) as caught:
        nodefile.parse_node_file(text, "nodes")
    assert caught.value.what == message


names = st.from_regex(r"[a-z][a-z0-9-]{0,10}(\.[a-z0-9]{1,5})?", fullmatch=True)


@given(st.lists(names, min_size=1, max_size=40))
def test_any_node_file_round_trips_to_its_slot_lines(lines: list[str]) -> None:
    hosts = nodefile.parse_node_file("".join(f"{line}\n" for line in lines), "f")
    assert [h.name for h in hosts] == list(dict.fromkeys(lines))  # each once, in order
    assert {h.name: h.slots for h in hosts} == {n: lines.count(n) for n in lines}
    assert sum(h.slot_count for h in hosts) == len(lines)
    assert all(isinstance(h, Host) and h.user is None and h.port is None for h in hosts)


@pytest.mark.parametrize(
    ("env", "job"),
    [
        ({}, None),
        ({"PBS_NODEFILE": ""}, None),
        (
            {"PBS_NODEFILE": "/aux/42", "PBS_JOBID": "42.srv"},
            Job(Scheduler.PBS, "42.srv", "/aux/42"),
        ),
        (
            {"LSB_DJOB_HOSTFILE": "/tmp/.lsf/h", "LSB_JOBID": "77"},
            Job(Scheduler.LSF, "77", "/tmp/.lsf/h"),
        ),
    ],
)
def test_the_job_is_known_from_its_node_file_variable(env: dict[str, str], job: Job | None) -> None:
    assert nodefile.current_job(env) == job
