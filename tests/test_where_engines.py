"""Choosing an engine: --launcher pbs/lsf and a job's node file, as one line when wrong."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from dtrain.errors import UsageError
from dtrain.plan.mpi import MpiFlags
from dtrain.plan.nodefile import Scheduler
from dtrain.transport.nodestart import NodeStarterOptions
from dtrain.where import where_to_run
from tests.conftest import run_dtrain


def clean_env(**extra: str) -> dict[str, str]:
    keep = {k: v for k, v in os.environ.items() if not k.startswith(("PBS_", "LSB_", "SLURM_"))}
    return {**keep, **extra}


@pytest.mark.parametrize("launcher", ["pbs", "lsf"])
@pytest.mark.parametrize("command", ["launch", "ps"])
def test_launcher_pbs_or_lsf_outside_its_job_is_one_line(
    tmp_path: Path, launcher: str, command: str
) -> None:
    done = run_dtrain([command, "--launcher", launcher], tmp_path, env=clean_env())
    assert done.returncode == 2, done.stderr
    var = "PBS_NODEFILE" if launcher == "pbs" else "LSB_DJOB_HOSTFILE"
    assert done.stderr.splitlines()[0] == (
        f"dtrain: --launcher {launcher} outside a {launcher.upper()} job (no ${var})"
    )


def test_a_node_file_line_that_is_no_host_is_named(tmp_path: Path) -> None:
    nodes = tmp_path / "nodes"
    nodes.write_text("n1\nn1 n2\n")
    env = clean_env(PBS_NODEFILE=str(nodes), PBS_JOBID="9")
    done = run_dtrain(["launch", "--dry-run", "--", "true"], tmp_path, env=env)
    assert done.returncode == 2
    assert done.stderr.splitlines()[0] == f'dtrain: {nodes}:2: "n1 n2" is not a host name'


def test_inside_a_job_its_node_file_gives_hosts_slots_and_the_starter(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    nodes = tmp_path / "nodes"
    nodes.write_text("n1\nn1\nn2\n")
    starter = tmp_path / "bin" / "blaunch"
    starter.parent.mkdir()
    starter.write_text("#!/bin/sh\nexit 1\n")
    starter.chmod(0o755)
    env = clean_env(LSB_DJOB_HOSTFILE=str(nodes), LSB_JOBID="77", PATH=str(starter.parent))
    monkeypatch.setenv("PATH", str(starter.parent))  # where blaunch is looked up
    where = where_to_run("auto", None, env)
    assert [(h.name, h.slots) for h in where.hosts] == [("n1", 2), ("n2", 1)]
    assert where.engine == NodeStarterOptions(Scheduler.LSF, str(starter), "77")
    assert where.note == "inside LSF job 77: 2 host(s), 3 slot(s); agents through blaunch"
    with pytest.raises(UsageError, match="--launcher pbs outside a PBS job"):
        where_to_run("pbs", None, env)


def test_launcher_mpi_with_no_hosts_file_inside_a_job_takes_the_jobs_hosts(
    tmp_path: Path,
) -> None:
    nodes = tmp_path / "nodes"
    nodes.write_text("n1\nn1\nn2\n")
    env = clean_env(PBS_NODEFILE=str(nodes), PBS_JOBID="9.srv")
    where = where_to_run("mpi", None, env, mpi=MpiFlags("mpirun.openmpi"))
    assert [(h.name, h.slots) for h in where.hosts] == [("n1", 2), ("n2", 1)]
    assert where.engine is not None and where.engine.owns_hosts  # the job's hosts: tasks there
    assert where.note is not None and where.note.startswith("inside PBS job 9.srv: 2 host(s);")
    with pytest.raises(UsageError, match="--launcher mpi needs -H hosts"):
        where_to_run("mpi", None, clean_env(), mpi=MpiFlags("mpirun.openmpi"))
