"""Slurm's host list and task-count grammars, and the agents' step (pure)."""

from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtrain.errors import UsageError
from dtrain.plan import slurm
from dtrain.plan.hosts import Host


@pytest.mark.parametrize(
    ("expression", "names"),
    [
        ("h1", ("h1",)),
        ("h[1-3]", ("h1", "h2", "h3")),
        ("gpu[01-03,7],cpu9", ("gpu01", "gpu02", "gpu03", "gpu7", "cpu9")),
        ("r[1-2]n[1-2]", ("r1n1", "r1n2", "r2n1", "r2n2")),
        ("node[098-101]", ("node098", "node099", "node100", "node101")),
        ("a-b[1-2].x", ("a-b1.x", "a-b2.x")),
        ("h[3],h[1]", ("h3", "h1")),  # Slurm's order, not sorted
    ],
)
def test_host_lists_expand_as_scontrol_show_hostnames_does(
    expression: str, names: tuple[str, ...]
) -> None:
    assert slurm.expand_hostlist(expression) == names


@pytest.mark.parametrize(
    ("expression", "why"),
    [
        ("h[1-3", "without its ']'"),
        ("h1-3]", "without its '['"),
        ("h[3-1]", "counts down"),
        ("h[a-b]", "not a number"),
        ("h1,,h2", "empty name"),
        ("h[1-100000000]", "more than"),
        ("", "empty name"),
    ],
)
def test_a_host_list_that_cannot_be_read_is_an_error_naming_it(expression: str, why: str) -> None:
    with pytest.raises(UsageError) as caught:
        slurm.expand_hostlist(expression)
    assert why in str(caught.value)
    assert f'"{expression}"' in str(caught.value)


names = st.from_regex(r"[a-z][a-z0-9-]{0,6}[a-z]", fullmatch=True)


@given(
    st.lists(
        st.tuples(names, st.integers(0, 50), st.integers(0, 5), st.integers(1, 3)),
        min_size=1,
        max_size=5,
    )
)
def test_any_range_expands_to_every_number_in_it_with_its_padding(
    groups: list[tuple[str, int, int, int]],
) -> None:
    parts, expected = [], []
    for prefix, low, span, width in groups:
        high = low + span
        parts.append(f"{prefix}[{str(low).zfill(width)}-{high}]")
        expected += [prefix + str(n).zfill(width) for n in range(low, high + 1)]
    assert slurm.expand_hostlist(",".join(parts)) == tuple(expected)


@pytest.mark.parametrize(
    ("text", "nodes", "counts"),
    [("2(x3),1", 4, (2, 2, 2, 1)), ("4", 1, (4,)), ("1(x2)", 2, (1, 1))],
)
def test_tasks_per_node_expand_from_slurms_run_length_form(
    text: str, nodes: int, counts: tuple[int, ...]
) -> None:
    assert slurm.expand_counts(text, nodes) == counts


@pytest.mark.parametrize(("text", "nodes"), [("2(x3)", 4), ("2(x3),1,1", 3), ("x", 1)])
def test_task_counts_that_disagree_with_the_node_list_are_refused(text: str, nodes: int) -> None:
    with pytest.raises(UsageError, match="SLURM_TASKS_PER_NODE"):
        slurm.expand_counts(text, nodes)


def test_an_allocation_with_no_task_anywhere_is_refused_and_one_empty_node_is_not() -> None:
    with pytest.raises(UsageError, match=r'SLURM_TASKS_PER_NODE="0\(x2\)" gives no node a task'):
        slurm.expand_counts("0(x2)", 2)
    assert slurm.expand_counts("1,0", 2) == (1, 0)


def test_the_allocation_becomes_hosts_with_its_tasks_as_slots() -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "h[1-2]", "SLURM_TASKS_PER_NODE": "2,1"}
    assert slurm.in_allocation(env)
    found = slurm.allocation_from(env, slurm.expand_hostlist(env["SLURM_JOB_NODELIST"]))
    assert found.hosts() == (Host("h1", slots=2), Host("h2", slots=1))
    assert found.job_id == "42"


def test_without_task_counts_every_node_has_one_slot_and_no_nodes_is_an_error() -> None:
    env = {"SLURM_JOB_ID": "42", "SLURM_JOB_NODELIST": "h[1-2]"}
    assert slurm.allocation_from(env, ("h1", "h2")).tasks_per_node == (1, 1)
    assert not slurm.in_allocation({"SLURM_JOB_ID": "42"})
    with pytest.raises(UsageError, match="names no node"):
        slurm.allocation_from(env, ())


def test_one_step_runs_one_agent_per_node_and_the_key_is_never_in_it() -> None:
    argv = slurm.agent_step_argv(
        ["h1", "h2"], 2, ["python3", "-c", "BOOT"], "dtrain", ("-p", "gpu")
    )
    assert argv[:4] == ["srun", "--nodes=2", "--ntasks=2", "--ntasks-per-node=1"]
    assert "--nodelist=h1,h2" in argv and "--overlap" in argv and "--input=none" in argv
    assert argv[-5:] == ["-p", "gpu", "python3", "-c", "BOOT"]
    made = slurm.agent_step_argv(None, 3, ["python3"], "dtrain")
    assert not any(arg.startswith("--nodelist") for arg in made)
