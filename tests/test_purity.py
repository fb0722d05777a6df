"""Planning is pure: the pure modules import no network, process or ssh library."""

from __future__ import annotations

import subprocess
import sys

PURE = [
    "dtrain.errors",
    "dtrain.plan.hosts",
    "dtrain.plan.spec",
    "dtrain.plan.planner",
    "dtrain.plan.frameworks",
    "dtrain.launch.results",
    "dtrain.render",
    "dtrain.processes.results",
    "dtrain.doctor.parity",
    "dtrain.doctor.judge",
]
FORBIDDEN = ["paramiko", "psutil", "subprocess", "socket", "dtrain.transport.ssh"]


def test_pure_modules_import_no_side_effect_libraries() -> None:
    code = (
        "import sys\n"
        f"for name in {PURE!r}: __import__(name)\n"
        f"print([m for m in {FORBIDDEN!r} if m in sys.modules])\n"
    )
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "[]"


def test_local_launch_does_not_import_paramiko() -> None:
    code = "import sys, dtrain.cli, dtrain.launch.lifecycle; print('paramiko' in sys.modules)"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True)
    assert out.stdout.strip() == "False"


def test_remote_agent_sources_are_python36_syntax() -> None:
    import ast
    from pathlib import Path

    import dtrain.remote

    for path in Path(dtrain.remote.__file__).parent.glob("*.py"):
        ast.parse(path.read_text(), filename=str(path), feature_version=(3, 6))
