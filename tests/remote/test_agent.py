"""The agent on its own, through a real local agent process: protocol, cleanup, byte-exactness."""

from __future__ import annotations

import json
import os
import queue
import signal
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from dtrain.agents import ops
from dtrain.agents.session import AgentEvent, AgentSession, LinkClosed
from dtrain.plan.hosts import local_host
from dtrain.plan.spec import Role, TaskSpec
from dtrain.remote import procs, proto
from dtrain.remote.agent import task_environment
from dtrain.remote.checks import exec_format_problem
from dtrain.remote.spawn import find_setpriv, spawn_argv
from dtrain.transport.bootstrap import agent_payload, boot_code
from dtrain.transport.local import LocalLink
from tests.conftest import (
    PYTHON,
    SESSION,
    SESSION_VAR,
    imported_by,
    job_pids,
    program,
    wait_for_line,
    wait_gone,
)


def task_spec(
    name: str, argv: list[str], env: dict[str, str], workdir: str | None = None
) -> TaskSpec:
    return TaskSpec(
        role=Role.WORKER,
        index=0,
        name=name,
        host=local_host("here"),
        address="127.0.0.1",
        argv=tuple(argv),
        env=env,
        label=f"{name}@here",
        log_name=f"{name}.log",
        workdir=workdir if workdir is not None else os.getcwd(),
    )


class Agent:
    """A local agent and the events it sends, for driving it by hand."""

    def __init__(self, env: dict[str, str] | None = None) -> None:
        self.events: queue.SimpleQueue[Any] = queue.SimpleQueue()
        self.link = LocalLink(env)
        self.session = AgentSession(local_host("here"), self.link, self.events)
        self.next_job = 0

    def hello(self, **fields: Any) -> dict[str, Any]:
        return self.session.request(proto.OP_HELLO, 10, **fields)

    def run(self, tasks: list[dict[str, Any]], **fields: Any) -> str:
        """Stage and start tasks given as {"name", "argv", "env"?, "workdir"?}; their ids are
        their indexes."""
        self.next_job += 1
        job = f"agent-test-{os.getpid()}-{self.next_job}"
        staged = [
            ops.task_fields(
                task_id,
                task_spec(
                    task["name"],
                    task["argv"],
                    {
                        proto.JOB_ID_VAR: job,
                        proto.TASK_VAR: task["name"],
                        SESSION_VAR: SESSION,
                        **task.get("env", {}),
                    },
                    task.get("workdir"),
                ),
            )
            for task_id, task in enumerate(tasks)
        ]
        self.session.request(proto.OP_STAGE, 10, job_id=job, tasks=staged, **fields)
        self.session.request(proto.OP_START, 10)
        return job

    def collect(self, count_exits: int, timeout_s: float = 20) -> list[AgentEvent]:
        """Events until `count_exits` EXITED frames arrived."""
        events: list[AgentEvent] = []
        exits = 0
        deadline = time.monotonic() + timeout_s
        while exits < count_exits:
            event = self.events.get(timeout=max(0.01, deadline - time.monotonic()))
            if isinstance(event, LinkClosed):
                break
            events.append(event)
            exits += event.kind == proto.EXITED
        return events

    def close(self) -> None:
        self.session.close()


@pytest.fixture
def agent() -> Iterator[Agent]:
    a = Agent()
    yield a
    a.close()


def output_of(events: list[AgentEvent], task: int, kind: int = proto.STDOUT) -> bytes:
    return b"".join(e.payload for e in events if e.task == task and e.kind == kind)


def exits(events: list[AgentEvent]) -> dict[int, dict[str, Any]]:
    return {e.task: e.json() for e in events if e.kind == proto.EXITED}


def test_hello_reports_the_facts_planning_needs(agent: Agent) -> None:
    facts = agent.hello(ports=3)
    assert facts["ok"] is True
    assert len(set(facts["free_ports"])) == 3
    assert facts["interfaces"]["lo"] == "127.0.0.1"
    assert facts["python"].count(".") == 2
    assert facts["pid"] != os.getpid()


