"""Comparing one fact across hosts: the majority value, the odd hosts out, per-package diffs.

Doctor names the host that differs, with its value and the majority's, so the comparison must
be deterministic: ties go to the preferred host (the launching machine), then to the host
listed first. Pure: imports only the standard library.
"""

from __future__ import annotations

import re
from collections.abc import Hashable, Mapping, Sequence
from dataclasses import dataclass
from typing import Generic, TypeVar

V = TypeVar("V", bound=Hashable)

_PYTHON_FLAGS_WITH_VALUE = frozenset("WX")
_NAME_SEPARATORS = re.compile(r"[-_.]+")


@dataclass(frozen=True, slots=True)
class Majority(Generic[V]):
    """The value most hosts have, how many have it, and the hosts that differ (with theirs)."""

    value: V | None
    count: int
    total: int
    odd: Mapping[str, V]

    @property
    def share(self) -> str:
        """`3 of 4 hosts`, for messages."""
        return f"{self.count} of {self.total} host{'s' if self.total != 1 else ''}"


def majority(values: Mapping[str, V], prefer: str | None = None) -> Majority[V]:
    """The most common value among hosts (in mapping order); ties go to `prefer`'s value,
    else to the value seen first."""
    counts: dict[V, int] = {}
    for value in values.values():
        counts[value] = counts.get(value, 0) + 1
    if not counts:
        return Majority(None, 0, 0, {})
    best = max(counts.values())
    tied = [value for value, count in counts.items() if count == best]
    chosen = tied[0]
    if prefer is not None and prefer in values and values[prefer] in tied:
        chosen = values[prefer]
    odd = {host: value for host, value in values.items() if value != chosen}
    return Majority(chosen, best, len(values), odd)


@dataclass(frozen=True, slots=True)
class PackageDiff:
    """One distribution on one host against the majority; None means not installed."""

    name: str
    theirs: str | None
    majority: str | None

    @property
    def kind(self) -> str:
        if self.theirs is None:
            return "missing"
        if self.majority is None:
            return "extra"
        return "version"

    def text(self) -> str:
        others = self.majority if self.majority is not None else "not installed"
        mine = self.theirs if self.theirs is not None else "missing"
        return f"{self.name} {mine} (others: {others})"


def normalize_name(name: str) -> str:
    """PEP 503: `Foo_Bar.baz` and `foo-bar-baz` are the same distribution."""
    return _NAME_SEPARATORS.sub("-", name).lower()


def package_diff(
    installed: Mapping[str, Mapping[str, str]], prefer: str | None = None
) -> dict[str, tuple[PackageDiff, ...]]:
    """Per host, every distribution whose presence or version differs from the majority's.

    Hosts with no differences are left out; each host's diffs are sorted by name.
    """
    by_host = {
        host: {normalize_name(name): version for name, version in dists.items()}
        for host, dists in installed.items()
    }
    names = sorted({name for dists in by_host.values() for name in dists})
    diffs: dict[str, list[PackageDiff]] = {}
    for name in names:
        versions = {host: dists.get(name) for host, dists in by_host.items()}
        verdict = majority(versions, prefer)
        for host, theirs in verdict.odd.items():
            diffs.setdefault(host, []).append(PackageDiff(name, theirs, verdict.value))
    return {host: tuple(diffs[host]) for host in installed if host in diffs}


def interpreter_of(command: Sequence[str]) -> str:
    """The program doctor asks about: the command's first word, or python3 without one."""
    return command[0] if command else "python3"


def is_python(program: str) -> bool:
    name = program.rsplit("/", 1)[-1]
    return name.startswith(("python", "pypy"))


SHELLS = frozenset({"sh", "bash", "dash", "zsh", "ksh", "mksh", "ash", "yash", "posh"})
_SHELL_FLAGS_WITH_VALUE = "oO"  # -o pipefail, +O extglob
_SHELL_LONG_FLAGS_WITH_VALUE = frozenset({"--rcfile", "--init-file"})


def launched_script(command: Sequence[str]) -> tuple[str, bool] | None:
    """The script a Python or shell command runs (`train.py` in `python -u train.py`, `run.sh`
    in `bash -x run.sh`) and whether the program may also find it on PATH (bash does, for a
    name without a `/`); None when it runs none (`python -m`, `bash -c`, another program).

    Only where a missing script is certain to fail: launch refuses it before anything starts.
    """
    if not command:
        return None
    if is_python(command[0]):
        script = script_of(command)
        return (script, False) if script is not None else None
    if command[0].rsplit("/", 1)[-1] in SHELLS:
        script = shell_script_of(command[1:])
        return (script, "/" not in script) if script is not None else None
    return None


def shell_script_of(args: Sequence[str]) -> str | None:
    """The file `sh [options] FILE [args]` runs; None with -c or -s (commands from an argument
    or stdin) or without a file."""
    index = 0
    while index < len(args):
        arg = args[index]
        if arg in ("-", "--"):  # the end of the options: the file follows
            return args[index + 1] if index + 1 < len(args) else None
        if arg.startswith("--"):
            index += 2 if arg in _SHELL_LONG_FLAGS_WITH_VALUE else 1
        elif arg[:1] in "-+" and len(arg) > 1:
            if "c" in arg or "s" in arg:
                return None
            index += 1 + sum(letter in _SHELL_FLAGS_WITH_VALUE for letter in arg[1:])
        else:
            return arg
    return None


def script_of(command: Sequence[str]) -> str | None:
    """The file a command runs, as written in it: `train.py` in `python -u train.py --lr 1`.

    None for `python -m pkg`, `python -c code`, or a bare program found on PATH. For a
    non-Python program given as a path (`./run.sh`), the program itself; for a launcher such
    as `torchrun train.py`, its first argument ending in `.py`.
    """
    if not command:
        return None
    program, *args = command
    if not is_python(program):
        if "/" in program:
            return program
        return next((arg for arg in args if arg.endswith(".py") and not arg.startswith("-")), None)
    skip_next = False
    for arg in args:
        if skip_next:
            skip_next = False
            continue
        if arg == "-" or arg == "--":
            return None
        if arg.startswith("--"):
            continue  # --version, --help: no script either way
        if arg.startswith("-") and len(arg) > 1:
            letters = arg[1:]
            for position, letter in enumerate(letters):
                if letter in "cm":
                    return None
                if letter in _PYTHON_FLAGS_WITH_VALUE:
                    skip_next = position == len(letters) - 1
                    break
            continue
        return arg
    return None
