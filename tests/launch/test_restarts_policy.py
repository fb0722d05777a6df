"""The restart rules, pure: which ends restart, the backoff schedule, which hosts to try."""

from __future__ import annotations

import signal

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtrain.errors import UsageError
from dtrain.launch import restarts
from dtrain.launch.restarts import RestartPolicy
from dtrain.launch.results import JobResult, JobState, TaskExit
from dtrain.plan.hosts import Host
from dtrain.remote import proto

STARTED = 1000.0


def exit_of(
    code: int | None = 1,
    *,
    sig: int | None = None,
    reason: str | None = None,
    after_s: float = 60.0,
    host: str = "h1",
) -> TaskExit:
    return TaskExit(
        task="worker.1",
        label=f"worker.1@{host}",
        host=host,
        exit_code=code,
        signal=sig,
        started_at=STARTED,
        finished_at=STARTED + after_s,
        stopped_by_dtrain=False,
        log_path="worker.1.log",
        reason=reason,
        detail="no heartbeat" if reason == proto.REASON_LOST else None,
    )


def result_of(state: JobState, cause: TaskExit | None = None) -> JobResult:
    exits = (cause,) if cause is not None else ()
    return JobResult("job", state, exits, cause, STARTED, STARTED + 100, "logs")


POLICY = RestartPolicy(max_restarts=3, window_s=5.0)


@pytest.mark.parametrize(
    ("result", "started", "restart", "why"),
    [
        (result_of(JobState.FAILED, exit_of(1)), STARTED, True, "exited with code 1"),
        (result_of(JobState.FAILED, exit_of(None, sig=9)), STARTED, True, "SIGKILL"),
        (
            result_of(JobState.FAILED, exit_of(None, reason=proto.REASON_LOST)),
            STARTED,
            True,
            "lost",
        ),
        (
            result_of(JobState.FAILED, exit_of(None, reason=proto.REASON_TRACEBACK_HANG)),
            STARTED,
            True,
            "traceback",
        ),
        (result_of(JobState.SUCCEEDED), STARTED, False, "succeeded"),
        (result_of(JobState.INTERRUPTED, exit_of(1)), STARTED, False, "on purpose"),
        (result_of(JobState.TIMED_OUT, exit_of(1)), STARTED, False, "--timeout"),
        (result_of(JobState.FAILED, None), STARTED, False, "no task failed"),
        (result_of(JobState.FAILED, exit_of(126)), STARTED, False, "cannot run"),
        (result_of(JobState.FAILED, exit_of(127)), STARTED, False, "cannot run"),
        (
            result_of(JobState.FAILED, exit_of(None, reason=proto.REASON_SPAWN_FAILED)),
            STARTED,
            False,
            "could not start",
        ),
        (result_of(JobState.FAILED, exit_of(1)), None, False, "could not start"),
        (result_of(JobState.FAILED, exit_of(1, after_s=2.0)), STARTED, False, "--restart-window"),
        (
            result_of(JobState.FAILED, exit_of(None, reason=proto.REASON_LOST, after_s=1.0)),
            STARTED,
            True,
            "lost",
        ),
    ],
)
def test_verdict_table(result: JobResult, started: float | None, restart: bool, why: str) -> None:
    verdict = restarts.verdict(POLICY, 0, result, started)
    assert verdict.restart is restart
    assert why in verdict.why


def test_no_restart_on_names_exit_codes_and_signal_codes() -> None:
    policy = RestartPolicy(max_restarts=3, window_s=0, no_restart_on=frozenset({3, 137}))
    for cause in (exit_of(3), exit_of(None, sig=signal.SIGKILL)):
        verdict = restarts.verdict(policy, 0, result_of(JobState.FAILED, cause), STARTED)
        assert not verdict.restart and "--no-restart-on" in verdict.why
    assert restarts.verdict(policy, 0, result_of(JobState.FAILED, exit_of(4)), STARTED).restart


@given(st.integers(0, 20), st.integers(0, 25))
def test_restarts_stop_after_max_restarts(max_restarts: int, done: int) -> None:
    policy = RestartPolicy(max_restarts=max_restarts, window_s=0)
    verdict = restarts.verdict(policy, done, result_of(JobState.FAILED, exit_of(1)), STARTED)
    assert verdict.restart is (done < max_restarts)
    if not verdict.restart:
        assert "no restarts left" in verdict.why


