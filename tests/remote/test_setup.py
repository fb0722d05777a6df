"""What the agent makes of a setup's end, and the script it runs (in a real shell)."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtrain.remote import proto, setup

COMMANDS = ["source venv/bin/activate", "module load cuda\nmodule load nccl"]


@pytest.mark.parametrize(
    ("result", "code", "expected"),
    [
        (
            b"0\n1\nfailed\n",
            2,
            "setup command `module load cuda; module load nccl` failed (exit 2)",
        ),
        (b"0\n", 3, "setup command `source venv/bin/activate` exited the setup shell with code 3"),
        (b"0\n1\n", 0, "setup command `module load cuda; module load nccl` ran `exit 0`"),
        (b"0\n", -9, "setup command `source venv/bin/activate` was killed by signal 9"),
        (b"", 127, "the setup shell exited with code 127 before running any command"),
    ],
)
def test_a_failed_setup_names_the_command_and_how_it_ended(
    result: bytes, code: int, expected: str
) -> None:
    env, problem = setup.outcome(result, code, COMMANDS)
    assert env is None
    assert expected in problem


def test_a_setup_that_ran_to_its_end_gives_its_environment_without_its_tags() -> None:
    dump = b"A=1\0B=x=y\nz\0" + proto.JOB_ID_VAR.encode() + b"=job\0DTRAIN_TASK=setup"
    env, problem = setup.outcome(b"0\n1\n" + setup.ENV_MARK + dump, 0, COMMANDS)
    assert problem == ""
    assert env is not None and env["A"] == "1" and env["B"] == "x=y\nz"
    assert env.get(proto.JOB_ID_VAR) == os.environ.get(proto.JOB_ID_VAR)
    assert env.get(proto.TASK_VAR) == os.environ.get(proto.TASK_VAR)


@given(st.text(alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00")))
def test_quote_gives_any_text_back_as_one_word(text: str) -> None:
    said = subprocess.run(
        ["/bin/sh", "-c", f"printf %s {setup.quote(text)}"], capture_output=True, check=True
    )
    assert said.stdout == text.encode()


def test_the_script_stops_at_the_first_failure_and_records_where(tmp_path: Path) -> None:
    result = tmp_path / "result"
    result.touch()
    commands = ["export KEPT='a b'", "false", "echo never"]
    script = setup.script(commands, sys.executable, str(result))
    done = subprocess.run(["/bin/sh", "-c", script], capture_output=True, text=True)
    assert done.returncode == 1 and "never" not in done.stdout
    assert setup.outcome(result.read_bytes(), done.returncode, commands) == (
        None,
        "setup command `false` failed (exit 1)",
    )


def test_the_script_hands_over_what_the_commands_exported(tmp_path: Path) -> None:
    result = tmp_path / "result"
    result.touch()
    commands = ["export KEPT='a b\nc'", "unset GONE"]
    script = setup.script(commands, sys.executable, str(result))
    env = {**os.environ, "GONE": "1"}
    done = subprocess.run(["/bin/sh", "-c", script], env=env, capture_output=True)
    assert done.returncode == 0, done.stderr
    kept, problem = setup.outcome(setup.read_result(str(result)), 0, commands)
    assert problem == "" and kept is not None
    assert kept["KEPT"] == "a b\nc" and "GONE" not in kept
    assert not result.exists()  # the environment may hold secrets: read once, then removed