def test_runs_tasks_relays_output_and_exit_codes(agent: Agent) -> None:
    agent.run(
        [
            {"name": "a", "argv": [PYTHON, program("exit_with.py"), "0"]},
            {"name": "b", "argv": [PYTHON, program("exit_with.py"), "4"]},
        ]
    )
    events = agent.collect(2)
    assert output_of(events, 0) == b"exiting with 0\n"
    assert output_of(events, 1, proto.STDERR) == b"stderr line before exit 4\n"
    assert exits(events)[0]["code"] == 0
    assert exits(events)[1]["code"] == 4
    assert not exits(events)[1][proto.EXITED_STOPPED_BY_DTRAIN]
    kinds = [e.kind for e in events if e.task == 0]
    assert kinds[0] == proto.STARTED and kinds[-1] == proto.EXITED


def test_large_output_arrives_complete_and_in_order(agent: Agent) -> None:
    agent.run([{"name": "a", "argv": [PYTHON, program("write_lots.py"), "20"]}])
    data = output_of(agent.collect(1, timeout_s=60), 0)
    lines = data.split(b"\n")[:-1]
    assert len(lines) == int(20 * 1024 * 1024 / 100)
    assert all(line.startswith(f"{i:08d} ".encode()) for i, line in enumerate(lines))


def test_stop_terms_then_kills_after_the_grace(agent: Agent) -> None:
    agent.run(
        [
            {"name": "a", "argv": [PYTHON, program("sleep_forever.py")]},
            {"name": "b", "argv": [PYTHON, program("ignore_sigterm.py")]},
        ],
        grace_s=0.5,
    )
    time.sleep(0.5)
    agent.session.stop(0.5)
    result = exits(agent.collect(2))
    assert result[0]["signal"] == signal.SIGTERM and result[0][proto.EXITED_STOPPED_BY_DTRAIN]
    assert result[1]["signal"] == signal.SIGKILL and result[1][proto.EXITED_STOPPED_BY_DTRAIN]


def test_unknown_command_and_missing_workdir_are_refused_before_start(agent: Agent) -> None:
    with pytest.raises(Exception, match="command not found: nope-not-here"):
        agent.session.request(
            proto.OP_STAGE,
            10,
            job_id="x",
            tasks=[ops.task_fields(0, task_spec("a", ["nope-not-here"], {}, "/"))],
        )
    with pytest.raises(Exception, match="working directory /no/such/dir does not exist"):
        agent.session.request(
            proto.OP_STAGE,
            10,
            job_id="x",
            tasks=[ops.task_fields(0, task_spec("a", ["true"], {}, "/no/such/dir"))],
        )


def test_a_program_without_a_shebang_is_refused_before_start_not_run_by_sh(
    agent: Agent, tmp_path: Path
) -> None:
    plain = tmp_path / "train.py"
    plain.write_text("import sys\nprint('ran as python')\n")
    plain.chmod(0o755)
    fields = ops.task_fields(0, task_spec("a", [str(plain)], {}, str(tmp_path)))
    if exec_format_problem(str(plain)):  # no binfmt_misc handler here that could take it
        with pytest.raises(Exception, match=r"(?s)train.py has no #! line .*-- python3 "):
            agent.session.request(proto.OP_STAGE, 10, job_id="x", tasks=[fields])
    else:
        agent.session.request(proto.OP_STAGE, 10, job_id="x", tasks=[fields])


def test_a_script_with_a_shebang_runs_through_the_spawn_path(agent: Agent, tmp_path: Path) -> None:
    script = tmp_path / "run.sh"
    script.write_text('#!/bin/sh\necho "ran with $# args: $1"\nexit 3\n')
    script.chmod(0o755)
    agent.run([{"name": "a", "argv": [str(script), "one two"]}])
    events = agent.collect(1)
    assert output_of(events, 0) == b"ran with 1 args: one two\n"
    assert [json.loads(e.payload)["code"] for e in events if e.kind == proto.EXITED] == [3]


def test_closed_stream_stops_every_task_and_the_agent_exits() -> None:
    a = Agent()
    job = a.run([{"name": "a", "argv": [PYTHON, program("spawn_tree.py")]}], grace_s=1)
    time.sleep(1.0)
    pids = job_pids(job)
    assert len(pids) == 5  # leader, child, escaped, middle, grandchild
    a.session.link.close_input()
    assert wait_gone(pids, 3) == []
    assert a.session.wait_closed(5)
    link = a.session.link  # it left without the interpreter's teardown, and cleanly
    assert isinstance(link, LocalLink)
    assert link.proc.wait(5) == 0
    a.close()
    assert link.stderr_text() == ""


