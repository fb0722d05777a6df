"""Grouping every task's stack: identical ones together, the odd ones out first."""

from __future__ import annotations

from typing import Any

from hypothesis import given
from hypothesis import strategies as st

from dtrain.errors import ExitCode
from dtrain.processes.stackgroups import (
    Frame,
    HostStacks,
    StacksReport,
    TaskStack,
    ThreadStack,
    file_name,
    group,
    labelled,
    summary_lines,
    task_text,
)
from dtrain.render.processes import stacks_text


def frames(*chain: str, line: int = 1) -> tuple[Frame, ...]:
    """`"barrier@dist.py"` style names, innermost first."""
    return tuple(Frame(n.split("@")[0], n.split("@")[1], line=line) for n in chain)


def task(
    label_task: str, host: str, *chain: str, pid: int = 100, line: int = 1, **kw: Any
) -> TaskStack:
    threads = (ThreadStack(frames(*chain, line=line), name="MainThread", thread_id=pid),)
    return TaskStack(host=host, pid=pid, task=label_task, threads=threads, **kw)


WAIT = ("barrier@dist.py", "train@train.py", "<module>@train.py")
LOAD = ("load_batch@data.py", "train@train.py", "<module>@train.py")


def test_the_odd_task_out_comes_first_and_the_identical_ones_are_one_group() -> None:
    stacks = labelled(
        [task(f"worker.{i}", f"h{i % 8}", *WAIT, pid=100 + i) for i in range(64) if i != 17]
        + [task("worker.17", "h9", *LOAD, pid=117)]
    )
    groups = group(stacks)
    assert [len(g.members) for g in groups] == [1, 63]
    assert groups[0].sample.label == "worker.17@h9"
    lines = summary_lines(StacksReport((HostStacks("all", stacks),)))
    assert lines[0] == (
        "1 task (worker.17@h9): in load_batch (data.py:1) <- train (train.py:1) <- <module> "
        "(train.py:1)"
    )
    assert lines[1] == (
        "63 tasks (worker.0@h0, worker.1@h1, worker.2@h2, worker.3@h3, ... 59 more): "
        "in barrier (dist.py:1) <- train (train.py:1) <- <module> (train.py:1)"
    )


def test_line_numbers_and_native_addresses_never_split_a_group() -> None:
    a = task("worker.0", "h1", *WAIT, line=10)
    b = task("worker.1", "h2", *WAIT, line=12)
    native = (Frame("0x7f00dead", "libc.so.6", is_native=True), *frames(*WAIT))
    c = TaskStack("h3", 7, task="worker.2", threads=(ThreadStack(native, thread_id=7),))
    assert len(group([a, b, c])) == 1


def test_thread_order_never_splits_a_group() -> None:
    one, two = ThreadStack(frames(*WAIT)), ThreadStack(frames(*LOAD))
    a = TaskStack("h1", 1, task="worker.0", threads=(one, two))
    b = TaskStack("h2", 2, task="worker.1", threads=(two, one))
    assert len(group([a, b])) == 1


def test_processes_without_stacks_are_not_grouped_but_are_reported_per_host() -> None:
    missing = TaskStack(
        "h2",
        5,
        task="worker.1",
        threads=None,
        error="py-spy is not installed",
        looked_in=("/v",),
        interpreter="/v/python3",
    )
    shell = TaskStack("h1", 6, task="worker.0", argv=("/bin/sh", "-c", "x"), is_python=False)
    report = StacksReport(
        (
            HostStacks("h1", labelled([task("worker.0", "h1", *WAIT), shell])),
            HostStacks("h2", labelled([missing])),
        )
    )
    assert len(report.groups) == 1
    (problem,) = report.problems
    assert problem.host == "h2"
    assert "no stacks for 1 process (worker.1@h2): py-spy is not installed" in problem.message
    assert problem.hint == "install it into the job's environment: /v/python3 -m pip install py-spy"
    assert report.exit_code == ExitCode.ENVIRONMENT and report.status == "partial"
    assert summary_lines(report)[-1] == "1 process is not Python (sh): no stacks"
    assert [s.label for s in report.stacks] == [
        "worker.0@h1[100]",
        "worker.0@h1[6]",
        "worker.1@h2",
    ]


