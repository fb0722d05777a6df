"""What the console shows of real tasks' output: partial lines, `\\r` updates, huge lines."""

from __future__ import annotations

import os
import queue
import select
import signal
import subprocess
import threading
import time
from pathlib import Path

from dtrain.plan.hosts import local_host
from dtrain.plan.spec import Role, TaskSpec
from tests.conftest import PYTHON, program, run_dtrain, start_dtrain, wait_gone

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


def console_task(name: str, host: str) -> TaskSpec:
    """A task as the console sees it: only its label matters."""
    return TaskSpec(role=Role.WORKER, index=0, name=name, host=local_host(host),
                    address="127.0.0.1", argv=("true",), env={}, label=f"{name}@{host}",
                    log_name=f"{name}.log", workdir="/")  # fmt: skip


def test_output_written_from_many_reader_threads_stays_in_whole_prefixed_lines(
    tmp_path: Path,
) -> None:
    """Each host's reader thread writes its tasks' output to the one console: lines from
    different tasks never interleave inside a line, and each task's lines keep their order."""
    from dtrain.render.console import TerminalConsole

    tasks = [console_task(f"worker.{i}", f"h{i}") for i in range(4)]
    read_fd, write_fd = os.pipe()  # a terminal's pipe: big writes to it can be cut and mixed
    shown = bytearray()

    def show() -> None:
        while chunk := os.read(read_fd, 1000):
            shown.extend(chunk)

    reader = threading.Thread(target=show)
    reader.start()
    with os.fdopen(write_fd, "wb") as out, (tmp_path / "err").open("wb") as err:
        console = TerminalConsole(out, err)

        def write(task: TaskSpec) -> None:
            text = b"".join(b"%s line %05d\n" % (task.name.encode(), i) for i in range(3000))
            for start in range(0, len(text), 9973):  # chunks that end inside lines
                console.task_output(task, False, text[start : start + 9973])

        threads = [threading.Thread(target=write, args=(task,)) for task in tasks]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join(60)
        for task in tasks:
            console.task_closed(task)
        console.close()
    reader.join(60)
    os.close(read_fd)
    seen: dict[str, list[int]] = {task.name: [] for task in tasks}
    for line in shown.decode().splitlines():
        prefix, name, word, number = line.split(" ")
        assert prefix == f"[{name}@h{name[-1]}]" and word == "line", line
        seen[name].append(int(number))
    assert all(numbers == list(range(3000)) for numbers in seen.values())


def test_a_console_that_takes_no_output_holds_back_the_tasks_not_the_supervisor(
    tmp_path: Path,
) -> None:
    """A terminal that stops reading (Ctrl-S, a pager that is not reading): the host's reader
    thread waits in its write, holding the console, but the supervisor's notes and a task's
    end return at once. Once the terminal reads again, everything shows, in order."""
    from dtrain.render.console import TerminalConsole

    task = console_task("worker.0", "h")
    read_fd, write_fd = os.pipe()  # stdout and stderr are one terminal that stopped reading
    out = os.fdopen(write_fd, "wb")
    console = TerminalConsole(out, out)
    text = b"".join(b"line %06d\n" % i for i in range(20000))  # more than the pipe holds
    writer = threading.Thread(target=console.task_output, args=(task, False, text + b"tail"))
    writer.start()
    writer.join(0.5)
    assert writer.is_alive()  # the reader thread waits on the terminal, holding the console
    done = threading.Event()

    def supervise() -> None:  # as the supervisor sees a task end
        console.task_closed(task)
        console.note("worker.0@h exited with code 1")
        done.set()

    threading.Thread(target=supervise, daemon=True).start()
    assert done.wait(10)  # the supervisor went on; it never waited for the terminal
    shown = bytearray()
    deadline = time.monotonic() + 30
    while not shown.endswith(b"exited with code 1\n") and time.monotonic() < deadline:
        if select.select([read_fd], [], [], 1.0)[0]:
            shown.extend(os.read(read_fd, 65536))
    writer.join(10)
    console.close()
    out.close()
    os.close(read_fd)
    lines = shown.decode().splitlines()
    assert lines[:-2] == [f"[worker.0@h] line {i:06d}" for i in range(20000)]
    assert lines[-2:] == ["[worker.0@h] tail", "dtrain: worker.0@h exited with code 1"]


FLOOD = """
import os, sys
open(sys.argv[1], "w").write(str(os.getpid()))
while True:
    sys.stdout.write("x" * 99 + "\\n")
"""


def test_ctrl_c_stops_the_tasks_while_nothing_reads_dtrain_s_output(workdir: Path) -> None:
    """`dtrain launch ... | less` and the pager waits: the task's output fills dtrain's
    stdout, nobody reads it, and Ctrl-C must still stop the task, not wait for the reader."""
    pid_file = workdir / "task.pid"
    proc = start_dtrain(
        ["launch", "--framework", "torch", "-n", "1", "--grace", "1", "--",
         PYTHON, "-c", FLOOD, str(pid_file)],
        workdir,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 20
        while not pid_file.exists() or not pid_file.read_text():
            assert time.monotonic() < deadline and proc.poll() is None
            time.sleep(0.05)
        task = int(pid_file.read_text())
        time.sleep(1.0)  # the flood fills the pipe to dtrain's stdout; nobody reads it
        proc.send_signal(signal.SIGINT)
        assert wait_gone([task], 15) == []
    finally:
        _, err = proc.communicate(timeout=60)  # read at last: dtrain ends
    assert proc.returncode == 130
    assert "interrupted by signal 2" in err