def test_silent_launcher_past_the_lease_stops_every_task() -> None:
    a = Agent()
    a.hello(heartbeat_s=0.2, lease_s=1.0, grace_s=0.5)
    job = a.run([{"name": "a", "argv": [PYTHON, program("ignore_sigterm.py")]}])
    time.sleep(0.3)
    pids = job_pids(job)
    assert pids
    started = time.monotonic()
    assert wait_gone(pids, 5) == []  # no heartbeat is ever sent here
    assert time.monotonic() - started < 1.0 + 0.5 + 1.5
    a.close()


# util-linux's setpriv before 2.33: it runs, but has no --pdeathsig.
OLD_SETPRIV = """#!/bin/sh
if [ "$1" = --version ]; then echo "setpriv from util-linux 2.23.2"; exit 0; fi
echo "setpriv: unrecognized option '$1'" >&2
exit 1
"""


def path_with_setpriv(tmp_path: Path, which: str) -> str:
    """A PATH whose setpriv is this machine's, none, or one older than --pdeathsig."""
    if which == "this machine's":
        return os.environ["PATH"]
    folder = tmp_path / "bin"
    folder.mkdir()
    if which == "too old":
        (folder / "setpriv").write_text(OLD_SETPRIV)
        (folder / "setpriv").chmod(0o755)
    return str(folder)


@pytest.mark.parametrize("setpriv", ["this machine's", "none", "too old"])
def test_agent_killed_outright_still_takes_its_task_leaders_down(
    tmp_path: Path, setpriv: str
) -> None:
    a = Agent(env={**os.environ, "PATH": path_with_setpriv(tmp_path, setpriv)})
    job = a.run([{"name": "a", "argv": [PYTHON, program("sleep_forever.py")]}])
    time.sleep(0.3)
    pids = job_pids(job)
    link = a.session.link
    assert isinstance(link, LocalLink)
    os.kill(link.proc.pid, signal.SIGKILL)
    assert wait_gone(pids, 3) == []
    a.close()


@pytest.mark.parametrize(
    ("setpriv", "found"), [("this machine's", True), ("none", False), ("too old", False)]
)
def test_tasks_spawn_through_setpriv_only_where_it_sets_the_parent_death_signal(
    tmp_path: Path, setpriv: str, found: bool
) -> None:
    path = find_setpriv(path_with_setpriv(tmp_path, setpriv))
    assert (path is not None) == found
    argv = ["python3", "-u", "train.py", "--lr", "0.1"]
    if path is None:
        assert spawn_argv(argv, path) == argv
    else:
        assert os.path.isabs(path)
        assert spawn_argv(argv, path) == [path, "--pdeathsig", "KILL", "--", *argv]


def test_the_stage_checks_the_setpriv_once_and_the_start_uses_it(tmp_path: Path) -> None:
    """The check runs at the stage, before any start, and once."""
    real = find_setpriv()
    assert real is not None, "util-linux's setpriv (>= 2.33) is part of the test install"
    folder, calls = tmp_path / "bin", tmp_path / "calls"
    folder.mkdir()
    (folder / "setpriv").write_text(f'#!/bin/sh\necho "$*" >> {calls}\nexec {real} "$@"\n')
    (folder / "setpriv").chmod(0o755)
    a = Agent(env={**os.environ, "PATH": f"{folder}:{os.environ['PATH']}"})
    try:
        job = f"agent-test-{os.getpid()}-setpriv"
        staged = ops.task_fields(
            0,
            task_spec(
                "w",
                [PYTHON, "-c", "pass"],
                {proto.JOB_ID_VAR: job, proto.TASK_VAR: "w", SESSION_VAR: SESSION},
            ),
        )
        a.session.request(proto.OP_STAGE, 10, job_id=job, tasks=[staged])
        wait_for_line(calls, "--version", timeout_s=10)  # the check, before any start
        a.session.request(proto.OP_START, 10)
        assert exits(a.collect(1))[0]["code"] == 0
        calls_made = calls.read_text().splitlines()
        checks = [c for c in calls_made if c.startswith("--pdeathsig") and c.endswith("--version")]
        assert len(checks) == 1
        assert calls_made[-1].endswith(f"-- {PYTHON} -c pass")
    finally:
        a.close()


