"""dtrain `--launcher mpi` against plain mpirun, same run, as ratios (a phase of `python -m bench`).

Needs root and Debian's openmpi-bin (scripts/test.sh installs it): on the suite's namespaced
hosts, interleaved, repeat after repeat, Open MPI's mpirun starts

- launch: `dtrain launch --launcher mpi --framework torch -n N*T` (one agent per host, which
  starts T tasks) against `mpirun -n N*T --map-by ppr:T:node` of the same task (bench/task.py
  stamps its start and exits): to the last task started, and the whole command;
- teardown after one failure (the first task exits 7 once all have started, the rest sleep):
  from that exit to the command's, and the tasks still alive then. Open MPI aborts the job
  itself when a rank fails.

Both run ssh through the same wrapper (the cluster's config, BatchMode) and keep Open MPI's
daemons to the cluster's subnet. Every task ends by itself within its life; the cluster and
every task are stopped at the end whatever happens.
"""

from __future__ import annotations

import os
import shutil
import sys
import tempfile
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.slurm import median_of, secs, time_one  # noqa: E402
from tests.cluster.netcluster import SUBNET, Cluster, assert_routes_to_bridge  # noqa: E402

PYTHON = sys.executable
MPIRUN = "mpirun.openmpi"
LAUNCHERS = ("dtrain --launcher mpi", "mpirun")


Argv = Callable[[tuple[str, ...]], list[str]]


def _argv(launcher: str, cluster: Cluster, per_host: int, wrapper: Path, scratch: Path) -> Argv:
    """The command of one launcher, given the task's argv."""
    names = [host.name for host in cluster.hosts]
    tasks = len(names) * per_host
    subnet = ["--mca", "oob_tcp_if_include", SUBNET]
    if launcher == "mpirun":
        hosts = ",".join(f"{name}:{per_host}" for name in names)
        argv = [MPIRUN, "--allow-run-as-root", "-n", str(tasks), "-H", hosts]
        argv += ["--map-by", f"ppr:{per_host}:node", "--mca", "plm_rsh_agent", str(wrapper)]
        return lambda task: [*argv, *subnet, *task]
    hosts_file = scratch / f"hosts-{per_host}"
    hosts_file.write_text("".join(f"{name} slots={per_host}\n" for name in names))
    argv = [PYTHON, "-m", "dtrain", "launch", "--launcher", "mpi", "--mpirun", MPIRUN]
    argv += ["-H", str(hosts_file), "--ssh-config", str(cluster.ssh_config)]
    argv += [*(f"--mpi-arg={arg}" for arg in subnet), "--log-dir", str(scratch / "logs")]
    return lambda task: [*argv, "--framework", "torch", "-n", str(tasks), "--", *task]


def measure(nodes: int, per_host: int, repeats: int, cap_s: float) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    scratch = Path(tempfile.mkdtemp(prefix="bench-mpi-"))
    try:
        with Cluster(nodes) as cluster:
            assert_routes_to_bridge(cluster)
            wrapper = scratch / "ssh"
            wrapper.write_text(
                f'#!/bin/sh\nexec ssh -F {cluster.ssh_config} -o BatchMode=yes "$@"\n'
            )
            wrapper.chmod(0o700)
            commands = {
                name: _argv(name, cluster, per_host, wrapper, scratch) for name in LAUNCHERS
            }
            env = dict(os.environ)
            tasks = nodes * per_host
            for _ in range(repeats):
                for mode, cap in (("stamp", 60.0), ("fail", cap_s)):
                    for name in LAUNCHERS:
                        records.append(
                            time_one(commands[name], name, mode, env, tasks, scratch, cap)
                        )
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
    return records


def report(records: Sequence[dict[str, Any]], shape: tuple[int, int], cap_s: float) -> str:
    nodes, per_host = shape
    ours, theirs = LAUNCHERS
    runs = sum(1 for r in records if r["launcher"] == ours and r["mode"] == "stamp")
    lines = [
        f"### MPI: {nodes} hosts x {per_host} tasks, {runs} interleaved runs, medians",
        "",
        f"| | {ours} | plain {theirs} | ratio |",
        "|---|---|---|---|",
    ]
    rows = (("launch_s", "stamp", "last task started"), ("wall_s", "stamp", "whole command"))
    for key, mode, name in (*rows, ("teardown_s", "fail", "teardown after a failure")):
        mine = median_of(records, key, launcher=ours, mode=mode)
        peer = median_of(records, key, launcher=theirs, mode=mode)
        ratio = f"x{mine / peer:.2f}" if mine and peer else "-"
        lines.append(f"| {name} | {secs(mine)} | {secs(peer)} | {ratio} |")
    for name in LAUNCHERS:
        failed = [r for r in records if r["launcher"] == name and r["mode"] == "fail"]
        codes = sorted({str(r["exit"]) for r in failed})
        alive = max((r["alive_at_exit"] for r in failed), default=0)
        lines.append(f"\n{name} after a failure: exit {', '.join(codes)}; {alive} task(s) alive")
    return "\n".join(lines) + f"\n(teardown capped at {cap_s:g} s)\n"


if __name__ == "__main__":
    shape = (int(sys.argv[1]), int(sys.argv[2])) if len(sys.argv) > 2 else (4, 2)
    found = measure(*shape, repeats=int(sys.argv[3]) if len(sys.argv) > 3 else 3, cap_s=20.0)
    print(report(found, shape, 20.0))
