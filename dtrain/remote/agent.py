"""dtrain's agent: one per host for the life of one dtrain command.

The launcher starts it over ssh (or as a local process) and talks to it in frames over its
stdin/stdout. It answers questions about the host, starts the host's tasks each in its own
process group, relays their output and exit status, and stops them. It is the only thing that
can stop them when the launcher disappears, so it does, within a bounded time:

* the launcher's stream closes (launcher killed, connection dropped with a FIN): every task
  gets SIGTERM at once and SIGKILL after the job's grace;
* no frame from the launcher for `lease_s` seconds (network partition, no FIN): the same;
* the agent itself gets SIGTERM/SIGHUP: the same; and each task leader has a parent-death
  signal, so even SIGKILL of the agent takes the leaders down.

A job's agent is its tasks' subreaper: what a task leaves running outside its process group
and without its tag (a daemon, `setsid env -i cmd &`) becomes the agent's child, and stops
with the job.

Standard library only, Python >= 3.6, Linux: dtrain need not be installed on the host. What
it knows of its host is in `facts`, how it checks a task before starting it in `checks`, how
it starts processes in `spawn`.
"""

import os
import selectors
import signal
import sys
import threading
import time
from typing import Any, Dict, List, Optional  # noqa: F401 - used in type comments

from . import checks, facts, procs, proto, setup, spawn
from .tracebacks import TracebackWatch

# `probe` (doctor), `netprobe` (doctor, preflight), `stacks` and `files` (sync) are imported
# where a request needs them: a launch's agent loads and compiles only what it uses.

READ_CHUNK = 1 << 16
HIGH_WATER = 1 << 20  # stop reading task output while this much waits for the launcher
LOW_WATER = 1 << 18
DRAIN_S = 2.0  # after a task exits, how long its pipes may stay open (grandchildren)
SETUP_STDERR_BYTES = 4096  # the end of the setup's stderr its error shows
SETUP_DRAIN_READS = 64  # reads of each pipe once it exited (more: a background writer)
SETUP_CHECK_S = 0.1  # while stopping the setup: how often to look whether any of it is left
IDLE_CPU_FRACTION = 0.05
READ = selectors.EVENT_READ
WRITE = selectors.EVENT_WRITE


class Task:
    def __init__(self, spec):
        self.id = spec[proto.TASK_ID]
        self.name = spec[proto.TASK_NAME]
        self.argv = spec[proto.TASK_ARGV]
        self.env = spec[proto.TASK_ENV]
        self.cwd = spec[proto.TASK_CWD]
        self.script = spec.get(proto.TASK_SCRIPT)  # the file a python or shell command runs
        self.script_on_path = bool(spec.get(proto.TASK_SCRIPT_ON_PATH))
        self.proc = None
        self.pgid = None
        self.start_ticks = 0  # when it started, in clock ticks since boot
        self.files = {}  # fd -> frame kind
        self.code = None
        self.signal = None
        self.exited_at = None
        self.stopped_by_dtrain = False
        self.reason = None
        self.detail = None
        self.kill_at = None
        self.drain_until = None
        self.reported = False
        self.last_output = time.monotonic()
        self.traceback = TracebackWatch()

    @property
    def running(self):
        return self.proc is not None and self.exited_at is None


