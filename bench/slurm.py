"""dtrain on Slurm against plain srun, same run, as ratios (a phase of `python -m bench`).

Needs root and Debian's slurmctld, slurmd and slurm-client (scripts/test.sh installs them):
it builds the suite's namespaced hosts and a real Slurm cluster on them, holds one allocation
of every node, and inside it runs, interleaved, repeat after repeat:

- launch: `dtrain launch --framework torch -n N*T` against `srun --overlap -N N
  --ntasks-per-node=T` of the same task (bench/task.py stamps its start and exits);
- teardown after one failure (the first task exits 7 once all have started, the rest sleep):
  from that exit to the command's, and the tasks still alive then. Plain srun waits for every
  task (never, here: capped); with `-K` (--kill-on-bad-exit) it stops the step.

Every task ends by itself within its life, and the cluster, its daemons and every task are
stopped at the end whatever happens. Traffic stays on the suite's bridge (198.18.0.0/24).
"""

from __future__ import annotations

import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench import procs  # noqa: E402
from bench.launchers import task_argv  # noqa: E402
from tests.cluster.netcluster import Cluster, assert_routes_to_bridge  # noqa: E402
from tests.cluster.slurmcluster import SlurmCluster  # noqa: E402

PYTHON = sys.executable
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
    if launcher == "dtrain":
        argv = [PYTHON, "-m", "dtrain", "launch", "--framework", "torch", "--log-dir", str(logs)]
        return [*argv, "-n", str(nodes * per_host), "--", *task]
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
    logs = scratch / "dtrain-logs"
    return time_one(
        lambda task: _commands(launcher, nodes, per_host, task, logs),
        launcher,
        mode,
        env,
        nodes * per_host,
        scratch,
        cap_s,
    )


def time_one(
    argv_for: Callable[[tuple[str, ...]], list[str]],
    launcher: str,
    mode: str,
    env: dict[str, str],
    tasks: int,
    scratch: Path,
    cap_s: float,
) -> dict[str, Any]:
    """One run of `argv_for(task)` (the task: bench/task.py in `mode`): its wall time, when
    its last task started, and after a failure the teardown and the tasks alive at its exit."""
    stamps = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=scratch))
    argv = argv_for(task_argv(stamps, mode, tasks, LIFE_S))
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
        "launch_s": (max(starts) - began) if len(starts) == tasks else None,
    }
    if mode == "fail":
        failed = stamps / "failed"
        record["teardown_s"] = (ended - float(failed.read_text())) if failed.exists() else None
        on_nodes = procs.tasks(str(stamps))
        record["alive_at_exit"] = len(on_nodes)
        procs.kill(on_nodes, 10)  # SIGUSR1: the task's own clean exit (see bench/task.py)
        procs.wait_gone(on_nodes, 10.0)
    if popen.poll() is None:
        procs.killpg(popen.pid)
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


def median_of(records: Sequence[dict[str, Any]], key: str, **want: str) -> float | None:
    chosen = [r[key] for r in records if all(r[k] == v for k, v in want.items())]
    values = [v for v in chosen if v is not None]
    return statistics.median(values) if len(values) == len(chosen) and values else None


def secs(value: float | None) -> str:
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
        ours = median_of(records, key, launcher="dtrain", mode="stamp")
        theirs = median_of(records, key, launcher="srun", mode="stamp")
        ratio = f"x{ours / theirs:.2f}" if ours and theirs else "-"
        lines.append(f"| {name} | {secs(ours)} | {secs(theirs)} | {ratio} |")
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
        teardown = median_of(mine, "teardown_s")
        if any(r["exit"] is None for r in mine):
            teardown = None
        alive = max((r["alive_at_exit"] for r in mine), default=0)
        shown = secs(teardown) if teardown is not None else f"never (still running at {cap_s:g} s)"
        lines.append(f"| {launcher} | {', '.join(codes)} | {shown} | {alive} |")
    return "\n".join(lines) + "\n"
