"""`--launcher mpi` on this machine alone: finding and recognising mpirun, bad input refused in
one line with nothing started, the dry run's mpirun line, and agents named by their rank.

The agents here are the boot code mpirun runs, started as local processes with the rank
variables mpirun would give them; the launcher's side is the real connect-back. Real mpirun
across real hosts: tests/cluster/test_launch_mpi.py.
"""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import pytest

from dtrain.errors import DtrainError, UsageError
from dtrain.plan.mpi import Flavor, Mpirun
from dtrain.transport import mpi
from dtrain.transport.connectback import CONNECT_VAR, KEY_VAR, ConnectBack, agent_command
from tests.conftest import run_dtrain

OPEN_MPI = shutil.which("mpirun.openmpi")
HYDRA = shutil.which("mpiexec.hydra")
needs_both = pytest.mark.skipif(
    OPEN_MPI is None or HYDRA is None,
    reason="openmpi-bin and mpich (scripts/test.sh installs them)",
)


@needs_both
def test_both_mpis_are_recognised_from_their_own_version_lines() -> None:
    assert OPEN_MPI is not None and HYDRA is not None
    open_mpi = mpi.find_mpirun("mpirun.openmpi")
    assert (open_mpi.flavor, open_mpi.path) == (Flavor.OPEN_MPI, OPEN_MPI)
    assert open_mpi.version.startswith("4.")
    hydra = mpi.find_mpirun(HYDRA)
    assert (hydra.flavor, hydra.path) == (Flavor.MPICH, HYDRA)
    assert hydra.version.startswith("4.")


def test_an_mpirun_that_is_neither_mpi_is_refused_with_what_it_said(tmp_path: Path) -> None:
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho 'Intel(R) MPI Library, Version 2021'\n")
    fake.chmod(0o755)
    with pytest.raises(UsageError) as caught:
        mpi.find_mpirun(str(fake))
    said = "'Intel(R) MPI Library, Version 2021'"
    assert caught.value.what == f"{fake} is neither Open MPI nor MPICH: `--version` says {said}"