class Agent:
    def __init__(self, in_fd=0, out_fd=1):
        self.in_fd = in_fd
        self.out_fd = out_fd
        os.set_blocking(in_fd, False)
        os.set_blocking(out_fd, False)
        self.selector = selectors.DefaultSelector()
        self.reader = proto.FrameReader()
        self.out = bytearray()
        self.out_registered = False
        self.paused = False
        self.tasks = {}
        self.job_id = None
        self.heartbeat_s = 1.0
        self.lease_s = 15.0
        self.grace_s = 5.0
        self.traceback_timeout_s = 0.0
        self.last_heard = time.monotonic()
        self.last_sent = time.monotonic()
        self.gone = None  # why the launcher is considered gone
        self.signalled = None
        self.child_signalled = True
        self.data_handler = None
        self.data_abort = None  # undoes what data_handler did, if its data never ends
        self.is_subreaper = False
        self.strays_kill_at = None  # when strays that got SIGTERM get SIGKILL
        self.wake_r, self.wake_w = os.pipe()
        os.set_blocking(self.wake_r, False)
        os.set_blocking(self.wake_w, False)
        signal.set_wakeup_fd(self.wake_w)
        self.child_exited = False  # a SIGCHLD came: an adopted orphan may wait to be reaped
        signal.signal(signal.SIGCHLD, self._on_child_exit)
        for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
            signal.signal(signum, self._on_signal)
        # A dead stdout (a container's exec session ended) must not kill it before its tasks.
        signal.signal(signal.SIGPIPE, signal.SIG_IGN)
        self.handlers = {
            proto.OP_HELLO: self.op_hello,
            proto.OP_STAGE: self.op_stage,
            proto.OP_START: self.op_start,
            proto.OP_SCAN: self.op_scan,
            proto.OP_KILL: self.op_kill,
            proto.OP_PROBE: self.op_probe,
            proto.OP_LISTEN: self.op_listen,
            proto.OP_UNLISTEN: self.op_unlisten,
            proto.OP_CONNECT: self.op_connect,
            proto.OP_SYNC_PLAN: self.op_sync_plan,
            proto.OP_SYNC_PUT: self.op_sync_put,
            proto.OP_STACKS: self.op_stacks,
            proto.OP_SETUP: self.op_setup,
        }
        self.setup = None  # type: Optional[Task]  # the --setup shell, once started
        self.setup_request = {}  # type: Dict[str, Any]
        self.setup_result = ""  # the file its script writes to
        self.setup_deadline = None  # type: Optional[float]  # while no reply is sent
        self.setup_stderr = bytearray()  # the end of what it wrote to stderr
        self.setup_checked = 0.0  # when `check_setup_gone` last looked
        self.background_replies = []  # type: List[Dict[str, Any]]
        self.selector.register(in_fd, READ, "ctl")
        self.selector.register(self.wake_r, READ, "wake")

    def _on_signal(self, signum, frame):
        self.signalled = signum

    def _on_child_exit(self, signum, frame):
        self.child_exited = True

    # ---- main loop -------------------------------------------------------------------------

    def run(self):
        while not self.finished():
            events = self.selector.select(self.timeout())
            if not events:
                self.child_signalled = True  # a timer is due: look at every task anyway
            for key, _ in events:
                fd, data = key.fd, key.data
                if data == "ctl":
                    self.on_control()
                elif data == "wake":
                    self.drain_wakeups()
                elif data == "out":
                    self.flush()
                else:
                    task, kind = data
                    self.on_task_output(task, kind, fd)
            if self.child_signalled:  # a task can only have exited after a SIGCHLD
                self.child_signalled = False
                self.reap()
            if self.child_exited:
                self.child_exited = False
                self.reap_adopted()
            self.tick()
        self.flush(final=True)

    def finished(self):
        if self.gone is None or self.strays_kill_at is not None:
            return False
        return all(
            task.proc is None or (task.reported and task.kill_at is None)
            for task in self.every_task()
        )

    def every_task(self):
        """The job's tasks, and the setup while it (or what it left running) is the agent's."""
        return list(self.tasks.values()) + ([self.setup] if self.setup is not None else [])

    def timeout(self):
        now = time.monotonic()
        deadlines = [self.last_sent + self.heartbeat_s, self.last_heard + self.lease_s]
        if self.setup_deadline is not None:
            deadlines.append(self.setup_deadline)
        if self.setup is not None and self.setup.kill_at is not None:
            deadlines.append(now + SETUP_CHECK_S)
        for task in self.every_task():
            if task.kill_at is not None:
                deadlines.append(task.kill_at)
            if task.drain_until is not None and not task.reported:
                deadlines.append(task.drain_until)
        if self.strays_kill_at is not None:
            deadlines.append(self.strays_kill_at)
        if self.traceback_timeout_s > 0:
            deadlines.append(now + min(1.0, self.traceback_timeout_s))
        return max(0.0, min(deadlines) - now)

    def drain_wakeups(self):
        self.child_signalled = True  # a signal came: SIGCHLD, or one of ours
        try:
            while os.read(self.wake_r, 4096):
                pass
        except OSError:
            pass
        while self.background_replies:
            self.reply(self.background_replies.pop(0))

    # ---- launcher side ---------------------------------------------------------------------

    def on_control(self):
        try:
            data = os.read(self.in_fd, READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return
        except OSError:
            data = b""
        if not data:
            self.selector.unregister(self.in_fd)
            self.lose("the launcher's connection closed")
            return
        self.last_heard = time.monotonic()
        try:
            frames = self.reader.feed(data)
        except proto.FrameError as exc:
            self.lose("garbled stream from the launcher: %s" % exc)
            return
        for kind, _, payload in frames:
            if kind == proto.REQUEST:
                self.on_request(proto.decode_json(payload))
            elif kind == proto.STOP:
                self.stop_all(proto.decode_json(payload).get(proto.STOP_GRACE_S, self.grace_s))
            elif kind == proto.KILL:
                self.kill_all()
            elif kind == proto.DATA and self.data_handler is not None:
                self.data_handler(payload)

    def send(self, frame, payload=b""):
        """Queue `frame` (and `payload` after it) for the launcher. With nothing queued, both
        go straight to the stream in one writev: task output is not copied on its way."""
        if self.gone is not None:
            return
        self.last_sent = time.monotonic()
        if self.out:
            self.out += frame
            self.out += payload
        else:
            try:
                written = os.writev(self.out_fd, [frame, payload] if payload else [frame])
            except (BlockingIOError, InterruptedError):
                written = 0
            except OSError:
                self.lose("the launcher's connection closed")
                return
            if written < len(frame):
                self.out += memoryview(frame)[written:]
                self.out += payload
            elif written < len(frame) + len(payload):
                self.out += memoryview(payload)[written - len(frame) :]
            else:
                return
        self.flush()

    def reply(self, obj):
        self.send(proto.encode_json(proto.REPLY, obj))

    def flush(self, final=False):
        deadline = time.monotonic() + 5.0
        while self.out and self.gone is None:
            try:
                with memoryview(self.out) as view:
                    asked = min(len(view), READ_CHUNK * 4)
                    written = os.write(self.out_fd, view[:asked])
            except (BlockingIOError, InterruptedError):
                if not final or time.monotonic() > deadline:
                    break
                time.sleep(0.01)
                continue
            except OSError:
                self.lose("the launcher's connection closed")
                break
            del self.out[:written]
            if written < asked and not final:
                break  # the stream is full: select says when it takes more
        if self.gone is not None:
            del self.out[:]
        want = bool(self.out) and self.gone is None
        if want != self.out_registered:
            if want:
                self.selector.register(self.out_fd, WRITE, "out")
            else:
                self.selector.unregister(self.out_fd)
            self.out_registered = want
        self.apply_backpressure()

    def apply_backpressure(self):
        pause = len(self.out) > HIGH_WATER or (self.paused and len(self.out) > LOW_WATER)
        if pause == self.paused:
            return
        self.paused = pause
        for task in self.every_task():
            for fd, kind in task.files.items():
                if pause:
                    self.selector.unregister(fd)
                else:
                    self.selector.register(fd, READ, (task, kind))

    def lose(self, reason):
        """The launcher is gone: nobody will stop the tasks but us."""
        if self.gone is not None:
            return
        self.gone = reason
        if self.data_abort is not None:  # a copy cut short: remove its half-written file
            self.data_abort()
            self.data_handler = self.data_abort = None
        self.stop_all(self.grace_s)

    # ---- requests --------------------------------------------------------------------------

    def on_request(self, request):
        op = request.get(proto.OP)
        handler = self.handlers.get(op)
        if handler is None:
            self.reply({proto.ERROR: "this agent does not know the request %r" % op})
            return
        try:
            handler(request)
        except Exception as exc:  # a bug here must reach the launcher, not kill the agent
            self.reply(
                {proto.ERROR: "%s failed on this host: %s: %s" % (op, type(exc).__name__, exc)}
            )

    def op_hello(self, request):
        self.heartbeat_s = float(request.get("heartbeat_s", self.heartbeat_s))
        self.lease_s = float(request.get("lease_s", self.lease_s))
        self.grace_s = float(request.get("grace_s", self.grace_s))
        self.reply(dict(facts.host_facts(int(request.get("ports", 0))), ok=True))

    def op_stage(self, request):
        self.job_id = request["job_id"]
        self.grace_s = float(request.get("grace_s", self.grace_s))
        self.traceback_timeout_s = float(request.get("traceback_timeout_s", 0))
        tasks = [Task(spec) for spec in request[proto.STAGE_TASKS]]
        problems = []
        for task in tasks:
            problem = checks.check_runnable(task)
            if problem and problem not in problems:
                problems.append(problem)
        if problems:
            self.reply({proto.ERROR: "; ".join(p[0] for p in problems), proto.HINT: problems[0][1]})
            return
        self.tasks = {task.id: task for task in tasks}
        spawn.host_setpriv()  # checked once, before the start
        self.is_subreaper = self.is_subreaper or spawn.become_subreaper()
        self.reply({"ok": True})

    def op_start(self, request):
        for task in self.tasks.values():
            self.spawn(task)
        self.reply({"ok": True})

    def op_setup(self, request):
        """Start the --setup commands; the reply comes once they are done (`reap_setup`), or
        with an error once they ran past their time (`tick`)."""
        if self.setup is not None:
            self.reply({proto.ERROR: "the setup ran on this host already"})
            return
        self.job_id = request[proto.SETUP_JOB]
        commands = request[proto.SETUP_COMMANDS]
        shell = os.environ.get("SHELL") or "/bin/sh"
        self.setup_result = setup.new_result_file()
        argv = [shell, "-c", setup.script(commands, sys.executable, self.setup_result), shell]
        task = Task(
            {
                proto.TASK_ID: proto.SETUP_TASK,
                proto.TASK_NAME: request[proto.SETUP_NAME],
                proto.TASK_ARGV: argv,
                proto.TASK_ENV: setup.shell_env(self.job_id, request[proto.SETUP_NAME]),
                proto.TASK_CWD: os.getcwd(),
            }
        )
        task.reported = True  # its end is the setup's reply, not an EXITED frame
        problem = self.start_task(task)
        if problem is not None:
            setup.read_result(self.setup_result)
            self.reply({proto.ERROR: "cannot run the setup in %s: %s" % (shell, problem)})
            return
        self.setup, self.setup_request = task, request
        self.setup_deadline = time.monotonic() + float(request[proto.SETUP_TIMEOUT_S])

    def reap_setup(self):
        """Answer the setup request once its shell exits. What it started in the background
        stays (an ssh-agent its tasks use) until the job ends: it carries the job's tag."""
        task = self.setup
        if task is None or task.proc is None or task.exited_at is not None:
            return
        status = task.proc.poll()
        if status is None:
            return
        task.exited_at = time.monotonic()
        if self.setup_deadline is None:
            return  # answered already (it ran past its time)
        for fd, kind in list(task.files.items()):  # what it wrote goes out before its reply
            for _ in range(SETUP_DRAIN_READS):
                if fd not in task.files or not self.on_task_output(task, kind, fd):
                    break
        self.setup_deadline = None
        commands = self.setup_request[proto.SETUP_COMMANDS]
        env, problem = setup.outcome(setup.read_result(self.setup_result), status, commands)
        if env is not None:
            os.environ.clear()
            os.environ.update(env)
            self.reply({"ok": True})
            return
        self.reply({proto.ERROR: problem + self.setup_said(), proto.HINT: setup.HINT_FAILED})
        self.stop_setup(self.grace_s)

    def setup_timed_out(self):
        """The setup ran past its time: say where it was, and stop it."""
        self.setup_deadline = None
        timeout_s = float(self.setup_request[proto.SETUP_TIMEOUT_S])
        commands = self.setup_request[proto.SETUP_COMMANDS]
        at = setup.current(setup.read_result(self.setup_result), commands)
        self.reply(
            {
                proto.ERROR: "the setup did not finish within %gs (still running: `%s`)%s"
                % (timeout_s, setup.shown(at), self.setup_said()),
                proto.HINT: setup.HINT_TIMEOUT,
            }
        )
        self.stop_setup(self.grace_s)

    def setup_said(self):
        """The last lines of the setup's stderr, for its error."""
        lines = bytes(self.setup_stderr).decode("utf-8", "replace").strip().splitlines()
        return "; its stderr ended: %s" % " | ".join(lines[-5:]) if lines else ""

    def stop_setup(self, grace_s):
        """TERM the setup's group and whatever carries its tag; KILL after `grace_s`."""
        task = self.setup
        if task is None or task.kill_at is not None:
            return
        if self.setup_deadline is not None:  # still unanswered: the launcher went away
            self.setup_deadline = None
            setup.read_result(self.setup_result)
        if task in self.signal_tasks([task], signal.SIGTERM):
            task.kill_at = time.monotonic() + max(float(grace_s), 0.0)

    def check_setup_gone(self, now):
        """While its KILL is due: nothing of the setup left means nothing to wait for."""
        task = self.setup
        if task is None or task.kill_at is None or now >= task.kill_at:
            return
        if now - self.setup_checked >= SETUP_CHECK_S:
            self.setup_checked = now
            if not self.signal_tasks([task], 0):
                task.kill_at = None

    def op_scan(self, request):
        window_s = float(request.get(proto.SCAN_CPU_WINDOW_S) or 0.0)
        found = procs.scan(request.get("job"), request.get("include_dmlc", True), window_s)
        self.reply(dict(found, ok=True))

    def op_kill(self, request):
        reply = procs.kill(
            request.get("job"),
            include_dmlc=request.get("include_dmlc", True),
            grace_s=float(request.get("grace_s", 5.0)),
            dry_run=bool(request.get("dry_run")),
        )
        self.last_heard = time.monotonic()  # the grace ran inside this request: not a silence
        self.reply(dict(reply, ok=True))

    def op_probe(self, request):
        """Facts `dtrain doctor` compares across hosts (see probe.py)."""
        from . import probe

        self.reply(dict(probe.facts(request), ok=True))
        self.last_heard = time.monotonic()  # helper programs ran inside this request: not a silence

    def op_listen(self, request):
        from . import netprobe

        address, port = request[proto.LISTEN_ADDRESS], int(request.get(proto.LISTEN_PORT, 0))
        self.reply(dict(netprobe.listen(address, port), ok=True))

    def op_unlisten(self, request):
        from . import netprobe

        self.reply({"ok": True, "open": netprobe.unlisten(request.get("ports"))})

    def op_connect(self, request):
        from . import netprobe

        targets = request[proto.CONNECT_TARGETS]
        results = netprobe.connect_all(targets, float(request.get("wait_s", 2.0)))
        self.last_heard = time.monotonic()
        self.reply({"ok": True, proto.CONNECT_RESULTS: results})

    def op_stacks(self, request):
        """Answered from a thread: py-spy may take seconds, and a STOP or KILL from the
        launcher meanwhile must act at once."""
        from . import stacks

        def work():
            try:
                reply = dict(stacks.take(request), ok=True)
            except Exception as exc:
                why = "%s: %s" % (type(exc).__name__, exc)
                reply = {proto.ERROR: "stacks failed on this host: " + why}
            self.background_replies.append(reply)
            try:
                os.write(self.wake_w, b"s")
            except OSError:
                pass

        threading.Thread(target=work, daemon=True).start()

    def op_sync_plan(self, request):
        from . import files

        try:
            need = files.plan(request)
        except (OSError, ValueError) as exc:
            self.reply(
                {
                    proto.ERROR: "cannot prepare %s: %s" % (request["dst"], files.describe(exc)),
                    proto.HINT: "check that the user can write there, "
                    "or pick another --sync-dst-dir",
                }
            )
            return
        self.reply({"ok": True, proto.SYNC_NEED: need})

    def op_sync_put(self, request):
        from . import files

        receiver = files.Receiver(request["dst"], request["files"])

        def on_data(payload):
            if payload:
                receiver.feed(payload)
                return
            self.data_handler = self.data_abort = None
            receiver.abort()  # a stream that ended early leaves no half-written file
            if receiver.error is not None:
                self.reply(
                    {proto.ERROR: receiver.error, proto.HINT: "check free space and permissions"}
                )
            elif not receiver.done:
                self.reply({proto.ERROR: "the file stream ended early"})
            else:
                self.reply({"ok": True, proto.SYNC_WRITTEN: receiver.written})

        self.data_handler = on_data
        self.data_abort = receiver.abort

    # ---- tasks -----------------------------------------------------------------------------

    def spawn(self, task):
        note = checks.gpu_note(task.env)
        if note is not None:
            message = {proto.NOTICE_MESSAGE: "%s: %s" % (task.name, note)}
            self.send(proto.encode_json(proto.NOTICE, message, task.id))
        problem = self.start_task(task)
        if problem is not None:
            task.proc = None
            task.code = 126 if isinstance(problem, PermissionError) else 127
            task.reason = proto.REASON_SPAWN_FAILED
            task.detail = "cannot run %s: %s" % (task.argv[0], problem.strerror or problem)
            task.exited_at = time.monotonic()
            self.maybe_report(task)  # a task never started: no signal, no pipes, not stopped
            return
        self.send(
            proto.encode_json(
                proto.STARTED,
                {
                    proto.STARTED_PID: task.proc.pid,
                    proto.STARTED_PGID: task.pgid,
                    proto.EVENT_TIME: time.time(),
                },
                task.id,
            )
        )

    def start_task(self, task):
        """Start `task` in a session of its own with its output relayed; the OSError if it
        cannot start."""
        env = task_environment(os.environ, task.env)
        out_r, out_w = os.pipe()
        err_r, err_w = os.pipe()
        try:
            task.proc = spawn.start_task(task.argv, task.cwd, env, out_w, err_w)
        except OSError as exc:
            os.close(out_r)
            os.close(err_r)
            return exc
        finally:
            os.close(out_w)
            os.close(err_w)
        task.pgid = task.proc.pid
        stat = procs.read_stat(task.proc.pid)
        task.start_ticks = stat[5] if stat else 0
        for fd, kind in ((out_r, proto.STDOUT), (err_r, proto.STDERR)):
            os.set_blocking(fd, False)
            task.files[fd] = kind
            if not self.paused:
                self.selector.register(fd, READ, (task, kind))
        task.last_output = time.monotonic()
        return None

    def on_task_output(self, task, kind, fd):
        """Relay what `fd` holds now (one read); how many bytes that was."""
        try:
            data = os.read(fd, READ_CHUNK)
        except (BlockingIOError, InterruptedError):
            return 0
        except OSError:
            data = b""
        if not data:
            self.close_pipe(task, fd)
            self.maybe_report(task)
            return 0
        now = time.monotonic()
        task.last_output = now
        if kind == proto.STDERR and task.traceback.feed(data):
            task.traceback.mark_time = now
            task.traceback.mark_cpu = self.cpu_of(task)
        if task is self.setup:
            if kind == proto.STDERR:
                self.setup_stderr += data
                del self.setup_stderr[:-SETUP_STDERR_BYTES]
            if self.setup_deadline is None:
                return len(data)  # answered: what it left running writes to no one
        self.send(proto.HEADER.pack(kind, task.id, len(data)), data)
        return len(data)

    def close_pipe(self, task, fd):
        del task.files[fd]
        if not self.paused:
            try:
                self.selector.unregister(fd)
            except (KeyError, ValueError):
                pass
        os.close(fd)

    def reap(self):
        self.reap_setup()
        now = time.monotonic()
        exited = []
        for task in self.tasks.values():
            if not task.running:
                continue
            status = task.proc.poll()
            if status is None:
                continue
            task.exited_at = now
            if status < 0:
                task.signal = -status
            else:
                task.code = status
            task.drain_until = now + DRAIN_S
            exited.append(task)
        if not exited:
            return
        # Grandchildren die with their task: whatever is left of its group, or carries its tag
        # after escaping the group, goes too.
        leftovers = self.signal_tasks(exited, signal.SIGTERM)
        for task in exited:
            if task in leftovers:
                soon = now + min(self.grace_s, 2.0)
                task.kill_at = soon if task.kill_at is None else min(task.kill_at, soon)
            else:
                task.kill_at = None
            self.maybe_report(task)

    def maybe_report(self, task):
        if task.reported or task.exited_at is None:
            return
        if task.files and time.monotonic() < (task.drain_until or 0):
            return
        for fd in list(task.files):
            self.close_pipe(task, fd)
        task.reported = True
        self.send(
            proto.encode_json(
                proto.EXITED,
                {
                    proto.EXITED_CODE: task.code,
                    proto.EXITED_SIGNAL: task.signal,
                    proto.EXITED_STOPPED_BY_DTRAIN: task.stopped_by_dtrain,
                    proto.EXITED_REASON: task.reason,
                    proto.EXITED_DETAIL: task.detail,
                    proto.EVENT_TIME: time.time(),
                },
                task.id,
            )
        )

    def signal_tasks(self, tasks, signum):
        """Signal each task's process group and every process carrying its tag.

        Returns the tasks that still had a process to signal.
        """
        hit = set()
        for task in tasks:
            if task.pgid is None:
                continue
            try:
                os.killpg(task.pgid, signum)
                hit.add(task)
            except OSError:
                pass
        if self.job_id is not None and tasks:
            names = {task.name: task for task in tasks}
            table = procs.snapshot(since_ticks=min(task.start_ticks for task in tasks))
            mine = procs.ancestors(os.getpid(), table)
            for pid in procs.select_job_processes(table, job=self.job_id, exclude=mine):
                owner = names.get(table[pid].tags.get(proto.TASK_VAR))
                if owner is None:
                    continue
                try:
                    os.kill(pid, signum)
                    hit.add(owner)
                except OSError:
                    pass
        return hit

    def stop_all(self, grace_s):
        now = time.monotonic()
        chosen = [t for t in self.tasks.values() if t.running and t.kill_at is None]
        for task in chosen:
            task.stopped_by_dtrain = True
            task.kill_at = now + max(float(grace_s), 0.0)
        self.signal_tasks(chosen, signal.SIGTERM)
        if self.signal_strays(signal.SIGTERM) and self.strays_kill_at is None:
            self.strays_kill_at = now + max(float(grace_s), 0.0)
        self.stop_setup(grace_s)

    def kill_all(self):
        chosen = [t for t in self.every_task() if t.proc is not None]
        for task in chosen:
            if task.running:
                task.stopped_by_dtrain = True
            task.kill_at = None
        self.signal_tasks(chosen, signal.SIGKILL)
        self.signal_strays(signal.SIGKILL)
        self.strays_kill_at = None

    def strays(self, table):
        """What the tasks left below the agent outside their process groups (a daemon in a
        session of its own, adopted by the agent once its parent exited): every descendant
        but the tasks' groups, which `signal_tasks` stops, and the agent's own helpers."""
        me = os.getpid()
        groups = set(task.pgid for task in self.every_task() if task.pgid is not None)
        leaders = set(task.proc.pid for task in self.every_task() if task.proc is not None)
        helpers = set(pid for pid in table if pid not in leaders and spawn.is_started_here(pid))
        for pid in list(helpers):
            helpers.update(procs.descendants(table, pid))
        return sorted(
            pid
            for pid in procs.descendants(table, me)
            if pid not in helpers and table[pid].pgid not in groups and table[pid].state != "Z"
        )

    def signal_strays(self, signum):
        """Signal every stray (see `strays`); whether there was one. Only a subreaper agent
        has its tasks' orphans below it; elsewhere they went to init."""
        if not self.is_subreaper or not self.tasks:
            return False
        found = self.strays(procs.snapshot(with_tags=False))
        for pid in found:
            try:
                os.kill(pid, signum)
            except OSError:
                pass
        return bool(found)

    def reap_adopted(self):
        """Reap the orphans the agent adopted (their exits are its SIGCHLDs now), and end the
        strays' grace once none is left."""
        if not self.is_subreaper:
            return
        table = procs.snapshot(with_tags=False)
        me = os.getpid()
        spawn.reap_adopted(pid for pid, p in table.items() if p.ppid == me and p.state == "Z")
        if self.strays_kill_at is not None and not self.strays(table):
            self.strays_kill_at = None

    def cpu_of(self, task):
        stat = procs.read_stat(task.proc.pid) if task.proc is not None else None
        return stat[4] if stat else 0.0

    def tick(self):
        now = time.monotonic()
        if self.signalled is not None:
            signum, self.signalled = self.signalled, None
            self.lose("the agent received signal %d" % signum)
        if self.gone is None and now - self.last_heard > self.lease_s:
            self.lose("no word from the launcher for %.0fs" % self.lease_s)
        if self.gone is None and now - self.last_sent >= self.heartbeat_s:
            self.send(proto.encode(proto.PING))
        if self.strays_kill_at is not None and now >= self.strays_kill_at:
            self.strays_kill_at = None
            self.signal_strays(signal.SIGKILL)
        due = [t for t in self.every_task() if t.kill_at is not None and now >= t.kill_at]
        for task in due:
            task.kill_at = None
        if due:
            self.signal_tasks(due, signal.SIGKILL)
        if self.setup_deadline is not None and now >= self.setup_deadline:
            self.setup_timed_out()
        self.check_setup_gone(now)
        for task in self.tasks.values():
            if task.drain_until is not None:
                self.maybe_report(task)
            if self.traceback_timeout_s > 0 and task.running and task.kill_at is None:
                self.check_traceback(task, now)

    def check_traceback(self, task, now):
        watch = task.traceback
        if watch.state != TracebackWatch.COMPLETE:
            return
        quiet_since = max(watch.mark_time, task.last_output)
        if now - quiet_since < self.traceback_timeout_s:
            return
        cpu = self.cpu_of(task)
        if cpu - watch.mark_cpu > IDLE_CPU_FRACTION * (now - watch.mark_time):
            watch.mark_time, watch.mark_cpu = now, cpu  # still computing: not hung yet
            return
        task.reason = proto.REASON_TRACEBACK_HANG
        task.detail = watch.last_line.decode("utf-8", "replace")
        self.signal_tasks([task], signal.SIGTERM)
        task.kill_at = now + self.grace_s


MANAGED_VARS = frozenset(name for names in proto.MANAGED_VARS.values() for name in names)


def task_environment(inherited, planned):
    """What a task runs with: the environment it inherits (the launcher's on this machine, the
    login environment elsewhere) without any variable dtrain manages for any framework, then
    the plan's variables. A stale rank or address from that environment never passes."""
    env = {key: value for key, value in inherited.items() if key not in MANAGED_VARS}
    env.update(planned)
    return env


def main():
    """Run the agent; once it is done, leave at once: a helper thread still bounded in its
    time (a resolver, py-spy) is not waited for."""
    agent = Agent()
    try:
        agent.run()
    except Exception:
        # Never leave tasks behind because of a bug in here.
        agent.signal_tasks([t for t in agent.every_task() if t.proc is not None], signal.SIGKILL)
        agent.signal_strays(signal.SIGKILL)
        raise
    agent.signal_strays(signal.SIGKILL)  # any started during the grace
    for stream in (sys.stdout, sys.stderr):
        try:
            stream.flush()
        except Exception:
            pass
    os._exit(0)