def test_a_task_with_several_python_processes_is_told_apart_by_pid() -> None:
    stacks = labelled([task("worker.0", "h1", *WAIT, pid=5), task("worker.0", "h1", *LOAD, pid=6)])
    assert [s.label for s in stacks] == ["worker.0@h1[5]", "worker.0@h1[6]"]
    assert [file_name(s) for s in stacks] == ["worker.0@h1[5].txt", "worker.0@h1[6].txt"]


def test_a_task_file_holds_every_thread_and_frame() -> None:
    stack = labelled([task("worker.3", "h2", *WAIT, pid=42, state="S", argv=("python", "t.py"))])[0]
    assert task_text(stack) == (
        "worker.3@h2 pid 42 state S: python t.py\n"
        "Thread 42 (MainThread) idle\n"
        "    barrier (dist.py:1)\n"
        "    train (train.py:1)\n"
        "    <module> (train.py:1)\n"
    )


def test_from_agent_reads_an_agent_entry() -> None:
    entry = {
        "pid": 9,
        "state": "S",
        "cmdline": ["python", "x.py"],
        "tags": {"DTRAIN_JOB_ID": "J", "DTRAIN_TASK": "worker.2"},
        "python": True,
        "tool": "/v/py-spy",
        "threads": [
            {
                "id": 9,
                "name": None,
                "active": False,
                "frames": [{"name": "f", "file": "x.py", "line": 3, "native": False}],
            }
        ],
        "error": None,
    }
    stack = TaskStack.from_agent(entry, "h1")
    assert (stack.job_id, stack.task, stack.is_taken) == ("J", "worker.2", True)
    assert stack.threads is not None and stack.threads[0].frames == (Frame("f", "x.py", 3),)


names = st.sampled_from(["a", "b", "c"])
chains = st.lists(names, min_size=1, max_size=3).map(tuple)


@given(st.lists(st.tuples(chains, st.integers(0, 50)), min_size=1, max_size=30))
def test_every_stack_lands_in_exactly_one_group_and_groups_grow_down_the_list(
    items: list[tuple[tuple[str, ...], int]],
) -> None:
    stacks = labelled(
        [
            TaskStack(
                "h",
                pid,
                task=f"w{index}",
                threads=(ThreadStack(tuple(Frame(n, "f.py", line) for n in chain)),),
            )
            for index, (chain, line) in enumerate(items)
            for pid in (index + 1,)
        ]
    )
    groups = group(stacks)
    members = [m for g in groups for m in g.members]
    assert sorted(m.pid for m in members) == sorted(s.pid for s in stacks)
    assert [len(g.members) for g in groups] == sorted(len(g.members) for g in groups)
    for g in groups:
        assert len({m.signature for m in g.members}) == 1
    assert len({g.sample.signature for g in groups}) == len(groups)


def test_the_files_line_promises_full_stacks_only_where_they_were_taken() -> None:
    def missing(pid: int) -> TaskStack:
        return TaskStack("h2", pid, task=f"worker.{pid}", threads=None, error="no py-spy")

    def text(*stacks: TaskStack) -> str:
        report = StacksReport((HostStacks("h", labelled(stacks)),), files_dir="logs/j/stacks-1")
        return stacks_text(report).splitlines()[-1]

    assert text(task("worker.0", "h1", *WAIT)) == "every task's full stack: logs/j/stacks-1/"
    assert text(task("worker.0", "h1", *WAIT), missing(1), missing(2)) == (
        "the full stacks of 1 of 3 Python processes: logs/j/stacks-1/"
    )
    assert text(missing(1)) == "no stack was taken; logs/j/stacks-1/ says why for each task"
