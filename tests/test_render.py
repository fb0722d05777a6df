from __future__ import annotations

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtrain.errors import DtrainError, Problem, group_problems
from dtrain.launch.results import JobResult, JobState, TaskExit
from dtrain.plan.spec import Framework
from dtrain.render import (
    LONG_ENV_VALUE,
    LinePrefixer,
    envelope,
    last_segment,
    plan_text,
    result_text,
)


def test_prefixes_each_line_and_holds_back_a_partial_line() -> None:
    p = LinePrefixer(b"[w.0] ")
    assert p.feed_bytes(b"a\nb") == b"[w.0] a\n"
    assert p.feed_bytes(b"c\n\nd") == b"[w.0] bc\n[w.0] \n"
    assert p.flush() == b"[w.0] d\n"
    assert p.flush() == b""


def test_a_huge_line_without_newline_is_flushed_in_pieces() -> None:
    p = LinePrefixer(b"> ")
    out = p.feed_bytes(b"x" * 70000)
    assert out.startswith(b"> xxx") and out.endswith(b"\n")


def test_a_huge_line_ends_without_an_empty_prefixed_line() -> None:
    p = LinePrefixer(b"> ")
    shown = p.feed_bytes(b"x" * 70000) + p.feed_bytes(b"x" * 10) + p.feed_bytes(b"\n")
    assert shown == b"> " + b"x" * 70000 + b"\n> xxxxxxxxxx\n"


# (chunks fed at these times, the console's idle check before each, then at idle_at) -> shown
CASES: list[tuple[list[tuple[float, bytes]], float, bytes]] = [
    ([(0, b"partial")], 0.1, b""),  # not idle long enough
    ([(0, b"partial")], 0.2, b"> partial\n"),
    ([(0, b"partial"), (0.1, b" rest\n")], 1, b"> partial rest\n"),
    ([(0, b"partial"), (1, b" rest\n")], 2, b"> partial\n>  rest\n"),
    ([(0, b"partial"), (1, b"\nnext\n")], 0.5, b"> partial\n> next\n"),  # no empty line
    ([(0, b"a\r\n"), (1, b"\n")], 2, b"> a\n> \n"),  # CRLF; blank lines stay
    ([(0, b"\r10%"), (0.1, b"\r20%"), (0.2, b"\r30%")], 0.3, b"> 10%\n"),
    ([(0, b"\r10%"), (0.1, b"\r20%"), (0.2, b"\r30%")], 0.4, b"> 10%\n> 30%\n"),
    ([(0, b"\r10%"), (0.1, b"\r20%"), (0.3, b"\r30%")], 0.3, b"> 10%\n> 30%\n"),
    ([(0, b"\r1\r2\r3\n")], 1, b"> 3\n"),  # a terminal shows the last
    ([(0, b"\r10%"), (0.1, b"\r20%\r"), (0.15, b"\n")], 1, b"> 10%\n> 20%\n"),
    ([(0, b"saving\r"), (0.5, b"")], 0.5, b"> saving\n"),
    ([(0, b"x\n\r\n")], 1, b"> x\n> \n"),
]


@pytest.mark.parametrize(("chunks", "idle_at", "shown"), CASES)
def test_partial_lines_and_updates_show_as_a_terminal_would(
    chunks: list[tuple[float, bytes]], idle_at: float, shown: bytes
) -> None:
    p = LinePrefixer(b"> ")
    out = b"".join(p.idle(now) + p.feed_bytes(data, now) for now, data in chunks)
    assert out + p.idle(idle_at) == shown


@given(st.lists(st.binary(max_size=50).map(lambda b: b.replace(b"\r", b"")), max_size=20))
def test_prefixing_keeps_every_byte_in_order(chunks: list[bytes]) -> None:
    p = LinePrefixer(b"[t] ")
    out = b"".join(p.feed_bytes(c) for c in chunks) + p.flush()
    data = b"".join(chunks)
    expected_lines = data.split(b"\n")
    if expected_lines and expected_lines[-1] == b"":
        expected_lines.pop()
    assert out == b"".join(b"[t] " + line + b"\n" for line in expected_lines)


@given(st.lists(st.sampled_from([b"\r", b"\n", b"a", b"bc", b"\r\n"]), max_size=30))
def test_updates_never_show_a_carriage_return_nor_an_empty_line_that_was_not_there(
    chunks: list[bytes],
) -> None:
    p = LinePrefixer(b"[t] ")
    out = b"".join(p.idle(now) + p.feed_bytes(c, now) for now, c in enumerate(chunks))
    out += p.flush()
    assert b"\r" not in out
    blank = [line for line in b"".join(chunks).split(b"\n")[:-1] if not last_segment(line)]
    assert out.split(b"\n").count(b"[t] ") <= len(blank)


def exit_(task: str, **fields: object) -> TaskExit:
    base: dict[str, object] = {
        "task": task,
        "label": f"{task}@h2",
        "host": "h2",
        "exit_code": 0,
        "signal": None,
        "started_at": 1.0,
        "finished_at": 1795000000.0,
        "stopped_by_dtrain": False,
        "log_path": f"logs/{task}.log",
    }
    base.update(fields)
    return TaskExit(**base)  # type: ignore[arg-type]


