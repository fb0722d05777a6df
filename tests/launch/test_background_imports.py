"""The modules a launch needs only after the agents' hello load in a thread while it waits."""

from __future__ import annotations

import subprocess
import sys


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout.strip()


def test_later_modules_load_in_the_background_and_a_broken_name_is_left_for_its_user() -> None:
    code = (
        "import sys\n"
        "from dtrain.launch.lifecycle import import_in_background\n"
        "names = ['dtrain.doctor.gather', 'dtrain.processes.stacks']\n"
        "before = [n for n in names if n in sys.modules]\n"
        "thread = import_in_background(['dtrain.no_such_module', *names])\n"
        "thread.join(30)\n"
        "print(before, [n for n in names if n in sys.modules], thread.daemon)\n"
    )
    assert run_python(code) == "[] ['dtrain.doctor.gather', 'dtrain.processes.stacks'] True"


def test_nothing_before_the_first_connection_imports_what_only_later_steps_use() -> None:
    """`dtrain launch` imports the CLI and paramiko before its first connection; the modules
    of the steps after the agents' hello load in the background, once the hosts are booting."""
    code = (
        "import sys\n"
        "import dtrain.cli, dtrain.transport.ssh\n"
        "from dtrain.launch.lifecycle import import_in_background, modules_after_hello\n"
        "later = [*modules_after_hello(True, True), 'dtrain.launch.results']\n"
        "print('before', [n for n in later if n in sys.modules])\n"
        "import_in_background(modules_after_hello(True, True)).join(30)\n"
        "print('after', [n for n in later if n not in sys.modules])\n"
    )
    assert run_python(code).splitlines() == ["before []", "after []"]


def test_the_modules_after_hello_follow_the_steps_a_launch_takes() -> None:
    from dtrain.launch.lifecycle import modules_after_hello

    always = ["dtrain.doctor.parity", "dtrain.processes.launcher", "dtrain.launch.supervise"]
    assert modules_after_hello(False, False) == ["dtrain.agents.ops", *always]
    assert modules_after_hello(True, False) == [
        "dtrain.agents.ops",
        "dtrain.doctor.gather",
        *always,
    ]
    assert modules_after_hello(True, True) == [
        "dtrain.agents.ops",
        "dtrain.doctor.gather",
        "dtrain.launch.sync",
        *always,
    ]
