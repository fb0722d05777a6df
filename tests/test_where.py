"""Which hosts a command acts on, and through which engine: -H, --launcher and Slurm's variables."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dtrain.errors import UsageError
from dtrain.plan.hosts import Host
from dtrain.transport.options import SlurmOptions
from dtrain.where import Where, allocation_from_flags, where_to_run
from tests.conftest import run_dtrain

ALLOCATION = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "n[1-2]", "SLURM_TASKS_PER_NODE": "2(x2)"}


@pytest.fixture
def no_scontrol(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    """A machine without Slurm's commands: the node list is expanded by dtrain's own reader."""
    monkeypatch.setenv("PATH", str(tmp_path))


@pytest.fixture
def hosts_file(tmp_path: Path) -> Path:
    path = tmp_path / "hosts"
    path.write_text("198.18.0.11\n198.18.0.12 slots=2\n")
    return path


def test_inside_an_allocation_its_nodes_are_the_hosts_through_slurm(no_scontrol: None) -> None:
    where = where_to_run("auto", None, ALLOCATION)
    assert where.hosts == (Host("n1", slots=2), Host("n2", slots=2))
    assert where.slurm == SlurmOptions()
    assert where.note == "inside Slurm job 77: 2 nodes n[1-2]"


def test_h_or_launcher_local_keep_today_s_behaviour_inside_an_allocation(
    no_scontrol: None, hosts_file: Path
) -> None:
    assert where_to_run("auto", hosts_file, ALLOCATION).slurm is None
    assert len(where_to_run("ssh", hosts_file, ALLOCATION).hosts) == 2
    assert where_to_run("local", None, ALLOCATION) == Where(())
    assert where_to_run("auto", None, {}) == Where(())


def test_a_node_list_that_cannot_be_expanded_fails_loudly_never_falls_back_here(
    no_scontrol: None,
) -> None:
    with pytest.raises(UsageError, match=r'cannot read the Slurm node list "n\[1-"'):
        where_to_run("auto", None, {**ALLOCATION, "SLURM_JOB_NODELIST": "n[1-"})


@pytest.mark.parametrize(
    ("launcher", "hostfile", "env", "message"),
    [
        ("slurm", None, {}, "--launcher slurm outside a Slurm allocation"),
        ("slurm", "hosts", ALLOCATION, "-H and --launcher slurm"),
        ("ssh", None, {}, "--launcher ssh needs -H hosts"),
    ],
)
def test_contradictory_choices_are_refused_with_what_to_do(
    launcher: str, hostfile: str | None, env: dict[str, str], message: str, tmp_path: Path
) -> None:
    path = tmp_path / hostfile if hostfile else None
    with pytest.raises(UsageError) as caught:
        where_to_run(launcher, path, env)
    assert message in str(caught.value)
    assert caught.value.hint


def test_making_an_allocation_needs_launcher_slurm_and_carries_the_srun_options() -> None:
    made = allocation_from_flags(2, "gpu", "1:00:00", None, "4", ("--constraint=a100",))
    assert made == SlurmOptions(
        nodes=2,
        srun_args=("--partition=gpu", "--time=1:00:00", "--gpus-per-node=4", "--constraint=a100"),
    )
    assert where_to_run("slurm", None, {}, made) == Where((), made)
    with pytest.raises(UsageError, match="add --launcher slurm"):
        where_to_run("auto", None, {}, made)
    with pytest.raises(UsageError, match="--partition is for the allocation --nodes N makes"):
        allocation_from_flags(None, "gpu", None, None, None, ())
    assert allocation_from_flags(None, None, None, None, None, ()) is None


def without_slurm_commands(tmp_path: Path, **extra: str) -> dict[str, str]:
    """A shell whose PATH has no Slurm (and no ssh) command; `extra` are its Slurm variables.
    The node is `localhost`, which /etc/hosts resolves: nothing is looked up on the network."""
    empty = tmp_path / "bin"
    empty.mkdir(exist_ok=True)
    keep = {k: v for k, v in os.environ.items() if not k.startswith("SLURM_")}
    return {**keep, "PATH": str(empty), **extra}


IN_ALLOCATION = {"SLURM_JOB_ID": "77", "SLURM_JOB_NODELIST": "localhost"}


@pytest.mark.parametrize("command", [["ps"], ["launch", "-n", "1", "-s", "0", "--", "true"]])
def test_a_missing_srun_is_this_machine_s_problem_exit_3_as_a_failing_srun(
    tmp_path: Path, command: list[str]
) -> None:
    done = run_dtrain(command, tmp_path, env=without_slurm_commands(tmp_path, **IN_ALLOCATION))
    assert done.returncode == 3, done.stderr
    assert "dtrain: srun is not on PATH" in done.stderr


def test_a_dry_run_inside_an_allocation_reads_no_ssh_config(tmp_path: Path) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host *\n  PKCS11Provider /usr/lib/none.so\n")  # what ssh would refuse
    done = run_dtrain(
        ["launch", "--dry-run", "--ssh-config", str(config), "-n", "1", "-s", "1", "--", "true"],
        tmp_path,
        env=without_slurm_commands(tmp_path, **IN_ALLOCATION),
    )
    assert done.returncode == 0, done.stderr
    assert "DTRAIN_TASK=worker.0" in done.stdout
    assert "DMLC_NODE_HOST=localhost" in done.stdout  # the node by name: it told no address yet
    assert "PKCS11" not in done.stderr


@pytest.mark.parametrize("command", ["ps", "kill", "stacks", "doctor"])
def test_launcher_slurm_outside_an_allocation_suggests_no_nodes_flag_a_command_lacks(
    tmp_path: Path, command: str
) -> None:
    done = run_dtrain(
        [command, "--launcher", "slurm"], tmp_path, env=without_slurm_commands(tmp_path)
    )
    assert done.returncode == 2
    assert "--launcher slurm outside a Slurm allocation" in done.stderr
    assert "--nodes" not in done.stderr and "salloc" in done.stderr
    launch = run_dtrain(
        ["launch", "--launcher", "slurm", "--", "true"],
        tmp_path,
        env=without_slurm_commands(tmp_path),
    )
    assert launch.returncode == 2 and "pass --nodes N to make one" in launch.stderr
