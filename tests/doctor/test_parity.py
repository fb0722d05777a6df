"""Comparing facts across hosts: majorities, odd hosts out, package diffs, scripts in commands."""

from __future__ import annotations

from collections import Counter

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtrain.doctor.parity import (
    Majority,
    launched_script,
    majority,
    normalize_name,
    package_diff,
    script_of,
)

hosts = st.lists(st.sampled_from([f"h{i}" for i in range(1, 9)]), min_size=1, unique=True)
small_values = st.sampled_from(["3.11.7", "3.11.2", "3.10.0", None])


@given(hosts.flatmap(lambda names: st.fixed_dictionaries({n: small_values for n in names})))
def test_majority_is_a_most_common_value_and_odd_hosts_are_exactly_the_others(
    values: dict[str, str | None],
) -> None:
    verdict = majority(values)
    counts = Counter(values.values())
    assert verdict.count == max(counts.values()) == counts[verdict.value]
    assert verdict.total == len(values)
    assert set(verdict.odd) == {h for h, v in values.items() if v != verdict.value}
    assert all(values[h] == v for h, v in verdict.odd.items())


@given(hosts.flatmap(lambda names: st.fixed_dictionaries({n: small_values for n in names})))
def test_a_value_held_by_more_than_half_the_hosts_always_wins(
    values: dict[str, str | None],
) -> None:
    for value, count in Counter(values.values()).items():
        if count * 2 > len(values):
            assert majority(values).value == value
            assert majority(values, prefer=next(iter(values))).value == value


@pytest.mark.parametrize(
    ("values", "prefer", "winner"),
    [
        ({"here": "a", "h1": "b"}, "here", "a"),  # a tie goes to the launching machine
        ({"here": "a", "h1": "b"}, "h1", "b"),
        ({"h1": "b", "h2": "a"}, None, "b"),  # then to the value seen first
        ({"h1": "b", "h2": "a", "h3": "a"}, "h1", "a"),  # a real majority beats preference
    ],
)
def test_ties_are_broken_deterministically(
    values: dict[str, str], prefer: str | None, winner: str
) -> None:
    assert majority(values, prefer).value == winner


def test_no_values_has_no_majority() -> None:
    verdict: Majority[str] = majority({})
    assert verdict.value is None and verdict.odd == {}


def test_package_diff_names_the_host_and_both_versions() -> None:
    installed = {
        "here": {"numpy": "1.23.5", "idna": "3.20", "mxnet": "1.9.1"},
        "h1": {"numpy": "1.23.5", "idna": "3.20", "mxnet": "1.9.1"},
        "h2": {"numpy": "1.24.0", "mxnet": "1.9.1", "extra-thing": "0.1"},
        "h3": {"NumPy": "1.23.5", "IDNA": "3.20", "MXNet": "1.9.1"},
    }
    diffs = package_diff(installed, prefer="here")
    assert list(diffs) == ["h2"]
    assert [(d.name, d.theirs, d.majority, d.kind) for d in diffs["h2"]] == [
        ("extra-thing", "0.1", None, "extra"),
        ("idna", None, "3.20", "missing"),
        ("numpy", "1.24.0", "1.23.5", "version"),
    ]
    assert diffs["h2"][1].text() == "idna missing (others: 3.20)"


dists = st.dictionaries(
    st.sampled_from(["numpy", "mxnet", "idna", "click", "torch"]),
    st.sampled_from(["1.0", "2.0"]),
    max_size=5,
)


@given(hosts.flatmap(lambda names: st.fixed_dictionaries({n: dists for n in names})))
def test_package_diff_is_empty_exactly_when_every_host_has_the_same_set(
    installed: dict[str, dict[str, str]],
) -> None:
    diffs = package_diff(installed)
    same = all(d == next(iter(installed.values())) for d in installed.values())
    assert (diffs == {}) == same
    for host, found in diffs.items():
        for diff in found:
            assert installed[host].get(diff.name) == diff.theirs != diff.majority


@given(dists, st.sampled_from(["numpy", "mxnet", "idna", "click", "torch"]))
def test_a_host_missing_what_all_others_have_is_named_with_the_version(
    common: dict[str, str], name: str
) -> None:
    common = {**common, name: "9.9"}
    lacking = {k: v for k, v in common.items() if k != name}
    diffs = package_diff({"here": common, "h1": common, "h2": lacking})
    assert [(d.name, d.theirs, d.majority) for d in diffs["h2"]] == [(name, None, "9.9")]
    assert set(diffs) == {"h2"}


@pytest.mark.parametrize(
    ("name", "normal"),
    [("Foo_Bar", "foo-bar"), ("foo.bar", "foo-bar"), ("FOO--bar__baz", "foo-bar-baz")],
)
def test_distribution_names_are_compared_as_pip_does(name: str, normal: str) -> None:
    assert normalize_name(name) == normal


@pytest.mark.parametrize(
    ("command", "script"),
    [
        (["python", "train.py", "--lr", "1"], "train.py"),
        (["python3", "-u", "-B", "dir with space/t.py"], "dir with space/t.py"),
        (["python", "-uB", "t.py"], "t.py"),
        (["python", "-W", "ignore", "t.py"], "t.py"),
        (["python", "-Wignore", "t.py"], "t.py"),
        (["python", "-X", "dev", "t.py"], "t.py"),
        (["/opt/py/bin/python3.11", "t.py"], "t.py"),
        (["python", "-m", "pkg.train"], None),
        (["python", "-um", "pkg.train"], None),
        (["python", "-c", "print(1)"], None),
        (["python"], None),
        (["python", "-"], None),
        (["./run.sh", "x.py"], "./run.sh"),
        (["torchrun", "--nproc-per-node", "2", "t.py", "--x"], "t.py"),
        (["sleep", "1"], None),
        ([], None),
    ],
)
def test_the_script_named_in_a_command(command: list[str], script: str | None) -> None:
    assert script_of(command) == script


@pytest.mark.parametrize(
    ("command", "checked"),
    [
        (["bash", "missing.sh"], ("missing.sh", True)),
        (["/bin/sh", "-x", "run.sh", "a"], ("run.sh", True)),
        (["bash", "-e", "-o", "pipefail", "dir/run.sh"], ("dir/run.sh", False)),
        (["bash", "-xo", "pipefail", "run.sh"], ("run.sh", True)),
        (["bash", "-O", "extglob", "+o", "posix", "run.sh"], ("run.sh", True)),
        (["bash", "--norc", "--rcfile", "rc", "run.sh"], ("run.sh", True)),
        (["zsh", "--", "-odd-name.sh"], ("-odd-name.sh", True)),
        (["dash", "-"], None),
        (["bash", "-c", "exit 0", "name"], None),
        (["bash", "-ec", "true"], None),
        (["sh", "-s", "arg"], None),
        (["bash"], None),
        (["python3", "-u", "train.py"], ("train.py", False)),
        (["python3", "-m", "pkg"], None),
        (["./run.sh"], None),
        (["torchrun", "t.py"], None),
    ],
)
def test_the_script_launch_checks_before_anything_starts(
    command: list[str], checked: tuple[str, bool] | None
) -> None:
    assert launched_script(command) == checked
