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
