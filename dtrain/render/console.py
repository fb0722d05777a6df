"""The terminal a launch (and doctor's --setup) writes to: task output line by line, each line
prefixed with its task, and dtrain's own notes, from a thread of its own.

The one module of `render` that writes: the others make text and JSON, this one puts task
output on the terminal as it comes.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Callable, Sequence
from typing import BinaryIO

from dtrain.plan.spec import TaskSpec
from dtrain.render import LinePrefixer


class TerminalConsole:
    """Task output with `[task@host]` prefixes; progress notes on stderr.

    A reader that goes away (`dtrain launch ... | head`) silences that stream, not the job:
    the logs still get everything. Each host's reader thread writes its tasks' output here;
    the notes, the last partial line of a task that ended and the partial lines shown when a
    task goes quiet are written by the console's own thread. One lock keeps lines whole. So a
    terminal that stops taking output (Ctrl-S, a pager that is not reading) holds back the
    output, and through ssh flow control the tasks, but never the supervisor: Ctrl-C and its
    timers still stop the job. `close` writes what is left.
    """

    def __init__(self, stdout: BinaryIO, stderr: BinaryIO) -> None:
        self.lock = threading.RLock()  # a failed write notes it, under the lock it holds
        self.stdout = stdout
        self.stderr = stderr
        self.closed: set[int] = set()
        self.prefixers: dict[tuple[str, bool], LinePrefixer] = {}
        self.waiting: set[tuple[str, bool]] = set()  # streams holding a partial line
        self.next_due: float | None = None
        self.posted = threading.Condition(threading.Lock())  # guards the three below
        self.pending: list[Callable[[], None]] = []
        self.closing = False
        self.writer: threading.Thread | None = None

    def _write(self, out: BinaryIO, pieces: Sequence[bytes | memoryview]) -> None:
        if id(out) in self.closed or not pieces:
            return
        try:
            out.flush()
            fd = out.fileno()
        except (OSError, ValueError, AttributeError):
            fd = -1  # not a real file (tests): write through the object
        try:
            if fd < 0:
                out.write(b"".join(pieces))
                out.flush()
                return
            views = [memoryview(p) for p in pieces]
            while views:  # writev may write part, e.g. to a full pipe interrupted by a signal
                written = os.writev(fd, views)
                while views and written >= len(views[0]):
                    written -= len(views[0])
                    views.pop(0)
                if views and written:
                    views[0] = views[0][written:]
        except (BrokenPipeError, ValueError):  # ValueError: the stream was closed under us
            self.closed.add(id(out))
        except OSError as exc:  # a full disk under `> out.log`: silence the stream, not the job
            self.closed.add(id(out))
            if out is not self.stderr:
                self.note(
                    f"cannot write to stdout: {exc.strerror or exc}; task output goes on "
                    "to the logs and stderr only"
                )

    def task_output(self, task: TaskSpec, is_stderr: bool, data: bytes) -> None:
        with self.lock:
            self._output(task.label, is_stderr, data)

    def setup_output(self, host: str, data: bytes) -> None:
        """A host's --setup output, all of it on stderr as `[setup@host]` lines."""
        with self.lock:
            self._output(f"setup@{host}", True, data)

    def _output(self, label: str, is_stderr: bool, data: bytes) -> None:
        key = (label, is_stderr)
        prefixer = self.prefixers.get(key)
        if prefixer is None:
            prefixer = self.prefixers[key] = LinePrefixer(f"[{label}] ".encode())
        out = self.stderr if is_stderr else self.stdout
        self._write(out, prefixer.feed(data, time.monotonic()))
        due = prefixer.due()
        if due is not None:
            self.waiting.add(key)
            if self.next_due is None or due < self.next_due:
                self.next_due = due
                self._post(None)  # the console's thread shows it if the task goes quiet

    def _tick(self) -> None:
        """Show partial lines whose task went quiet (with the lock held)."""
        now = time.monotonic()
        if self.next_due is not None and now >= self.next_due:
            self.next_due = None
            for key in list(self.waiting):
                prefixer = self.prefixers[key]
                shown = prefixer.idle(now)
                if shown:
                    self._write(self.stderr if key[1] else self.stdout, [shown])
                due = prefixer.due()
                if due is None:
                    self.waiting.discard(key)
                else:
                    self.next_due = due if self.next_due is None else min(self.next_due, due)

    def task_closed(self, task: TaskSpec) -> None:
        """Show what is left of the task's last line (on the console's thread)."""
        self._post(lambda: self._task_closed(task))

    def _task_closed(self, task: TaskSpec) -> None:
        for is_stderr in (False, True):
            self.waiting.discard((task.label, is_stderr))
            prefixer = self.prefixers.pop((task.label, is_stderr), None)
            if prefixer is not None:
                rest = prefixer.flush()
                if rest:
                    self._write(self.stderr if is_stderr else self.stdout, [rest])

    def note(self, message: str) -> None:
        """A `dtrain:` line on stderr (on the console's thread, after what came before)."""
        line = f"dtrain: {message}\n".encode(errors="backslashreplace")  # a non-UTF-8 path
        self._post(lambda: self._write(self.stderr, [line]))

    def _post(self, work: Callable[[], None] | None) -> None:
        """Hand `work` (or, with None, a new partial-line deadline) to the console's thread."""
        with self.posted:
            if not self.closing:
                if work is not None:
                    self.pending.append(work)
                if self.writer is None:
                    self.writer = threading.Thread(
                        target=self._run, name="dtrain-console", daemon=True
                    )
                    self.writer.start()
                self.posted.notify()
                return
        if work is not None:  # after close: written here (the console lock after `posted`,
            with self.lock:  # never inside it, as the reader threads take them the other way)
                work()

    def _run(self) -> None:
        while True:
            with self.posted:
                while not self.pending and not self.closing:
                    due = self.next_due  # read without the console lock: a hint, rechecked
                    if due is not None and due <= time.monotonic():
                        break
                    self.posted.wait(None if due is None else due - time.monotonic())
                work, self.pending = self.pending, []
                last = self.closing and not work
            with self.lock:
                for item in work:
                    item()
                self._tick()
            if last:
                return

    def close(self) -> None:
        """Write what waits for the console's thread, and end it."""
        with self.posted:
            self.closing = True
            writer = self.writer
            self.posted.notify()
        if writer is not None:
            writer.join()
