"""The benchmark's process view: by tag, below a host's first process, gone; real processes."""

from __future__ import annotations

import subprocess
import time
import uuid
from collections.abc import Iterator

import psutil
import pytest

from bench import procs


@pytest.fixture
def tag() -> str:
    return f"/tmp/bench-tag-{uuid.uuid4().hex}"


@pytest.fixture
def tree(tag: str) -> Iterator[subprocess.Popen[bytes]]:
    """A shell (as a host's first process) with two task-python children carrying `tag`."""
    task = f"/usr/bin/python3 -S -c 'import time; time.sleep(30)' {tag}"
    shell = subprocess.Popen(["/bin/sh", "-c", f"{task} & {task}; wait"])
    yield shell
    procs.kill(procs.tagged(tag))
    shell.kill()
    shell.wait(10)


def started(tag: str, count: int = 2) -> list[psutil.Process]:
    """The tasks of `tag`, once `count` of them run (bounded: 10 s)."""
    deadline = time.monotonic() + 10.0
    while len(found := procs.tasks(tag)) < count and time.monotonic() < deadline:
        time.sleep(0.02)
    return found


def test_tasks_are_found_by_tag_and_their_python(tree: subprocess.Popen[bytes], tag: str) -> None:
    assert len(started(tag)) == 2
    assert procs.tasks(f"{tag}-other") == []
    assert tree.pid in {p.pid for p in procs.tagged(tag)}  # its command line holds the tag
    assert tree.pid not in {p.pid for p in procs.tasks(tag)}  # but it is no task python


def test_what_is_below_a_first_process_counts_as_on_that_host(
    tree: subprocess.Popen[bytes], tag: str
) -> None:
    found = started(tag)
    below = procs.on_hosts([tree.pid])
    assert {p.pid for p in found} <= set(below)
    assert tree.pid not in below
    assert procs.on_hosts([2**22 + 7]) == []  # above pid_max's default: nothing below it


def test_killed_tasks_are_gone_and_leave_nothing_below(
    tree: subprocess.Popen[bytes], tag: str
) -> None:
    found = started(tag)
    procs.kill(found)
    assert procs.wait_gone(found, 10.0)
    assert procs.alive(found) == []
    tree.wait(10)  # the shell's wait returns once both tasks died
    assert procs.on_hosts([tree.pid]) == []


def test_wait_gone_gives_up_at_its_bound(tree: subprocess.Popen[bytes], tag: str) -> None:
    found = started(tag)
    assert len(found) == 2
    assert not procs.wait_gone(found, 0.1)
