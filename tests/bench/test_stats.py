"""The benchmark's interval for a median of paired ratios: exact coverage, pairing."""

from __future__ import annotations

import math
import statistics

import pytest
from hypothesis import given
from hypothesis import strategies as st

from bench.stats import median_interval, paired_ratios


def coverage(n: int, k: int) -> float:
    """P(the k-th smallest and the k-th largest of n draws enclose the median), exactly."""
    return 1.0 - 2.0 * sum(math.comb(n, i) for i in range(k)) / 2.0**n


def rank_of(interval_end: float, ordered: list[float]) -> int:
    return ordered.index(interval_end) + 1


@pytest.mark.parametrize(("n", "low", "high"), [(6, 1, 6), (12, 3, 10), (20, 6, 15), (30, 10, 21)])
def test_the_sign_test_ranks_at_95_percent(n: int, low: int, high: int) -> None:
    values = [float(i) for i in range(1, n + 1)]
    assert median_interval(values) == (float(low), float(high))


@pytest.mark.parametrize("n", [0, 1, 2, 5])
def test_too_few_runs_have_no_interval(n: int) -> None:
    assert median_interval([1.0] * n) is None


@given(st.integers(min_value=6, max_value=200))
def test_the_interval_covers_and_is_the_narrowest_that_does(n: int) -> None:
    ordered = [float(i) for i in range(n)]
    found = median_interval(ordered)
    assert found is not None
    k = rank_of(found[0], ordered)
    assert rank_of(found[1], ordered) == n - k + 1  # symmetric in rank
    assert coverage(n, k) >= 0.95
    assert coverage(n, k + 1) < 0.95


@given(st.lists(st.floats(min_value=0.01, max_value=100.0), min_size=6, max_size=60))
def test_the_interval_holds_the_sample_median(values: list[float]) -> None:
    found = median_interval(values)
    assert found is not None
    low, high = found
    assert low in values and high in values
    assert low <= statistics.median(values) <= high


def test_ratios_pair_runs_of_the_same_repetition_only() -> None:
    records = [
        {"launcher": "dtrain", "rep": 0, "launch_s": 0.5},
        {"launcher": "pdsh", "rep": 0, "launch_s": 0.25},
        {"launcher": "dtrain", "rep": 1, "launch_s": 0.3},  # pdsh's rep 1 failed: no pair
        {"launcher": "pdsh", "rep": 1, "launch_s": None},
        {"launcher": "pdsh", "rep": 2, "launch_s": 0.4},
        {"launcher": "dtrain", "rep": 2, "launch_s": 0.2},
        {"launcher": "ssh", "rep": 2, "launch_s": 9.0},
        {"launcher": "dtrain", "rep": 10, "launch_s": 0.6},
        {"launcher": "pdsh", "rep": 10, "launch_s": 0.6},
    ]
    assert paired_ratios(records, "dtrain", "pdsh", "launch_s") == [2.0, 0.5, 1.0]
