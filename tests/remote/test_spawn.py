"""How the agent starts processes, on real processes."""

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


def test_a_process_in_a_session_of_its_own_leads_its_group_until_waited_for() -> None:
    child = spawn.start_process(["sleep", "60"], session=True)
    assert os.getpgid(child.pid) == child.pid
    assert spawn.is_started_here(child.pid)  # a subreaper agent leaves it to its owner
    child.kill()
    assert child.wait() == -signal.SIGKILL
    assert not spawn.is_started_here(child.pid)


def test_a_start_in_another_directory_never_moves_the_agents_own(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """The agent's other threads (doctor's probe, py-spy runs) go on while it starts a
    process: the start never changes the process-wide working directory, even for a moment."""
    moves: list[object] = []
    monkeypatch.setattr(os, "chdir", moves.append)
    monkeypatch.setattr(os, "fchdir", moves.append)
    code, out, _ = spawn.run([PYTHON, "-c", "import os; print(os.getcwd())"], cwd=str(tmp_path))
    assert (code, out.decode().strip()) == (0, str(tmp_path))
    assert moves == []


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
