"""dtrain on Slurm against plain srun, same run, as ratios: `python -m bench.slurm`.

Needs root and Debian's slurmctld, slurmd and slurm-client (scripts/test.sh installs them):
it builds the suite's namespaced hosts and a real Slurm cluster on them, holds one allocation
of every node, and inside it runs, interleaved, repeat after repeat:

- launch: `dtrain launch --framework torch -n N*T` (one step of agents, T ranks per node)
  against `srun --overlap -N N --ntasks-per-node=T` of the same task, which stamps its start
  time into a shared directory and exits. Launch latency is the last task's start after the
  command began; wall time is the command's whole life.
- teardown after one failure: the first task to start exits 7 once all have started, the rest
  sleep. Measured from that exit to the command's own exit, and how many tasks were still
  alive then. Plain srun waits for every task (never, here: capped at --cap seconds); with
  `-K` (--kill-on-bad-exit) it stops the step and exits 143.

Every task ends by itself within its --life, and the cluster, its daemons and every task are
stopped at the end whatever happens. Traffic stays on the suite's bridge (198.18.0.0/24).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import hostprocs  # noqa: E402
from bench.launchers import compile_dtrain, task_argv  # noqa: E402
from tests.cluster.netcluster import Cluster, assert_routes_to_bridge  # noqa: E402
from tests.cluster.slurmcluster import SlurmCluster  # noqa: E402

PYTHON = sys.executable
PAGE = """# Benchmarks: dtrain on Slurm against plain srun

