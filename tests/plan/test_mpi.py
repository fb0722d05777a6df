"""Which MPI an mpirun is, and the mpirun line that starts the agents (pure)."""

from __future__ import annotations

import subprocess

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtrain.errors import UsageError
from dtrain.plan import mpi
from dtrain.plan.hosts import Host, Origin
from dtrain.plan.mpi import Flavor, Mpirun

OPEN_MPI = Mpirun("/usr/bin/mpirun.openmpi", Flavor.OPEN_MPI, "4.1.4")
MPICH = Mpirun("/usr/bin/mpiexec.hydra", Flavor.MPICH, "4.0.2")
HYDRA_SAYS = """HYDRA build details:
    Version:                                 4.0.2
    Release Date:                            Thu Apr  7 12:34:45 CDT 2022
    CC:                              gcc
"""


@pytest.mark.parametrize(
    ("said", "flavor", "version"),
    [
        (
            "mpirun.openmpi (OpenRTE) 4.1.4\n\nReport bugs to http://www.open-mpi.org/",
            "OPEN",
            "4.1.4",
        ),
        ("mpirun (Open MPI) 5.0.3\n", "OPEN", "5.0.3"),
        (HYDRA_SAYS, "MPICH", "4.0.2"),
        ("HYDRA build details:\n", "MPICH", ""),
    ],
)
def test_open_mpi_and_hydra_are_told_apart_by_what_version_says(
    said: str, flavor: str, version: str
) -> None:
    found = mpi.flavor_of("/x/mpirun", said)
    assert found is not None
    assert found.flavor is (Flavor.OPEN_MPI if flavor == "OPEN" else Flavor.MPICH)
    assert found.version == version and found.path == "/x/mpirun"


@pytest.mark.parametrize(
    "said",
    ["Intel(R) MPI Library for Linux* OS, Version 2021.6", "--version", "", "mpirun: not found"],
)
def test_anything_else_is_neither(said: str) -> None:
    assert mpi.flavor_of("/x/mpirun", said) is None


COMMAND = ["sh", "-c", "script", "BOOT"]
FORWARD = ("DTRAIN_AGENT_KEY", "DTRAIN_AGENT_CONNECT")


def test_open_mpi_runs_one_agent_per_node_without_tree_spawn_and_names_what_it_forwards() -> None:
    argv = mpi.agents_argv(
        OPEN_MPI, ["h1", "h2"], COMMAND, FORWARD, "/tmp/w/ssh", as_root=False, address="198.18.0.1"
    )
    assert argv == [
        "/usr/bin/mpirun.openmpi",
        "-n",
        "2",
        "-H",
        "h1,h2",
        "--map-by",
        "ppr:1:node",
        "--mca",
        "plm_rsh_no_tree_spawn",
        "1",
        "--mca",
        "plm_rsh_agent",
        "/tmp/w/ssh",
        "-x",
        "DTRAIN_AGENT_KEY",
        "-x",
        "DTRAIN_AGENT_CONNECT",
        *COMMAND,
    ]


def test_open_mpi_is_allowed_to_run_as_root_only_as_root() -> None:
    as_root = mpi.agents_argv(OPEN_MPI, ["h1"], COMMAND, FORWARD, "w", as_root=True, address="a")
    assert "--allow-run-as-root" in as_root
    mpich = mpi.agents_argv(MPICH, ["h1"], COMMAND, FORWARD, "w", as_root=True, address="a")
    assert "--allow-run-as-root" not in mpich


def test_hydra_runs_one_per_host_over_ssh_told_this_machines_address() -> None:
    argv = mpi.agents_argv(
        MPICH,
        ["h1", "h2", "h3"],
        COMMAND,
        FORWARD,
        "/tmp/w/ssh",
        as_root=False,
        address="198.18.0.1",
        extra=["-v"],
    )
    assert argv == [
        "/usr/bin/mpiexec.hydra",
        "-n",
        "3",
        "-hosts",
        "h1,h2,h3",
        "-ppn",
        "1",
        "-localhost",
        "198.18.0.1",
        "-launcher",
        "ssh",
        "-launcher-exec",
        "/tmp/w/ssh",
        "-genvlist",
        "DTRAIN_AGENT_KEY,DTRAIN_AGENT_CONNECT",
        "-v",  # the site's own options last, before the agent
        *COMMAND,
    ]


def test_a_host_with_a_user_or_port_is_refused_naming_its_line() -> None:
    mpi.check_hosts([Host("h1"), Host("h2", slots=4)])
    with pytest.raises(UsageError) as caught:
        mpi.check_hosts([Host("h1"), Host("h2", user="bob", origin=Origin("hosts", 2))])
    assert caught.value.what.startswith('hosts:2: "bob@h2": mpirun takes host names only')
    with pytest.raises(UsageError, match='"h1:2222": mpirun takes host names only, no user'):
        mpi.check_hosts([Host("h1", port=2222)])


def test_a_host_listed_twice_is_refused_naming_both_lines() -> None:
    hosts = [Host("h1", origin=Origin("hosts", 1)), Host("h1", slots=2, origin=Origin("hosts", 3))]
    with pytest.raises(UsageError) as caught:
        mpi.check_hosts(hosts)
    assert caught.value.what == 'hosts:3: "h1" is listed twice (first on line 1)'


@settings(max_examples=40, deadline=None)
@given(st.text(st.characters(exclude_categories=["Cs"], exclude_characters="\0"), min_size=1))
def test_the_ssh_wrapper_passes_any_config_path_to_ssh_as_one_word(path: str) -> None:
    script = mpi.ssh_wrapper(path, 7.4, accept_new=True)
    # the wrapper with `ssh` replaced by printf: what ssh would be given, NUL after each word
    shown = script.replace("exec ssh ", "exec printf '%s\\0' ", 1)
    done = subprocess.run(
        ["sh", "-c", shown, "sh", "h1", "orted", "-x"],
        capture_output=True,
        timeout=10,
        check=True,
    )
    words = done.stdout.decode("utf-8", "surrogateescape").split("\0")[:-1]
    assert words[:2] == ["-F", path]
    assert "BatchMode=yes" in words and "ConnectTimeout=7" in words
    assert "StrictHostKeyChecking=accept-new" in words
    assert words[-3:] == ["h1", "orted", "-x"]


def test_the_ssh_wrapper_without_a_config_uses_sshs_own() -> None:
    script = mpi.ssh_wrapper(None, 10, accept_new=False)
    assert script.startswith("#!/bin/sh\nexec ssh -o BatchMode=yes -o ConnectTimeout=10 ")
    assert "StrictHostKeyChecking" not in script
