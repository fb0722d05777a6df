"""Which hosts and engine inside a Grid Engine job: PE_HOSTFILE, --launcher sge, bad setups."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtrain.errors import UsageError
from dtrain.plan.hosts import Host
from dtrain.transport.machine import local_hostname
from dtrain.transport.sge import SgeOptions
from dtrain.where import Where, where_to_run


@pytest.fixture
def job(tmp_path: Path) -> dict[str, str]:
    """A PE job's variables, its PE_HOSTFILE naming this machine second."""
    hostfile = tmp_path / "pe_hostfile"
    hostfile.write_text(f"n7 2 all.q@n7 UNDEFINED\n{local_hostname()} 1 all.q@here UNDEFINED\n")
    return {"JOB_ID": "41", "SGE_ROOT": "/opt/sge", "PE": "mpi", "PE_HOSTFILE": str(hostfile)}


def test_inside_a_pe_job_its_hosts_are_the_hosts_and_this_one_is_local(
    job: dict[str, str],
) -> None:
    where = where_to_run("auto", None, job)

    assert where.hosts == (Host("n7", slots=2), Host(local_hostname(), slots=1, is_local=True))
    assert isinstance(where.engine, SgeOptions)
    assert (where.engine.job_id, where.engine.pe) == ("41", "mpi")
    assert (
        where.note == f"inside Grid Engine job 41: 2 hosts n7, {local_hostname()} (PE mpi, 3 slots)"
    )
    assert where_to_run("sge", None, job).hosts == where.hosts


def test_h_or_launcher_local_keep_their_meaning_inside_a_job(
    job: dict[str, str], tmp_path: Path
) -> None:
    hosts = tmp_path / "hosts"
    hosts.write_text("198.18.0.11\n")
    assert where_to_run("auto", hosts, job).engine is None
    assert where_to_run("local", None, job) == Where(())


@pytest.mark.parametrize(
    ("launcher", "hostfile", "env", "message"),
    [
        ("sge", None, {}, "--launcher sge outside a Grid Engine job"),
        ("sge", None, {"JOB_ID": "5", "SGE_ROOT": "/x"}, "inside Grid Engine job 5, which has no"),
        ("sge", "hosts", {}, "-H and --launcher sge"),
        (
            "auto",
            None,
            {"JOB_ID": "5", "SGE_ROOT": "/x", "PE_HOSTFILE": "/nonexistent/pe"},
            "cannot read PE_HOSTFILE=/nonexistent/pe: No such file or directory",
        ),
    ],
)
def test_a_job_dtrain_cannot_use_is_one_line(
    launcher: str, hostfile: str | None, env: dict[str, str], message: str, tmp_path: Path
) -> None:
    path = None
    if hostfile is not None:
        path = tmp_path / hostfile
        path.write_text("h1\n")
    with pytest.raises(UsageError) as caught:
        where_to_run(launcher, path, env)
    assert message in str(caught.value)


def test_a_job_without_a_pe_is_this_machine_alone_unless_sge_is_asked_for() -> None:
    where = where_to_run("auto", None, {"JOB_ID": "5", "SGE_ROOT": "/x"})
    assert where.hosts == () and where.engine is None
    assert (
        where.note == "inside Grid Engine job 5 without a parallel environment: this machine only"
    )