def test_no_mpirun_on_path_is_this_machines_problem(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("PATH", "/nonexistent")
    with pytest.raises(DtrainError, match="no mpirun or mpiexec on PATH"):
        mpi.find_mpirun(None)
    with pytest.raises(UsageError, match=r"--mpirun mpirun\.openmpi: no such program"):
        mpi.find_mpirun("mpirun.openmpi")


def hosts_file(tmp_path: Path, text: str = "h1\nh2\n") -> Path:
    path = tmp_path / "hosts"
    path.write_text(text)
    return path


@pytest.mark.parametrize(
    ("args", "code", "message"),
    [
        (["--launcher", "mpi"], 2, "dtrain: --launcher mpi needs -H hosts"),
        (["--mpirun", "/bin/true"], 2, "dtrain: --mpirun is for --launcher mpi"),
        (["--mpi-arg=-v", "-H", "HOSTS"], 2, "dtrain: --mpi-arg is for --launcher mpi"),
        (
            ["--launcher", "mpi", "-H", "HOSTS", "--mpirun", "/nonexistent/mpirun"],
            2,
            "dtrain: --mpirun /nonexistent/mpirun: no such program",
        ),
        (
            ["--launcher", "mpi", "-H", "HOSTS", "--mpirun", "FAKE"],
            2,
            "dtrain: FAKE is neither Open MPI nor MPICH: `--version` says 'Intel(R) MPI 2021'",
        ),
        (
            ["--launcher", "mpi", "-H", "USERHOSTS"],
            2,
            'dtrain: USERHOSTS:2: "bob@h2": mpirun takes host names only, no user or port',
        ),
    ],
)
@pytest.mark.parametrize("command", ["launch", "ps", "kill", "stacks", "doctor"])
def test_bad_mpi_input_is_one_line_and_starts_nothing(
    tmp_path: Path, command: str, args: list[str], code: int, message: str
) -> None:
    hosts = hosts_file(tmp_path)
    user_hosts = tmp_path / "userhosts"
    user_hosts.write_text("h1\nbob@h2\n")
    fake = tmp_path / "mpirun"
    fake.write_text("#!/bin/sh\necho 'Intel(R) MPI 2021'\n")
    fake.chmod(0o755)
    named = {"HOSTS": str(hosts), "USERHOSTS": str(user_hosts), "FAKE": str(fake)}
    tail = ["-n", "1", "-s", "0", "--", "true"] if command == "launch" else []
    done = run_dtrain([command, *(named.get(a, a) for a in args), *tail], tmp_path)
    assert done.returncode == code, done.stderr
    expected = message.replace("USERHOSTS", str(user_hosts)).replace("FAKE", str(fake))
    assert done.stderr.splitlines()[0] == expected
    assert "Traceback" not in done.stderr
    assert not (tmp_path / "dtrain-logs").exists() or not any((tmp_path / "dtrain-logs").iterdir())


def test_no_mpirun_on_path_is_exit_3_naming_what_to_install(tmp_path: Path) -> None:
    empty = tmp_path / "bin"
    empty.mkdir()
    done = run_dtrain(
        ["launch", "--launcher", "mpi", "-H", str(hosts_file(tmp_path)), "--", "true"],
        tmp_path,
        env={**os.environ, "PATH": str(empty)},
    )
    assert done.returncode == 3, done.stderr
    assert done.stderr.startswith("dtrain: --launcher mpi: no mpirun or mpiexec on PATH\n")
    assert "openmpi-bin, mpich" in done.stderr


@needs_both
@pytest.mark.parametrize(
    ("mpirun", "expected"),
    [
        ("mpirun.openmpi", "--map-by ppr:1:node --mca plm_rsh_no_tree_spawn 1"),
        ("mpiexec.hydra", "-ppn 1 -localhost '<this machine>' -launcher ssh"),
    ],
)
def test_a_dry_run_shows_the_mpirun_line_and_starts_nothing(
    tmp_path: Path, mpirun: str, expected: str
) -> None:
    done = run_dtrain(
        [
            "launch",
            "--dry-run",
            "--launcher",
            "mpi",
            "--mpirun",
            mpirun,
            "--mpi-arg=-v",
            "-H",
            str(hosts_file(tmp_path)),
            "-n",
            "2",
            "-s",
            "1",
            "--",
            "true",
        ],
        tmp_path,
    )
    assert done.returncode == 0, done.stderr
    starter = next(line for line in done.stdout.splitlines() if line.startswith("starter: "))
    assert expected in starter and " h1,h2 " in starter
    assert starter.endswith("-v sh -c " + starter.split(" sh -c ", 1)[1])
    assert starter.endswith(" <agent>") and KEY_VAR in starter  # its name, never its value


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def test_agents_are_named_by_their_rank_and_drop_the_mpis_variables(
    started: list[subprocess.Popen[bytes]],
) -> None:
    """Two agents as mpirun would start them (each host's own name is not the hosts file's):
    rank i is the i-th host asked for."""
    options = mpi.MpiOptions(Mpirun("mpirun", Flavor.OPEN_MPI, "4"))
    starter = mpi.MpirunStarter(options, "/bin/false")
    step = ConnectBack(starter, ["alias-a", "alias-b"], 2, pythons=[sys.executable])
    env = step.listen("127.0.0.1")
    assert list(env)[:2] == [KEY_VAR, CONNECT_VAR]
    for rank in ("1", "0"):
        rank_env = {**env, "OMPI_COMM_WORLD_RANK": rank, "OMPI_MCA_x": "1", "PMIX_RANK": rank}
        proc = subprocess.Popen(
            agent_command([sys.executable], mpi.IDENTITY),
            env=rank_env,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
        )
        started.append(proc)
    try:
        assert step.accept(20) == {}
        assert sorted(step.agents) == ["alias-a", "alias-b"]
        assert [step.agents[n].order for n in ("alias-a", "alias-b")] == [0, 1]
    finally:
        step.stop()
    for proc in started:
        assert proc.wait(10) == 0