Made by `python -m bench.slurm {argv}` (root; Debian's slurmctld, slurmd and slurm-client):
a real Slurm 22.05 cluster on the suite's namespaced hosts, one allocation of every node held
by `salloc --no-shell`, and inside it, interleaved, `dtrain launch --framework torch` against
`srun --overlap` of the same tiny task (`bench/task.py`). Every figure comes from the same run
on a shared 2-core machine: compare them as ratios, not as absolute times.

{report}
What the columns mean: *last task started* runs from the command's start to the last task's
own start stamp; *whole command* to the command's exit. dtrain's figure includes its Python
start-up and imports, one `srun` step for the agents (one agent per node), each agent
connecting back and proving the job's key, the agent's code sent over that connection, the
plan, the preflight (stale processes, ports), and starting every task. Teardown runs from the
failing task's exit to the command's exit; plain `srun` without `-K` waits for the tasks that
still sleep (so never, here), and with `-K` ends the step but reports 143, not the task's 7.
"""
LIFE_S = 60.0


def _env(slurm: SlurmCluster, job_id: str, nodes: int, per_host: int) -> dict[str, str]:
    """What a shell inside the allocation has."""
    return {
        **slurm.client_env(),
        "SLURM_JOB_ID": job_id,
        "SLURM_JOB_NODELIST": f"h[1-{nodes}]",
        "SLURM_TASKS_PER_NODE": f"{per_host}(x{nodes})",
    }


def _commands(
    launcher: str, nodes: int, per_host: int, task: Sequence[str], logs: Path
) -> list[str]:
    total = nodes * per_host
    if launcher == "dtrain":
        return [
            PYTHON,
            "-m",
            "dtrain",
            "launch",
            "--framework",
            "torch",
            "-n",
            str(total),
            "--log-dir",
            str(logs),
            "--",
            *task,
        ]
    argv = ["srun", "--overlap", f"-N{nodes}", f"--ntasks-per-node={per_host}"]
    if launcher == "srun -K":
        argv.append("--kill-on-bad-exit=1")
    return [*argv, *task]


def _one(
    launcher: str,
    mode: str,
    slurm: SlurmCluster,
    env: dict[str, str],
    shape: tuple[int, int],
    scratch: Path,
    cap_s: float,
) -> dict[str, Any]:
    nodes, per_host = shape
    stamps = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=scratch))
    task = task_argv(stamps, mode, nodes * per_host, LIFE_S)
    argv = _commands(launcher, nodes, per_host, task, scratch / "dtrain-logs")
    began = time.time()
    popen = subprocess.Popen(
        argv,
        env=env,
        cwd=scratch,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        code: int | None = popen.wait(cap_s)
    except subprocess.TimeoutExpired:
        code = None
    ended = time.time()
    starts = [float(p.read_text()) for p in stamps.glob("*.start")]
    record: dict[str, Any] = {
        "launcher": launcher,
        "mode": mode,
        "exit": code,
        "wall_s": ended - began,
        "started": len(starts),
        "launch_s": (max(starts) - began) if len(starts) == nodes * per_host else None,
    }
    if mode == "fail":
        failed = stamps / "failed"
        record["teardown_s"] = (ended - float(failed.read_text())) if failed.exists() else None
        on_nodes, _ = hostprocs.tasks(str(stamps))
        record["alive_at_exit"] = len(hostprocs.alive(on_nodes))
        hostprocs.kill(on_nodes, 10)  # SIGUSR1: the task's own clean exit (see bench/task.py)
        hostprocs.wait_gone(on_nodes, time.time() + 10)
    if popen.poll() is None:
        hostprocs.killpg(popen.pid)
        popen.wait()
    shutil.rmtree(stamps, ignore_errors=True)
    return record


def measure(nodes: int, per_host: int, repeats: int, cap_s: float) -> list[dict[str, Any]]:
    records: list[dict[str, Any]] = []
    scratch = Path(tempfile.mkdtemp(prefix="bench-slurm-"))
    with Cluster(nodes) as cluster, SlurmCluster(cluster, cpus_per_node=per_host) as slurm:
        assert_routes_to_bridge(cluster)
        holder = slurm.spawn(
            ["salloc", f"-N{nodes}", f"--ntasks-per-node={per_host}", "--no-shell"]
        )
        holder.popen.wait(30)
        job_id = slurm.squeue("-h", "-o", "%i", check=True).stdout.split()[0]
        env = _env(slurm, job_id, nodes, per_host)
        for _ in range(repeats):
            for launcher in ("dtrain", "srun"):
                records.append(_one(launcher, "stamp", slurm, env, (nodes, per_host), scratch, 60))
            for launcher in ("dtrain", "srun -K", "srun"):
                records.append(
                    _one(launcher, "fail", slurm, env, (nodes, per_host), scratch, cap_s)
                )
        slurm.scancel(job_id)
    shutil.rmtree(scratch, ignore_errors=True)
    return records


def _median(records: Sequence[dict[str, Any]], key: str, **want: str) -> float | None:
    chosen = [r[key] for r in records if all(r[k] == v for k, v in want.items())]
    values = [v for v in chosen if v is not None]
    return statistics.median(values) if len(values) == len(chosen) and values else None


def _secs(value: float | None) -> str:
    return "never" if value is None else f"{value:.2f} s"


def report(records: Sequence[dict[str, Any]], shape: tuple[int, int], cap_s: float) -> str:
    nodes, per_host = shape
    runs = sum(1 for r in records if r["launcher"] == "dtrain" and r["mode"] == "stamp")
    lines = [
        f"### Slurm: {nodes} nodes x {per_host} tasks, {runs} interleaved runs, medians",
        "",
        "| | dtrain launch | srun | dtrain / srun |",
        "|---|---|---|---|",
    ]
    for key, name in (("launch_s", "last task started"), ("wall_s", "whole command")):
        ours = _median(records, key, launcher="dtrain", mode="stamp")
        theirs = _median(records, key, launcher="srun", mode="stamp")
        ratio = f"x{ours / theirs:.2f}" if ours and theirs else "-"
        lines.append(f"| {name} | {_secs(ours)} | {_secs(theirs)} | {ratio} |")
    lines += [
        "",
        "Teardown after one task exits 7 (the others sleep):",
        "",
        "| | exit code | from the failure to exit | tasks alive at exit |",
        "|---|---|---|---|",
    ]
    for launcher in ("dtrain", "srun -K", "srun"):
        mine = [r for r in records if r["launcher"] == launcher and r["mode"] == "fail"]
        codes = sorted({str(r["exit"]) if r["exit"] is not None else "-" for r in mine})
        teardown = _median(mine, "teardown_s")
        if any(r["exit"] is None for r in mine):
            teardown = None
        alive = max((r["alive_at_exit"] for r in mine), default=0)
        shown = _secs(teardown) if teardown is not None else f"never (still running at {cap_s:g} s)"
        lines.append(f"| {launcher} | {', '.join(codes)} | {shown} | {alive} |")
    return "\n".join(lines) + "\n"


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nodes", type=int, default=4)
    parser.add_argument("--per-host", type=int, default=4)
    parser.add_argument("--repeats", type=int, default=5)
    parser.add_argument("--cap", type=float, default=15.0, help="how long 'never' waits")
    parser.add_argument("--json", type=Path, help="also write every record here")
    parser.add_argument("--write", type=Path, help="write the report as a page (docs/...)")
    args = parser.parse_args(argv)
    compile_dtrain()
    if os.geteuid() != 0:
        print("bench.slurm: run as root: it builds network namespaces and Slurm daemons")
        return 2
    records = measure(args.nodes, args.per_host, args.repeats, args.cap)
    if args.json:
        args.json.write_text(json.dumps(records, indent=1))
    text = report(records, (args.nodes, args.per_host), args.cap)
    print(text, end="")
    if args.write:
        args.write.write_text(PAGE.format(report=text, argv=" ".join(sys.argv[1:])))
    return 0


if __name__ == "__main__":
    sys.exit(main())
