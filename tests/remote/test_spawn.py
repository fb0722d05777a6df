"""The agent's process and thread starts (no subprocess, no threading), on real processes."""

from __future__ import annotations

import os
import signal
import time
from pathlib import Path

import pytest

from dtrain.remote import spawn
from tests.conftest import PYTHON, wait_gone


def test_a_helper_run_gives_its_exit_code_and_both_streams(tmp_path: Path) -> None:
    code, out, err = spawn.run(
        [
            PYTHON,
            "-c",
            "import os, sys; print(os.getcwd()); sys.stderr.write('e' * 200000); exit(3)",
        ],
        cwd=str(tmp_path),
    )
    assert (code, out.decode().strip(), err) == (3, str(tmp_path), b"e" * 200000)


def test_a_helper_that_outlives_its_time_is_killed_with_everything_it_started(
    tmp_path: Path,
) -> None:
    pids = tmp_path / "pids"
    script = (
        "import os, subprocess, sys, time; "
        "child = subprocess.Popen(['sleep', '60']); "
        f"open({str(pids)!r}, 'w').write('%d %d' % (os.getpid(), child.pid)); "
        "print('started', flush=True); time.sleep(60)"
    )
    started = time.monotonic()
    code, out, err = spawn.run([PYTHON, "-c", script], timeout_s=1.0)
    assert time.monotonic() - started < 10
    assert (code, out, err) == (None, b"started\n", b"")
    assert wait_gone([int(pid) for pid in pids.read_text().split()], 5) == []


def test_a_helper_that_closes_its_output_and_lingers_is_bounded_too() -> None:
    script = "import os, time; os.close(1); os.close(2); time.sleep(60)"
    started = time.monotonic()
    assert spawn.run([PYTHON, "-c", script], timeout_s=1.0)[0] is None
    assert time.monotonic() - started < 10


def test_a_program_that_cannot_start_is_an_oserror(tmp_path: Path) -> None:
    with pytest.raises(FileNotFoundError):
        spawn.run([str(tmp_path / "no-such-program")])
    with pytest.raises(FileNotFoundError):
        spawn.start_process([PYTHON, "-c", "pass"], cwd=str(tmp_path / "no-such-dir"))
    assert os.getcwd() != str(tmp_path / "no-such-dir")


def test_a_bare_name_is_looked_up_on_path() -> None:
    assert spawn.run(["true"]) == (0, b"", b"")


def test_a_child_reports_exit_codes_and_signals_as_popen_does() -> None:
    assert spawn.start_process([PYTHON, "-c", "exit(7)"]).wait() == 7
    child = spawn.start_process(["sleep", "60"], session=True)
    assert child.poll() is None
    assert os.getpgid(child.pid) == child.pid  # its own session, so its own group
    child.kill()
    assert child.wait() == -signal.SIGKILL
    assert spawn.wait_for(child, 0.1) == -signal.SIGKILL


def test_a_thread_started_here_can_be_joined_with_a_timeout() -> None:
    results: list[int] = []

    def slow() -> None:
        time.sleep(0.2)
        results.append(1)

    done = spawn.in_thread(slow)
    assert not done.acquire(True, 0.01)
    assert done.acquire(True, 5)
    assert results == [1]


def test_for_each_runs_every_item_once_on_at_most_the_threads_asked_and_is_bounded() -> None:
    seen: list[int] = []
    running: list[int] = []
    most = [0]

    def one(item: int) -> None:
        running.append(item)
        most[0] = max(most[0], len(running))
        time.sleep(0.02)
        seen.append(item)
        running.remove(item)

    spawn.for_each(range(40), one, 4, 30.0)
    assert sorted(seen) == list(range(40))
    assert 1 <= most[0] <= 4
    started = time.monotonic()
    spawn.for_each([2.0], time.sleep, 1, 0.2)  # a straggler is left behind, not waited for
    assert time.monotonic() - started < 1.5
