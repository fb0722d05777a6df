"""Shared fixtures: running dtrain as a user would, and failing any test that leaks a process."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator, Sequence
from pathlib import Path
from typing import Any

import pytest

from dtrain.remote import procs, proto

GONE_S = 20.0  # how long a test waits for processes (or containers) to be gone, on a loaded machine

ROOT = Path(__file__).resolve().parent.parent
PROGRAMS = ROOT / "tests" / "programs"
PYTHON = sys.executable
LEFTOVER_WAIT_S = 5.0


def program(name: str) -> str:
    return str(PROGRAMS / name)


# A suite started in the background by a non-interactive shell (`bash .ci/run &`) inherits
# SIGINT ignored, and so would every dtrain it starts: Python leaves an inherited SIG_IGN in
# place, and the Ctrl-C tests would wait for an exit that never comes. Run as from a terminal.
if signal.getsignal(signal.SIGINT) is signal.SIG_IGN:
    signal.signal(signal.SIGINT, signal.default_int_handler)


# Every process this test run starts inherits this marker (local agents pass on dtrain's
# environment), so the leftover check never touches another run's processes on this machine.
SESSION_VAR = "DTRAIN_TEST_SESSION"
SESSION = os.environ.setdefault(SESSION_VAR, f"{os.getpid()}-{time.time_ns()}")


def tagged_pids() -> set[int]:
    """Live processes started by this test run that carry a dtrain job id."""
    table = procs.snapshot()
    found = set()
    for pid, proc in table.items():
        if proto.JOB_ID_VAR in proc.tags and proc.state != "Z":
            env = procs.read_environ(pid) or {}
            if env.get(SESSION_VAR) == SESSION:
                found.add(pid)
    return found


@pytest.fixture(autouse=True)
def no_leftover_processes() -> Iterator[None]:
    """A test that leaves a process tagged with a dtrain job id alive fails (and it is killed).

    Looks processes up by their DTRAIN_JOB_ID tag, never by name.
    """
    before = tagged_pids()
    yield
    deadline = time.monotonic() + LEFTOVER_WAIT_S
    leftover = tagged_pids() - before
    while leftover and time.monotonic() < deadline:
        time.sleep(0.1)
        leftover = {pid for pid in leftover if procs.alive(pid)}
    if leftover:
        table = procs.snapshot()
        described = procs.describe(table, sorted(leftover))
        for pid in leftover:
            with contextlib.suppress(OSError):
                os.kill(pid, signal.SIGKILL)
        pytest.fail(f"test left tagged processes running: {described}")


def dtrain_argv(*args: str) -> list[str]:
    return [PYTHON, "-m", "dtrain", *args]


def run_dtrain(
    args: Sequence[str],
    cwd: Path,
    timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `dtrain ARGS` to completion, bounded in time, as a person would from a shell."""
    return run_program(dtrain_argv(*args), cwd, timeout_s, env)


def run_program(
    argv: Sequence[str],
    cwd: Path,
    timeout_s: float = 60.0,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Run `argv` to completion, bounded in time, its output captured, no input."""
    return subprocess.run(
        argv,
        cwd=cwd,
        capture_output=True,
        text=True,
        timeout=timeout_s,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def start_dtrain(
    args: Sequence[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        dtrain_argv(*args),
        cwd=cwd,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        env=env,
        stdin=subprocess.DEVNULL,
    )


def imported_by(text: str) -> set[str]:
    """The modules `python -X importtime` lines name."""
    return {
        line.rsplit("|", 1)[-1].strip()
        for line in text.splitlines()
        if line.startswith("import time:")
    }


def wait_for_line(path: Path, needle: str, timeout_s: float = 20.0) -> str:
    """Wait until a file (a task log) contains `needle`; return the file's text."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if path.exists():
            text = path.read_text(errors="replace")
            if needle in text:
                return text
        time.sleep(0.05)
    raise AssertionError(f"{needle!r} did not appear in {path} within {timeout_s}s")


def latest_job(cwd: Path) -> Path:
    """The newest job's log directory under `cwd` (where dtrain-logs/latest points)."""
    return (cwd / "dtrain-logs" / "latest").resolve()


def job_document(cwd: Path) -> dict[str, Any]:
    """The newest job's job.json under `cwd`, parsed."""
    document: dict[str, Any] = json.loads((latest_job(cwd) / "job.json").read_text())
    return document


def wait_for_latest(cwd: Path, timeout_s: float = 20.0) -> Path:
    """Wait until dtrain-logs/latest exists under `cwd`, then return latest_job(cwd).

    Returns the resolved path at the deadline even if the link never appeared.
    """
    latest = cwd / "dtrain-logs" / "latest"
    deadline = time.monotonic() + timeout_s
    while not latest.exists() and time.monotonic() < deadline:
        time.sleep(0.05)
    return latest_job(cwd)


def job_pids(job_id: str) -> list[int]:
    table = procs.snapshot()
    pids: list[int] = procs.select_job_processes(table, job=job_id)
    return pids


def wait_gone(pids: Sequence[int], timeout_s: float) -> list[int]:
    """Wait until none of `pids` is alive; return those still alive at the deadline."""
    deadline = time.monotonic() + timeout_s
    alive = [pid for pid in pids if procs.alive(pid)]
    while alive and time.monotonic() < deadline:
        time.sleep(0.05)
        alive = [pid for pid in alive if procs.alive(pid)]
    return alive


def job_processes(job: str) -> list[int]:
    """Live processes anywhere on this machine (any host, any container) tagged with `job`."""
    table = procs.snapshot()
    return [
        pid
        for pid, proc in table.items()
        if proc.tags.get(proto.JOB_ID_VAR) == job and proc.state != "Z"
    ]


def wait_until(check: Callable[[], bool], timeout_s: float = GONE_S) -> bool:
    """Whether `check` holds by the deadline (asked every 0.1 s, and once more at the end)."""
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if check():
            return True
        time.sleep(0.1)
    return check()


@pytest.fixture
def workdir(tmp_path: Path) -> Path:
    """A scratch working directory with an awkward name (spaces, quotes, unicode)."""
    path = tmp_path / "work dir 'ü'"
    path.mkdir()
    return path
