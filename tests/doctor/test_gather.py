"""`dtrain doctor` on this machine alone, through a real local agent and real processes."""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import SESSION, SESSION_VAR, run_dtrain

HOLD_PORT = (
    "import socket, sys, time\n"
    "s = socket.socket(); s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)\n"
    "s.bind(('127.0.0.1', 0)); s.listen(1)\n"
    "print(s.getsockname()[1], flush=True)\n"
    "time.sleep(60)\n"
)


@pytest.fixture
def port_holder() -> Iterator[tuple[int, int]]:
    """A process tagged like a leftover scheduler, listening on a port: (pid, port)."""
    env = dict(
        os.environ,
        DTRAIN_JOB_ID=f"doctor-test-{os.getpid()}",
        DMLC_ROLE="scheduler",
        **{SESSION_VAR: SESSION},
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD_PORT], env=env, stdout=subprocess.PIPE, text=True
    )
    try:
        assert proc.stdout is not None
        port = int(proc.stdout.readline())
        yield proc.pid, port
    finally:
        proc.kill()
        proc.wait(5)


def results_of(stdout: str) -> dict[str, dict[str, str]]:
    document = json.loads(stdout)
    assert document["command"] == "doctor"
    return {r["check"]: r for r in document["data"]["results"]}


def test_doctor_here_checks_the_command_and_prints_one_json_document(workdir: Path) -> None:
    (workdir / "train.py").write_text("print(1)\n")
    result = run_dtrain(["doctor", "--json", "--", sys.executable, "train.py"], workdir)
    assert result.returncode == 0, result.stdout + result.stderr
    results = results_of(result.stdout)
    assert results["ssh"]["status"] == "skip"
    assert results["python"]["status"] == "pass"
    assert sys.executable in results["python"]["detail"]
    assert results["workdir"]["status"] == "pass"
    assert "train.py in " in results["workdir"]["detail"]
    assert results["scheduler"]["status"] == "pass"


def test_missing_script_fails_with_the_path(workdir: Path) -> None:
    result = run_dtrain(["doctor", "--", sys.executable, "nope.py"], workdir)
    assert result.returncode == 3
    assert "nope.py: No such file or directory in" in result.stdout
    assert re.match(
        r"doctor: this machine, 12 checks in [\d.]+s: 1 failed", result.stdout.splitlines()[-1]
    )


def test_scheduler_port_held_by_a_leftover_names_its_pid_and_kill_line(
    workdir: Path, port_holder: tuple[int, int]
) -> None:
    pid, port = port_holder
    started = time.monotonic()
    result = run_dtrain(["doctor", "--json", "--port", str(port)], workdir)
    assert time.monotonic() - started < 30
    assert result.returncode == 3, result.stdout
    scheduler = results_of(result.stdout)["scheduler"]
    assert scheduler["status"] == "fail"
    assert f"port {port} is in use" in scheduler["detail"]
    assert f"pid {pid}, age " in scheduler["detail"]
    assert "DMLC_ROLE=scheduler" in scheduler["detail"]
    assert scheduler["hint"] == f"stop it: dtrain kill --job doctor-test-{os.getpid()}"


def test_a_free_port_is_probed_and_released(workdir: Path) -> None:
    with socket.socket() as probe:
        probe.bind(("127.0.0.1", 0))
        port = probe.getsockname()[1]
    result = run_dtrain(["doctor", "--json", "--port", str(port)], workdir)
    assert results_of(result.stdout)["scheduler"]["status"] == "pass"
    with socket.socket() as again:  # doctor's listener is gone
        again.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        again.bind(("127.0.0.1", port))
