"""The Grid Engine starter: one qrsh -inherit per host, the key never in an argv."""

from __future__ import annotations

import shlex
from pathlib import Path

import pytest

from dtrain.errors import DtrainError
from dtrain.transport.connectback import KEY_VAR, ORDER_VAR, agent_command
from dtrain.transport.sge import HOST_VAR, IDENTITY, QrshStarter, SgeOptions, pe_allows_tasks


@pytest.fixture
def qrsh(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    """A `qrsh` on PATH (a stand-in file: nothing here runs it)."""
    path = tmp_path / "qrsh"
    path.write_text("#!/bin/sh\nexit 99\n")
    path.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    return path


def test_each_host_gets_its_own_qrsh_with_its_name_and_place_in_the_environment(
    qrsh: Path,
) -> None:
    command = agent_command(["python3"], IDENTITY)
    started = QrshStarter("12").processes(command, ["n3", "n1"], 2, "198.18.0.1")

    assert [p.argv[:5] for p in started] == [
        [str(qrsh), "-inherit", "-nostdin", "-V", host] for host in ("n3", "n1")
    ]
    assert [dict(p.env) for p in started] == [
        {HOST_VAR: "n3", ORDER_VAR: "0"},
        {HOST_VAR: "n1", ORDER_VAR: "1"},
    ]
    remote = shlex.split(started[0].argv[5])
    assert remote == ["setsid", "-w", *command]  # the agent in a session of its own
    assert f"{KEY_VAR}=" not in " ".join(started[0].argv)  # the key is the environment's


def test_no_qrsh_is_this_machines_setup_not_the_flags(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    with pytest.raises(DtrainError) as caught:
        QrshStarter("12").processes(["true"], ["n1"], 1, "198.18.0.1")
    assert "qrsh is not on PATH" in str(caught.value)
    assert caught.value.exit_code == 3


def test_dry_run_shows_the_first_hosts_qrsh() -> None:
    options = SgeOptions("12", "mpi")
    assert options.allocate_count is None and options.owns_hosts
    argv = options.starter_command([])
    assert argv[:5] == ["qrsh", "-inherit", "-nostdin", "-V", "HOST"]


@pytest.mark.parametrize(
    ("shown", "allows"),
    [
        ("pe_name mpi\ncontrol_slaves     TRUE\njob_is_first_task FALSE\n", True),
        ("pe_name mpi\ncontrol_slaves     FALSE\n", False),
        ("", None),  # qconf refused (not a submit host): unknown
    ],
)
def test_whether_the_pe_lets_the_job_start_tasks_is_read_from_qconf(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, shown: str, allows: bool | None
) -> None:
    """A stand-in `qconf` that prints what `qconf -sp mpi` would."""
    (tmp_path / "shown").write_text(shown)
    qconf = tmp_path / "qconf"
    qconf.write_text(f'#!/bin/sh\n[ "$1 $2" = "-sp mpi" ] && exec /bin/cat {tmp_path / "shown"}\n')
    qconf.chmod(0o755)
    monkeypatch.setenv("PATH", str(tmp_path))
    assert pe_allows_tasks("mpi") is allows


def test_without_qconf_or_a_pe_name_nobody_can_say(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("PATH", str(tmp_path))
    assert pe_allows_tasks("mpi") is None
    assert pe_allows_tasks("") is None