def test_what_a_launch_and_a_doctor_ask_of_the_agent_imports_only_the_standard_library(
    tmp_path: Path,
) -> None:
    """Hosts need nothing but python3: through a launch's requests (hello, listen, unlisten,
    scan, stage, start, a task's output and exit) and a doctor's (connect, the probe), the
    agent imports only standard modules."""
    bare = subprocess.run(
        [PYTHON, "-X", "importtime", "-c", "pass"], capture_output=True, text=True, check=True
    )
    (tmp_path / "train.py").write_text("print('hi')\n")
    fields: dict[str, Any] = {"interpreter": PYTHON, "workdir": str(tmp_path), "script": "train.py"}
    a = Agent(env={**os.environ, "PYTHONPROFILEIMPORTTIME": "1"})
    try:
        port = a.hello(ports=1)[proto.HELLO_FREE_PORTS][0]
        a.session.request(proto.OP_LISTEN, 10, address="127.0.0.1", port=port)
        target = {"to": "here", "address": "127.0.0.1", "port": port}
        connected = a.session.request(proto.OP_CONNECT, 10, targets=[target], wait_s=2.0)
        a.session.request(proto.OP_UNLISTEN, 10, ports=[port])
        a.session.request(proto.OP_SCAN, 10, job="no-such-job")
        facts = a.session.request(proto.OP_PROBE, 30, port=port, **fields)
        a.run([{"name": "w", "argv": [PYTHON, "-c", "print('hi')"]}])
        events = a.collect(1)
        a.link.close_input()  # the agent exits: its stderr holds every import it made
        a.link.proc.wait(timeout=10)
        loaded = imported_by(a.link.stderr_text()) - imported_by(bare.stderr)
    finally:
        a.close()
    assert connected[proto.CONNECT_RESULTS][0]["ok"], connected  # it ran, and said so
    assert facts["hostname"]["hostname"] and facts["interpreter"]["executable"], facts
    assert output_of(events, 0) == b"hi\n" and exits(events)[0]["code"] == 0
    assert {"selectors", "subprocess", "json", "threading"} <= loaded
    ours = {m for m in loaded if m.startswith("_dtrain_remote")}  # the agent's own, from stdin
    assert "_dtrain_remote.agent" in ours
    assert sorted(m for m in loaded - ours if m.split(".")[0] not in sys.stdlib_module_names) == []


def test_a_task_gets_default_signals_and_none_of_the_fds_the_agent_was_started_with(
    tmp_path: Path,
) -> None:
    """The agent's Python ignores SIGPIPE and SIGXFSZ, which a task must not inherit
    (`train.py | head` would never end it), and none of the agent's own fds reaches a task;
    a task starts in its own working directory, and the agent's stays where it was."""
    a = Agent()
    try:
        before = a.hello()["cwd"]
        workdir = str(tmp_path)
        fds = "import os; print(' '.join(os.listdir('/proc/self/fd')))"
        a.run(
            [
                {"name": "sig", "argv": ["grep", "SigIgn", "/proc/self/status"]},
                {"name": "fds", "argv": [PYTHON, "-c", fds]},
                {
                    "name": "cwd",
                    "argv": [PYTHON, "-c", "import os; print(os.getcwd())"],
                    "workdir": workdir,
                },
            ]
        )
        events = a.collect(3)
        after = a.hello()["cwd"]
    finally:
        a.close()
    ignored = int(output_of(events, 0).split()[1], 16)
    assert not ignored & (1 << (signal.SIGPIPE - 1) | 1 << (signal.SIGXFSZ - 1))
    assert {int(fd) for fd in output_of(events, 1).split()} <= {0, 1, 2, 3}  # and the listing's
    assert output_of(events, 2).decode().strip() == workdir
    assert after == before