@given(
    st.floats(0, 1e6, allow_nan=False),
    st.floats(0, 1e7, allow_nan=False),
    st.integers(1, 10_000),
    st.floats(0, 1, exclude_max=True),
)
def test_backoff_doubles_within_jitter_and_never_passes_the_cap(
    delay_s: float, cap_s: float, restart: int, draw: float
) -> None:
    policy = RestartPolicy(max_restarts=1, delay_s=delay_s, max_delay_s=cap_s)
    wait_s = restarts.backoff_s(policy, restart, draw)
    base = min(cap_s, delay_s * 2.0 ** min(restart - 1, 62))
    assert 0.0 <= wait_s <= cap_s
    assert base * (1 - restarts.JITTER) - 1e-9 <= wait_s <= base * (1 + restarts.JITTER) + 1e-9


def test_backoff_schedule_without_jitter() -> None:
    policy = RestartPolicy(max_restarts=9, delay_s=10, max_delay_s=60)
    middle = 0.5  # the draw that leaves the delay as it is
    assert [restarts.backoff_s(policy, n, middle) for n in range(1, 6)] == [10, 20, 40, 60, 60]
    assert restarts.backoff_s(RestartPolicy(delay_s=0), 5, 0.99) == 0


@given(st.lists(st.integers(1, 255), min_size=1, max_size=8))
def test_parse_codes_round_trips(codes: list[int]) -> None:
    assert restarts.parse_codes(",".join(map(str, codes))) == frozenset(codes)


@pytest.mark.parametrize("text", ["", "0", "256", "x", "1,,2", "-1", "1;2", "3.5"])
def test_parse_codes_refuses_what_is_not_an_exit_code(text: str) -> None:
    with pytest.raises(UsageError, match="--no-restart-on"):
        restarts.parse_codes(text)


def test_validate_refuses_flags_that_cannot_work() -> None:
    with pytest.raises(UsageError, match="--min-hosts only matters"):
        restarts.validate(RestartPolicy(min_hosts=1), 3)
    with pytest.raises(UsageError, match="only 3 host"):
        restarts.validate(RestartPolicy(max_restarts=1, min_hosts=4), 3)
    with pytest.raises(UsageError, match="--nodes"):
        restarts.validate(RestartPolicy(max_restarts=1), None, allocating=True)
    restarts.validate(RestartPolicy(max_restarts=1, min_hosts=3), 3)


HOSTS = tuple(Host(f"h{i}") for i in range(5))


@given(
    st.dictionaries(st.integers(0, 4), st.floats(0, 1000, allow_nan=False)),
    st.floats(0, 2000, allow_nan=False),
    st.floats(0, 500, allow_nan=False),
)
def test_a_dropped_host_comes_back_after_its_cooldown(
    dropped_at: dict[int, float], now: float, cooldown_s: float
) -> None:
    dropped = {
        HOSTS[i].key: restarts.DroppedHost(HOSTS[i].key, HOSTS[i].display, "lost", at)
        for i, at in dropped_at.items()
    }
    tried = restarts.hosts_to_try(HOSTS, dropped, now, cooldown_s)
    for i, host in enumerate(HOSTS):
        cooling = i in dropped_at and now - dropped_at[i] < cooldown_s
        assert (host in tried) is not cooling
    assert list(tried) == [h for h in HOSTS if h in tried]  # the order is kept


@given(st.integers(1, 10), st.integers(0, 10))
def test_enough_hosts_only_with_min_hosts(min_hosts: int, answering: int) -> None:
    assert not restarts.enough_hosts(RestartPolicy(max_restarts=1), answering)
    policy = RestartPolicy(max_restarts=1, min_hosts=min_hosts)
    assert restarts.enough_hosts(policy, answering) is (answering >= min_hosts)


def test_lost_hosts_are_named_with_why() -> None:
    lost = exit_of(None, reason=proto.REASON_LOST, host="h2")
    result = JobResult("job", JobState.FAILED, (lost, exit_of(1, host="h1")), lost, 0, 1, "logs")
    assert restarts.lost_hosts(result) == {"h2": "no heartbeat"}
