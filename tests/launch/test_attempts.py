"""The attempts loop at its seam: stand-ins for a whole attempt and for the wait between two.

Each stand-in attempt returns a scripted result at once, so the loop's rules (how many
attempts, the waits asked for, what ends the job, what job.json records) are checked without
starting a process; real restarts run in test_restarts_local.py and the cluster tests.
"""

from __future__ import annotations

import json
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import pytest

from dtrain.errors import ConnectError
from dtrain.launch import joblog
from dtrain.launch.attempts import Attempts
from dtrain.launch.lifecycle import Launch, LaunchOptions
from dtrain.launch.restarts import RestartPolicy
from dtrain.launch.results import JobResult, JobState, TaskExit
from dtrain.plan import planner
from dtrain.plan.hosts import Host, local_host
from dtrain.plan.spec import PlacedTask, Role
from dtrain.remote import proto
from tests.launch.test_supervise import RecordingConsole

HOSTS = (Host("h1"), Host("h2"), Host("h3"))


def failure(code: int | None = 1, host: str = "h1", reason: str | None = None) -> JobResult:
    now = time.time()
    cause = TaskExit(
        "worker.0", f"worker.0@{host}", host, code, None, now, now + 60, False, "w.log",
        reason=reason, detail="partitioned" if reason else None,
    )  # fmt: skip
    return JobResult("job", JobState.FAILED, (cause,), cause, now, now + 60, "logs")


def success() -> JobResult:
    return JobResult("job", JobState.SUCCEEDED, (), None, time.time(), time.time(), "logs")


class ScriptedLaunch(Launch):
    """A launch whose attempts are stand-ins: each returns the next scripted result."""

    script: list[JobResult | BaseException]
    seen: list[tuple[int | None, tuple[str, ...], set[str]]]

    def run_attempt(
        self, paths: joblog.JobPaths, placed: Sequence[PlacedTask], attempt: int | None
    ) -> JobResult:
        used = {t.host.name for t in placed if t.role is not Role.SCHEDULER}
        self.seen.append((attempt, tuple(h.name for h in self.request.hosts), used))
        if self.job_file is None:
            self.job_file = joblog.JobFile(paths)
            self.job_file.document = {"dtrain_job": 1, "state": "running"}
        self.plan = None
        self.tasks_started_at = time.time()
        next_end = self.script.pop(0)
        if isinstance(next_end, BaseException):
            raise next_end
        return next_end


def make(
    tmp_path: Path, policy: RestartPolicy, script: list[JobResult | BaseException]
) -> ScriptedLaunch:
    request = planner.JobRequest(
        command=("python", "t.py"), local_host=local_host("here"), num_workers=3, hosts=HOSTS
    )
    launch = ScriptedLaunch(
        request, "job", LaunchOptions(log_root=tmp_path, restart=policy), RecordingConsole()
    )
    launch.script, launch.seen = script, []
    return launch


def run(
    tmp_path: Path, launch: ScriptedLaunch, signal_on_wait: int | None = None
) -> tuple[JobResult, list[float], dict[str, Any]]:
    waits: list[float] = []

    def wait(delay_s: float) -> int | None:
        waits.append(delay_s)
        return signal_on_wait

    paths = joblog.create(tmp_path, "job")
    loop = Attempts(launch, paths, wait=wait, draw=lambda: 0.5)
    result = loop.run(planner.place(launch.request))
    return result, waits, json.loads(paths.job_file.read_text())


def test_always_failing_runs_max_restarts_plus_one_with_doubling_waits(tmp_path: Path) -> None:
    policy = RestartPolicy(max_restarts=3, delay_s=1, max_delay_s=3, window_s=0)
    launch = make(tmp_path, policy, [failure(7)] * 4)
    result, waits, document = run(tmp_path, launch)
    assert result.exit_code == 7
    assert waits == [1, 2, 3]
    assert [a["attempt"] for a in document["attempts"]] == [1, 2, 3, 4]
    assert document["state"] == "failed"
    assert any("no restarts left" in note for note in launch.console.notes)  # type: ignore[attr-defined]


