"""Fixtures for tests that run against the namespaced ssh cluster (see netcluster.py) and
the Slurm and Grid Engine clusters on top of it (see slurmcluster.py, sgecluster.py).

Every test under tests/cluster gets the `cluster` marker. A failed test's report carries the
sshd logs of the clusters it used, and the Slurm daemons' logs.
"""

from __future__ import annotations

from collections.abc import Callable, Generator, Iterable, Iterator
from pathlib import Path
from typing import Any

import pytest

from .netcluster import Cluster
from .sgecluster import SgeCluster
from .slurmcluster import SlurmCluster

_HERE = Path(__file__).parent
_CLUSTERS = pytest.StashKey[list[Cluster]]()
_SLURM_CLUSTERS = pytest.StashKey[list[SlurmCluster]]()
_SGE_CLUSTERS = pytest.StashKey[list[SgeCluster]]()
_LOG_TAIL_CHARS = 4000


def pytest_collection_modifyitems(items: list[pytest.Item]) -> None:
    for item in items:
        if _HERE in item.path.parents:
            item.add_marker(pytest.mark.cluster)


@pytest.hookimpl(hookwrapper=True)
def pytest_runtest_makereport(
    item: pytest.Item, call: pytest.CallInfo[None]
) -> Generator[None, pytest.TestReport, None]:
    """Attach each host's sshd log to a failed test while the cluster still exists."""
    outcome = yield
    report = outcome.get_result()
    if report.when != "call" or not report.failed:
        return
    for cluster in item.stash.get(_CLUSTERS, []):
        if not cluster.is_running:
            continue
        for host in cluster.hosts:
            log = cluster.sshd_log(host)[-_LOG_TAIL_CHARS:]
            report.sections.append((f"sshd log {cluster.prefix} {host.name}", log))
    for slurm in item.stash.get(_SLURM_CLUSTERS, []):
        if not slurm.is_running:
            continue
        prefix = slurm.cluster.prefix
        report.sections.append((f"slurmctld log {prefix}", slurm.log()[-_LOG_TAIL_CHARS:]))
        for host in slurm.nodes:
            log = slurm.log(host)[-_LOG_TAIL_CHARS:]
            report.sections.append((f"slurmd log {prefix} {host.name}", log))
    for sge in item.stash.get(_SGE_CLUSTERS, []):
        if not sge.is_running:
            continue
        prefix = sge.cluster.prefix
        report.sections.append((f"sge_qmaster log {prefix}", sge.log()[-_LOG_TAIL_CHARS:]))
        for host in sge.hosts:
            log = sge.log(host)[-_LOG_TAIL_CHARS:]
            report.sections.append((f"sge_execd log {prefix} {host.name}", log))


def _stop_all(made: Iterable[Cluster | SlurmCluster | SgeCluster]) -> None:
    """Stop every one, then raise the first error: one failed stop must not leave the rest."""
    errors = []
    for each in made:
        try:
            each.stop()
        except Exception as exc:
            errors.append(exc)
    if errors:
        raise errors[0]


@pytest.fixture
def make_cluster(request: pytest.FixtureRequest) -> Iterator[Callable[[int], Cluster]]:
    """A factory: make_cluster(n) starts an n-host cluster; all are stopped after the test.

    Only one cluster per process can run at a time (it owns its slot's /24): stop one before the
    next. Another test run on this machine takes another slot (DTRAIN_TEST_CLUSTER_SLOT).
    """
    made: list[Cluster] = []
    request.node.stash[_CLUSTERS] = made

    def make(n_hosts: int = 3) -> Cluster:
        cluster = Cluster(n_hosts)
        made.append(cluster)
        cluster.start()
        return cluster

    yield make
    _stop_all(made)


@pytest.fixture
def cluster(make_cluster: Callable[[int], Cluster]) -> Cluster:
    """A running 3-host cluster (h1..h3), torn down after the test."""
    return make_cluster(3)


@pytest.fixture
def make_slurm_cluster(
    request: pytest.FixtureRequest, make_cluster: Callable[[int], Cluster]
) -> Iterator[Callable[[int], SlurmCluster]]:
    """A factory: make_slurm_cluster(n) starts an n-host cluster with slurmctld and one slurmd
    per host, all idle; Slurm is stopped after the test, then the hosts."""
    made: list[SlurmCluster] = []
    request.node.stash[_SLURM_CLUSTERS] = made

    def make(n_nodes: int = 3) -> SlurmCluster:
        slurm = SlurmCluster(make_cluster(n_nodes))
        made.append(slurm)
        slurm.start()
        return slurm

    yield make
    _stop_all(made)


@pytest.fixture
def slurm_cluster(make_slurm_cluster: Callable[[int], SlurmCluster]) -> SlurmCluster:
    """A running 3-node Slurm cluster (nodes h1..h3, all idle), torn down after the test."""
    return make_slurm_cluster(3)


@pytest.fixture
def make_sge_cluster(
    request: pytest.FixtureRequest, make_cluster: Callable[[int], Cluster]
) -> Iterator[Callable[..., SgeCluster]]:
    """A factory: make_sge_cluster(n, **options) starts an n-host cluster with sge_qmaster on
    h1 and one sge_execd per host, every queue instance ready; Grid Engine is stopped after the
    test (every job and task with it), then the hosts."""
    made: list[SgeCluster] = []
    request.node.stash[_SGE_CLUSTERS] = made

    def make(n_hosts: int = 3, **options: Any) -> SgeCluster:
        sge = SgeCluster(make_cluster(n_hosts), **options)
        made.append(sge)
        sge.start()
        return sge

    yield make
    _stop_all(made)


@pytest.fixture
def sge_cluster(make_sge_cluster: Callable[..., SgeCluster]) -> SgeCluster:
    """A running 3-host Grid Engine cluster (h1..h3, PE `dtrain`), torn down after the test."""
    return make_sge_cluster(3)
