"""Which hosts a command acts on, and through which engine: -H, --launcher and Slurm's variables."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtrain.cli import Where, allocation_from_flags, where_to_run
from dtrain.errors import UsageError
from dtrain.plan.hosts import Host
from dtrain.transport.options import SlurmOptions

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