def test_success_on_the_second_attempt_ends_the_job(tmp_path: Path) -> None:
    launch = make(tmp_path, RestartPolicy(max_restarts=5, window_s=0), [failure(), success()])
    result, waits, document = run(tmp_path, launch)
    assert result.exit_code == 0 and len(waits) == 1
    assert [a["state"] for a in document["attempts"]] == ["failed", "succeeded"]


def test_a_signal_during_the_wait_ends_the_job_for_good(tmp_path: Path) -> None:
    launch = make(tmp_path, RestartPolicy(max_restarts=5, window_s=0), [failure()] * 6)
    result, waits, document = run(tmp_path, launch, signal_on_wait=2)
    assert result.state is JobState.INTERRUPTED and result.exit_code == 130
    assert len(waits) == 1 and len(launch.seen) == 1
    assert document["state"] == "interrupted"


@pytest.mark.parametrize("code", [126, 127])
def test_a_command_that_cannot_run_is_not_restarted(tmp_path: Path, code: int) -> None:
    launch = make(tmp_path, RestartPolicy(max_restarts=5, window_s=0), [failure(code)])
    result, waits, _ = run(tmp_path, launch)
    assert result.exit_code == code and waits == []


def test_a_lost_host_sits_out_its_cooldown_with_min_hosts(tmp_path: Path) -> None:
    policy = RestartPolicy(max_restarts=2, window_s=0, min_hosts=2, host_cooldown_s=3600)
    lost = failure(None, host="h2", reason=proto.REASON_LOST)
    launch = make(tmp_path, policy, [lost, failure(), success()])
    result, _, document = run(tmp_path, launch)
    assert result.exit_code == 0
    assert [hosts for _, hosts, _ in launch.seen] == [
        ("h1", "h2", "h3"),
        ("h1", "h3"),
        ("h1", "h3"),
    ]
    assert [used for _, _, used in launch.seen] == [{"h1", "h2", "h3"}, {"h1", "h3"}, {"h1", "h3"}]
    second = document["attempts"][1]
    assert second["dropped_hosts"][0]["host"] == "h2"
    assert "lost during attempt 1" in second["dropped_hosts"][0]["why"]


def test_a_lost_host_is_asked_again_when_too_few_would_be_left(tmp_path: Path) -> None:
    policy = RestartPolicy(max_restarts=1, window_s=0, min_hosts=3)
    lost = failure(None, host="h2", reason=proto.REASON_LOST)
    launch = make(tmp_path, policy, [lost, success()])
    run(tmp_path, launch)
    assert launch.seen[1][1] == ("h1", "h2", "h3")


def test_a_lost_host_comes_back_after_its_cooldown(tmp_path: Path) -> None:
    policy = RestartPolicy(max_restarts=2, window_s=0, min_hosts=1, host_cooldown_s=0)
    lost = failure(None, host="h2", reason=proto.REASON_LOST)
    launch = make(tmp_path, policy, [lost, success()])
    run(tmp_path, launch)
    assert launch.seen[1][1] == ("h1", "h2", "h3")


@pytest.mark.parametrize(
    ("error", "state", "code"),
    [
        (ConnectError("cannot reach 1 of 3 hosts; nothing was started"), "failed", 3),
        (KeyboardInterrupt(), "interrupted", 130),
    ],
)
def test_an_attempt_that_cannot_start_ends_the_job_and_says_so(
    tmp_path: Path, error: BaseException, state: str, code: int
) -> None:
    launch = make(tmp_path, RestartPolicy(max_restarts=3, window_s=0), [failure(), error])
    with pytest.raises(type(error)):
        run(tmp_path, launch)
    document = json.loads((tmp_path / "job" / "job.json").read_text())
    assert document["state"] == state and document["result"]["exit_code"] == code
    assert [a["exit_code"] for a in document["attempts"]] == [1, code]