def test_failure_summary_puts_the_root_cause_first_with_evidence() -> None:
    cause = exit_("worker.1", exit_code=3, stderr_tail=("Traceback (most recent call last):", "E"))
    result = JobResult(
        job_id="J",
        state=JobState.FAILED,
        exits=(cause, exit_("server.0", signal=15, stopped_by_dtrain=True, exit_code=None)),
        root_cause=cause,
        started_at=0.0,
        ended_at=1.0,
        log_dir="logs",
    )
    text = result_text(result)
    first, *rest = text.splitlines()
    assert first.startswith("dtrain: job J failed: worker.1@h2 exited with code 3 at ")
    assert first.endswith("(first failure)")
    assert "    | Traceback (most recent call last):" in rest
    assert "  full log: logs/worker.1.log" in rest
    assert "  1 other task was stopped by dtrain after this failure" in rest
    assert result.exit_code == 3


def test_exit_codes_follow_the_root_cause() -> None:
    assert exit_("w", exit_code=None, signal=9).status_code == 137
    assert exit_("w", exit_code=None, reason="lost", detail="x").status_code == 255
    assert exit_("w", exit_code=None, signal=15, reason="traceback-hang").status_code == 1
    assert exit_("w", exit_code=0).failed is False
    assert exit_("w", exit_code=None, signal=15, stopped_by_dtrain=True).failed is False


def test_json_envelope_has_the_documented_shape() -> None:
    document = envelope("kill", 3, {"x": 1}, [Problem("down", host="h1", hint="h", code="timeout")])
    assert document == {
        "dtrain_json": 1,
        "command": "kill",
        "status": "failed",
        "exit_code": 3,
        "data": {"x": 1},
        "errors": [{"code": "timeout", "host": "h1", "message": "down", "hint": "h"}],
    }


def refused(name: str, port: int = 22) -> Problem:
    return Problem(
        f"{name}:{port}: connection refused",
        host=name,
        hint=f"is sshd running on {name} and listening on port {port}?",
        code="refused",
        reason="connection refused",
        subject=f"{name}:{port}",
        group_hint="is sshd running on these hosts?",
    )


@pytest.mark.parametrize(
    ("problems", "lines"),
    [
        (
            [refused("a")],
            [
                "  a:22: connection refused",
                "    hint: is sshd running on a and listening on port 22?",
            ],
        ),
        (
            [refused("a"), refused("b")],
            [
                "  2 hosts: connection refused: a:22 and b:22",
                "    hint: is sshd running on these hosts?",
            ],
        ),
        (
            [refused(f"h{i}") for i in range(2000)],
            [
                "  2000 hosts: connection refused: h0:22, h1:22, h2:22 and 1997 more",
                "    hint: is sshd running on these hosts?",
            ],
        ),
        (  # one hint shared by every host is kept as it is
            [
                Problem("x: down", host="x", hint="h", reason="down"),
                Problem("y: down", host="y", hint="h", reason="down"),
            ],
            ["  2 hosts: down: x and y", "    hint: h"],
        ),
        (  # distinct reasons stay apart, in order; problems without a reason are never merged
            [refused("a"), Problem("odd", host="b"), refused("c"), Problem("odd", host="d")],
            [
                "  2 hosts: connection refused: a:22 and c:22",
                "    hint: is sshd running on these hosts?",
                "  b: odd",
                "  d: odd",
            ],
        ),
    ],
)
def test_problems_with_one_reason_print_as_one_line(
    problems: list[Problem], lines: list[str]
) -> None:
    error = DtrainError("cannot reach them", problems=problems)
    assert str(error).splitlines() == ["dtrain: cannot reach them", *lines]
    assert error.to_problems() == problems  # JSON keeps one problem per host


@given(st.lists(st.sampled_from(["a", "b", "c"]), max_size=30))
def test_grouping_keeps_every_problem_once(reasons: list[str]) -> None:
    problems = [Problem(f"h{i}: {r}", host=f"h{i}", reason=r) for i, r in enumerate(reasons)]
    groups = group_problems(problems)
    assert sorted((p for g in groups for p in g), key=problems.index) == problems
    assert len(groups) == len(set(reasons))


def test_a_long_value_every_task_shares_is_shown_once_in_the_dry_run() -> None:
    from tests.plan.test_planner import hosts, plan

    many = "".join(f"h{n} slots=4\n" for n in range(1, 11))
    p = plan(framework=Framework.PADDLE, num_workers=40, hosts=hosts(many))
    endpoints = p.tasks[0].env["PADDLE_TRAINER_ENDPOINTS"]
    assert len(endpoints) > LONG_ENV_VALUE
    text = plan_text(p)
    assert text.count(endpoints) == 1
    first = p.tasks[0].name
    assert f"PADDLE_TRAINER_ENDPOINTS=<as {first}>" in text
    short = p.tasks[1].env["PADDLE_TRAINER_ID"]
    assert f"PADDLE_TRAINER_ID={short}" in text  # short values are always shown


def test_ps_shows_what_dead_launchers_left_and_counts_the_older_ones_that_left_nothing() -> None:
    from dtrain.processes.launcher import DeadLauncherJob, Launcher
    from dtrain.processes.results import HostScan, JobProcess
    from dtrain.render.processes import ps_text

    dead = [
        DeadLauncherJob(f"J{i}", f"logs/J{i}", Launcher(pid=100 + i, host="h")) for i in range(9)
    ]
    left = JobProcess.from_agent({"pid": 7, "tags": {"DTRAIN_JOB_ID": "J0"}}, now=0.0)
    lines = ps_text([HostScan("h", (left,), is_local=True)], dead).splitlines()
    start = lines.index("9 jobs whose launcher died (job.json says launcher_died):")
    shown = [line.split(":")[0].strip() for line in lines[start + 1 : -1]]
    assert shown == ["job J0", "job J4", "job J5", "job J6", "job J7", "job J8"]
    assert lines[-1] == (
        "  and 3 older jobs with no process left (dtrain ps --json lists every one)"
    )
