"""The command line as a user meets it: help, errors that say what to do, clean stdout."""

from __future__ import annotations

import json
from pathlib import Path

import click
import pytest
from click.testing import CliRunner

from dtrain import __version__
from dtrain.cli import cli
from tests.conftest import run_dtrain


def commands() -> list[str]:
    return sorted(cli.commands)


@pytest.mark.parametrize("name", commands())
def test_every_command_has_help_with_an_example(name: str) -> None:
    result = CliRunner().invoke(cli, [name, "--help"])
    assert result.exit_code == 0
    assert "Example" in result.output
    assert f"dtrain {name}" in result.output


def test_group_help_and_version() -> None:
    runner = CliRunner()
    assert "Examples:" in runner.invoke(cli, ["--help"]).output
    assert __version__ in runner.invoke(cli, ["--version"]).output
    assert isinstance(cli, click.Group)


def test_bad_hosts_line_is_a_located_usage_error(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("node1\nnode3:22x\n")
    result = run_dtrain(["launch", "-n", "1", "-H", str(hosts), "--", "true"], tmp_path)
    assert result.returncode == 2
    assert result.stderr.splitlines() == [
        f'{hosts}:2: "22x" is not a valid port (expected 1-65535)',
        "  hint: write one host per line as [user@]host[:port] [slots=N]; see hosts.example",
    ]
    assert result.stdout == ""


def test_duplicate_host_is_a_usage_error(tmp_path: Path) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("node1\n# again\nnode1 slots=2\n")
    result = run_dtrain(["launch", "-n", "1", "-H", str(hosts), "--", "true"], tmp_path)
    assert result.returncode == 2
    assert 'hosts:3: duplicate host "node1" (first listed on line 1)' in result.stderr


def test_missing_hosts_file_says_what_to_do(tmp_path: Path) -> None:
    result = run_dtrain(["launch", "-n", "1", "-H", "nohosts", "--", "true"], tmp_path)
    assert result.returncode == 2
    assert "dtrain: hosts file nohosts does not exist" in result.stderr
    assert "hint:" in result.stderr


def test_unknown_framework_lists_the_valid_ones(tmp_path: Path) -> None:
    result = run_dtrain(["launch", "--framework", "jax", "--", "true"], tmp_path)
    assert result.returncode == 2
    assert 'unknown framework "jax"' in result.stderr
    assert "mxnet" in result.stderr and "pytorch" in result.stderr


def test_missing_command_is_a_usage_error(tmp_path: Path) -> None:
    result = run_dtrain(["launch", "-n", "2"], tmp_path)
    assert result.returncode == 2
    assert "no command to run" in result.stderr
    assert "Traceback" not in result.stderr


def test_usage_errors_in_json_mode_are_one_json_document(tmp_path: Path) -> None:
    result = run_dtrain(["launch", "--json", "-n", "0", "--", "true"], tmp_path)
    assert result.returncode == 2
    document = json.loads(result.stdout)
    assert document["status"] == "failed" and document["exit_code"] == 2
    assert document["errors"][0]["code"] == "usage"


def test_the_training_scripts_own_flags_are_not_eaten(tmp_path: Path) -> None:
    result = run_dtrain(
        ["launch", "--dry-run", "--json", "-n", "1", "python", "t.py", "--num-workers", "9", "-s"],
        tmp_path,
    )
    assert result.returncode == 0, result.stderr
    plan = json.loads(result.stdout)["data"]["plan"]
    assert plan["tasks"][-1]["argv"] == ["python", "t.py", "--num-workers", "9", "-s"]
    assert len(plan["tasks"]) == 3
