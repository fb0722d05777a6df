"""Containers: launch + teardown with `--image` and `--container` against the same runtime started
by hand over ssh (`ssh host podman run ...` / `podman exec ...` on every host at once).

`python -m bench.containers [--reps N] [--hosts N]` (root; DTRAIN_TEST_CLUSTER_SLOT as for the
tests). The four ways run interleaved, one repetition of each after another, on one cluster
whose hosts have podman and the suite's image; each time is from start until the command exits
and, for `run`, its container is gone from every host. Prints one JSON document: each way's
median and each dtrain way's paired ratio to its hand-made counterpart, with the sign test's 95%
interval (`bench.stats`).
"""

from __future__ import annotations

import argparse
import json
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path

from bench.stats import median_interval
from tests.cluster.netcluster import Cluster
from tests.cluster.podmancluster import IMAGE, PodmanHosts, build_rootfs

TASK = ["python3", "-S", "-c", "pass"]
BOUND_S = 60.0


def timed(start: Callable[[], subprocess.Popen[bytes] | list[subprocess.Popen[bytes]]]) -> float:
    """Seconds from start until every process `start` began has exited 0."""
    began = time.monotonic()
    started = start()
    for proc in started if isinstance(started, list) else [started]:
        if proc.wait(timeout=BOUND_S) != 0:
            raise RuntimeError(f"{proc.args!r} exited {proc.returncode}")
    return time.monotonic() - began


def run_quietly(argv: list[str], cwd: Path) -> subprocess.Popen[bytes]:
    quiet = subprocess.DEVNULL
    return subprocess.Popen(argv, cwd=cwd, stdin=quiet, stdout=quiet, stderr=quiet)


def ways(podman: PodmanHosts, cwd: Path) -> dict[str, Callable[[], float]]:
    cluster = podman.cluster
    hosts = cluster.hosts_file()
    dtrain = [sys.executable, "-m", "dtrain", "launch", "-H", str(hosts)]
    dtrain += ["--ssh-config", str(cluster.ssh_config), "-n", str(len(cluster.hosts))]

    def by_hand(*podman_args: str) -> list[subprocess.Popen[bytes]]:
        remote = " ".join(["podman", *podman_args, *TASK])
        return [run_quietly([*cluster.ssh_argv(h), remote], cwd) for h in cluster.hosts]

    def gone_everywhere(spent: float) -> float:
        """Until no container but the long-running one is left on any host (the --rm)."""
        began = time.monotonic()
        while any(podman.container_names(h) != ["train"] for h in cluster.hosts):
            if time.monotonic() - began > BOUND_S:
                raise RuntimeError("a container was left behind")
            time.sleep(0.02)
        return spent + time.monotonic() - began

    run_args = ["run", "--rm", "-i", "--init", "--network", "host", "--ipc", "host", IMAGE]
    return {
        "dtrain --image": lambda: gone_everywhere(
            timed(lambda: run_quietly([*dtrain, "--image", IMAGE, "--", *TASK], cwd))
        ),
        "ssh podman run": lambda: gone_everywhere(timed(lambda: by_hand(*run_args))),
        "dtrain --container": lambda: timed(
            lambda: run_quietly([*dtrain, "--container", "train", "--", *TASK], cwd)
        ),
        "ssh podman exec": lambda: timed(lambda: by_hand("exec", "-i", "train")),
    }


def summary(times: dict[str, list[float]]) -> dict[str, object]:
    out: dict[str, object] = {name: {"median_s": statistics.median(t)} for name, t in times.items()}
    for mine, theirs in (
        ("dtrain --image", "ssh podman run"),
        ("dtrain --container", "ssh podman exec"),
    ):
        ratios = [a / b for a, b in zip(times[mine], times[theirs], strict=True)]
        out[f"{mine} / {theirs}"] = {
            "median": statistics.median(ratios),
            "interval_95": median_interval(ratios),
        }
    return out


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--reps", type=int, default=8)
    parser.add_argument("--hosts", type=int, default=2)
    given = parser.parse_args()
    with tempfile.TemporaryDirectory(prefix="dtrain-bench-containers-") as scratch:
        cwd = Path(scratch)
        rootfs = build_rootfs(cwd / "rootfs.tar")
        with Cluster(given.hosts) as cluster:
            podman = PodmanHosts(cluster, rootfs)
            try:
                podman.start()
                for host in cluster.hosts:
                    podman.start_container(host, "train", mounts=(str(cwd),))
                chosen = ways(podman, cwd)
                times: dict[str, list[float]] = {name: [] for name in chosen}
                for _ in range(given.reps):
                    for name, way in chosen.items():
                        times[name].append(way())
            finally:
                podman.stop()
    print(json.dumps({"hosts": given.hosts, "reps": given.reps, **summary(times)}, indent=1))
    return 0


if __name__ == "__main__":
    sys.exit(main())
