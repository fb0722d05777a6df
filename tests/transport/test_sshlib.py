"""paramiko without `invoke` on the launch path, and `Match exec` still working."""

from __future__ import annotations

import subprocess
import sys

import pytest


def run_python(code: str) -> str:
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    return result.stdout.strip()


def test_importing_the_ssh_transport_does_not_import_invoke() -> None:
    code = "import sys, dtrain.transport.ssh; print('invoke' in sys.modules)"
    assert run_python(code) == "False"


def test_match_exec_imports_invoke_when_evaluated() -> None:
    pytest.importorskip("invoke")
    code = (
        "import sys\n"
        "from dtrain.transport.sshlib import paramiko\n"
        "text = 'Match exec \"true\"\\n  User yes\\nHost *\\n  Port 2\\n'\n"
        "c = paramiko.SSHConfig.from_text(text)\n"
        "print(c.lookup('h')['user'], 'invoke' in sys.modules)\n"
    )
    assert run_python(code) == "yes True"