def test_a_setpriv_found_through_a_relative_path_entry_is_not_used(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    real = find_setpriv()
    assert real is not None, "util-linux's setpriv (>= 2.33) is part of the test install"
    (tmp_path / "setpriv").symlink_to(real)
    monkeypatch.chdir(tmp_path)
    assert find_setpriv(".") is None  # a task's working directory is not the agent's


def test_scan_and_kill_find_tagged_processes_but_not_the_agent_itself(agent: Agent) -> None:
    job = agent.run([{"name": "a", "argv": [PYTHON, program("spawn_tree.py")]}])
    time.sleep(1.0)
    scanned = agent.session.request(proto.OP_SCAN, 10, job=job)
    pids = {p["pid"] for p in scanned["processes"]}
    assert len(pids) == 5
    link = agent.session.link
    assert isinstance(link, LocalLink)
    assert link.proc.pid not in pids
    killed = agent.session.request(proto.OP_KILL, 10, job=job, grace_s=1)
    assert sorted(killed["term"] + killed["kill"]) == sorted(pids)
    assert killed["survivors"] == []


def test_a_probes_helper_carries_no_job_tag_even_where_the_agent_does(tmp_path: Path) -> None:
    """The probe's helpers (the interpreter listing its packages) run without the agent's job
    tags: the agent's own scans pass over its helpers, but no tag of theirs may make them a
    job's process to anything else that reads their environment."""
    started, gate = tmp_path / "started", tmp_path / "gate"
    slow_python = tmp_path / "python3-gated"  # a python: waits at the gate, then is one
    slow_python.write_text(
        "#!/bin/sh\n"
        f"echo $$ > {started}; i=0\n"
        f"while [ ! -e {gate} ] && [ $i -lt 1000 ]; do sleep 0.01; i=$((i+1)); done\n"
        f'exec {PYTHON} "$@"\n'
    )
    slow_python.chmod(0o755)
    a = Agent(env=dict(os.environ, **{proto.JOB_ID_VAR: "outer-job", proto.TASK_VAR: "w.0"}))
    probed: queue.Queue[dict[str, Any]] = queue.Queue()
    fields: dict[str, Any] = {"interpreter": str(slow_python), "workdir": str(tmp_path)}
    try:
        a.hello()
        asking = threading.Thread(
            target=lambda: probed.put(a.session.request(proto.OP_PROBE, 30, **fields))
        )
        asking.start()
        helper = int(wait_for_line(started, "\n", timeout_s=10))
        environ = Path(f"/proc/{helper}/environ").read_bytes().split(b"\0")
        names = {entry.partition(b"=")[0].decode() for entry in environ}
        assert not names & set(proto.TAG_VARS), names & set(proto.TAG_VARS)
        gate.touch()
        asking.join(timeout=30)
        listed = probed.get(timeout=1)["interpreter"]
        assert listed.get("error") is None, listed
        assert listed["executable"] == PYTHON and "paramiko" in listed["distributions"]
    finally:
        gate.touch()
        a.close()


env_text = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=60
)
_shared: list[Agent] = []


def shared_agent() -> Agent:
    if not _shared:
        _shared.append(Agent())
    return _shared[0]


@settings(max_examples=60, deadline=None, suppress_health_check=[HealthCheck.too_slow])
@given(value=env_text, args=st.lists(env_text, max_size=4))
def test_env_values_and_arguments_arrive_byte_exact(value: str, args: list[str]) -> None:
    a = shared_agent()
    a.run(
        [
            {
                "name": "probe",
                "argv": [PYTHON, program("print_env.py"), "PROBE_VALUE", *args],
                "env": {"PROBE_VALUE": value},
            }
        ]
    )
    document = json.loads(output_of(a.collect(1), 0))
    assert document["env"] == {"PROBE_VALUE": value}
    assert document["argv"] == ["PROBE_VALUE", *args]


def teardown_module() -> None:
    for a in _shared:
        a.close()


def test_output_held_up_by_a_slow_launcher_comes_whole_and_in_order() -> None:
    """The session's output handler (the supervisor's log and console writes) runs on its
    reader thread; while it is stuck, the host is not silent, and the agent holds its tasks
    back instead of queueing without bound. Every byte still arrives, in order, and the
    task's exit only after its output."""
    frames: list[tuple[int, int, int]] = []  # (task, kind, size) as the handler saw them
    received = bytearray()
    release = threading.Event()
    stuck = threading.Event()

    def handler(task: int, kind: int, payload: bytes) -> None:
        if not frames:
            stuck.set()
            release.wait(10)  # a console that does not take output for a while
        frames.append((task, kind, len(payload)))
        received.extend(payload)

    agent = Agent()
    try:
        agent.session.output = handler
        agent.run([{"name": "a", "argv": [PYTHON, program("write_lots.py"), "8"]}])
        assert stuck.wait(20)
        time.sleep(1.0)  # the task goes on writing; the agent's queue fills
        assert agent.session.silent_for(time.monotonic() + 100) == 0.0
        release.set()
        events = agent.collect(1, timeout_s=60)
        exited_after = len(received)  # the exit was queued after the handler saw everything
    finally:
        release.set()
        agent.close()
    lines = received.split(b"\n")[:-1]
    assert len(lines) == int(8 * 1024 * 1024 / 100)
    assert all(line.startswith(f"{i:08d} ".encode()) for i, line in enumerate(lines))
    assert exited_after == len(received)
    assert exits(events)[0]["code"] == 0
    assert not output_of(events, 0)  # output went to the handler, not the queue


