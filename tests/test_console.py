"""What the console shows of real tasks' output: partial lines, `\\r` updates, huge lines."""

from __future__ import annotations

import queue
import subprocess
import threading
from pathlib import Path

from tests.conftest import PYTHON, program, run_dtrain, start_dtrain

LAUNCH_ONE = ["launch", "--framework", "torch", "-n", "1", "-s", "0", "--"]
WAIT_S = 15.0


class LineReader:
    """dtrain's stdout, line by line, each wait bounded."""

    def __init__(self, proc: subprocess.Popen[str]) -> None:
        self.lines: queue.SimpleQueue[str | None] = queue.SimpleQueue()
        self.seen: list[str] = []
        stream = proc.stdout
        assert stream is not None

        def pump() -> None:
            for line in stream:
                self.lines.put(line.rstrip("\n"))
            self.lines.put(None)

        threading.Thread(target=pump, daemon=True).start()

    def until(self, wanted: str) -> None:
        while True:
            try:
                line = self.lines.get(timeout=WAIT_S)
            except queue.Empty:
                raise AssertionError(f"{wanted!r} not shown; shown: {self.seen[-5:]}") from None
            assert line is not None, f"{wanted!r} never shown; shown: {self.seen[-5:]}"
            self.seen.append(line)
            if line == wanted:
                return

    def rest(self) -> list[str]:
        while (line := self.lines.get(timeout=WAIT_S)) is not None:
            self.seen.append(line)
        return self.seen


def test_partial_lines_and_progress_updates_show_before_their_newline(workdir: Path) -> None:
    gate = workdir / "gate"
    proc = start_dtrain([*LAUNCH_ONE, PYTHON, program("progress.py"), str(gate)], workdir)
    try:
        shown = LineReader(proc)
        shown.until("[worker.0] loading")  # no newline yet: the task waits for gate.1
        gate.with_suffix(".1").touch()
        shown.until("[worker.0]  done")
        shown.until("[worker.0] bar 10%")  # a \r update, shown while the task waits
        gate.with_suffix(".2").touch()
        shown.until("[worker.0] bar 50%")
        gate.with_suffix(".3").touch()
        lines = shown.rest()
        assert proc.wait(timeout=WAIT_S) == 0
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait(timeout=WAIT_S)
    assert lines[:5] == [
        "[worker.0] start",
        "[worker.0] loading",
        "[worker.0]  done",
        "[worker.0] bar 10%",
        "[worker.0] bar 50%",
    ]
    assert lines[-1] == "[worker.0] bar 100%"
    burst = [line for line in lines if line.startswith("[worker.0] burst ")]
    assert len(burst) < 100  # 1000 updates, coalesced
    assert all("\r" not in line for line in lines)
    log = (workdir / "dtrain-logs" / "latest" / "worker.0.log").read_bytes()
    updates = "".join(f"\rburst {n}" for n in range(1000))
    expected = f"start\nloading done\n\rbar 10%\rbar 50%{updates}\rbar 100%\n"
    assert log == expected.encode()  # the log keeps every byte


def test_a_10_mb_line_is_one_line_in_the_log_and_no_empty_line_on_the_console(
    workdir: Path,
) -> None:
    result = run_dtrain([*LAUNCH_ONE, PYTHON, program("long_line.py"), "10"], workdir)
    assert result.returncode == 0, result.stderr
    lines = result.stdout.splitlines()
    assert lines and all(line.startswith("[worker.0] x") for line in lines), [
        line[:20] for line in lines if not line.startswith("[worker.0] x")
    ]
    assert sum(len(line) - len("[worker.0] ") for line in lines) == 10 << 20
    log = (workdir / "dtrain-logs" / "latest" / "worker.0.log").read_bytes()
    assert log == b"x" * (10 << 20) + b"\n"