def test_a_task_inherits_no_managed_variable_of_any_framework_but_gets_the_plans() -> None:
    inherited = {"PATH": "/bin", "RANK": "7", "TF_CONFIG": "{}", "DMLC_WORKER_ID": "3"}
    env = task_environment(inherited, {"RANK": "0", "DTRAIN_TASK": "worker.0"})
    assert env == {"PATH": "/bin", "RANK": "0", "DTRAIN_TASK": "worker.0"}


def test_orphans_the_agent_adopts_are_reaped_while_the_job_runs(agent: Agent) -> None:
    script = "for i in 1 2 3 4 5 6; do (sleep 0.1 &); done; sleep 30"
    agent.run([{"name": "forker", "argv": ["bash", "-c", script]}])
    agent_pid = agent.link.proc.pid
    time.sleep(1.0)  # the orphans' own sleep is 0.1 s
    deadline = time.monotonic() + 10
    zombies: list[int] = [0]
    while zombies and time.monotonic() < deadline:
        table = procs.snapshot(with_tags=False)
        zombies = [p.pid for p in table.values() if p.ppid == agent_pid and p.state == "Z"]
        time.sleep(0.1)
    agent.session.stop(0.5)
    agent.collect(1)
    assert zombies == [], "the orphans the agent adopted were never reaped"


# The oldest Pythons the agent must run on, where this machine has them (pyenv's builds).
OLD_PYTHONS = sorted(
    str(path)
    for version in ("3.6", "3.7")
    for path in (Path.home() / ".pyenv" / "versions").glob(f"{version}.*/bin/python3")
)


class OldPythonLink:
    """The agent under another interpreter, started as the remote command starts it."""

    def __init__(self, python: str) -> None:
        self.proc = subprocess.Popen(
            [python, "-S", "-c", boot_code()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            start_new_session=True,
        )
        self.send(agent_payload())

    def send(self, data: bytes) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.write(data)
        self.proc.stdin.flush()

    def recv(self, size: int) -> bytes:
        assert self.proc.stdout is not None
        return os.read(self.proc.stdout.fileno(), size)

    def stderr_text(self) -> str:
        return ""  # it goes to the test's own stderr

    def close_input(self) -> None:
        assert self.proc.stdin is not None
        self.proc.stdin.close()

    def close(self) -> None:
        assert self.proc.stdout is not None
        self.close_input()
        self.proc.wait(timeout=10)
        self.proc.stdout.close()


@pytest.mark.skipif(not OLD_PYTHONS, reason="no Python 3.6 or 3.7 on this machine")
@pytest.mark.parametrize("python", OLD_PYTHONS)
def test_the_agent_runs_tasks_and_the_probe_on_the_oldest_pythons(
    python: str, tmp_path: Path
) -> None:
    events: queue.SimpleQueue[Any] = queue.SimpleQueue()
    session = AgentSession(local_host("here"), OldPythonLink(python), events)
    try:
        assert session.request(proto.OP_HELLO, 10, ports=1)["python"][:3] in ("3.6", "3.7")
        job = f"agent-test-{os.getpid()}-old"
        spec = task_spec(
            "w",
            ["sh", "-c", "pwd; exit 3"],
            {proto.JOB_ID_VAR: job, proto.TASK_VAR: "w", SESSION_VAR: SESSION},
            str(tmp_path),
        )
        session.request(proto.OP_STAGE, 10, job_id=job, tasks=[ops.task_fields(0, spec)])
        session.request(proto.OP_START, 10)
        seen: list[AgentEvent] = []
        while not any(e.kind == proto.EXITED for e in seen):
            seen.append(events.get(timeout=20))
        assert output_of(seen, 0) == f"{tmp_path}\n".encode()
        assert exits(seen)[0]["code"] == 3
        probed = session.request(proto.OP_PROBE, 30, interpreter=python, workdir=str(tmp_path))
        assert probed["interpreter"]["error"] is None and probed["interpreter"]["distributions"]
    finally:
        session.close()
