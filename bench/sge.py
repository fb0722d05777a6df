"""dtrain inside a Grid Engine job against `qrsh -inherit` by hand, same run, as ratios.

`python -m bench.sge [HOSTS PER_HOST REPEATS]` (root; the gridengine packages scripts/test.sh
installs): the suite's namespaced hosts, a real Grid Engine on them, one PE job holding every
slot, and from a shell of that job on its first host, interleaved: `dtrain launch --framework
torch -n N*T` against one `qrsh -inherit -nostdin -V HOST TASK &` per slot and a `wait` (the
by-hand way) of the same task (bench/task.py stamps its start and exits). Medians of the time
to the last task started and of the whole command. Everything is stopped at the end.
"""

from __future__ import annotations

import shlex
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from bench.launchers import task_argv  # noqa: E402
from tests.cluster.netcluster import Cluster, assert_routes_to_bridge  # noqa: E402
from tests.cluster.sgecluster import SgeCluster  # noqa: E402

PYTHON = sys.executable
LIFE_S = 60.0
LAUNCHERS = ("dtrain", "qrsh -inherit")


def _command(launcher: str, hosts: list[str], per_host: int, task: list[str], logs: Path) -> str:
    if launcher == "dtrain":
        argv = [PYTHON, "-m", "dtrain", "launch", "--framework", "torch", "--log-dir", str(logs)]
        return shlex.join([*argv, "-n", str(len(hosts) * per_host), "--", *task])
    one = shlex.quote(shlex.join(task))
    starts = [f"qrsh -inherit -nostdin -V {h} {one} &" for h in hosts for _ in range(per_host)]
    return "\n".join([*starts, "wait"])


def _hold_job(sge: SgeCluster, slots: int, scratch: Path) -> tuple[str, str, dict[str, str]]:
    """A PE job of every slot that sleeps; its id, first host and environment."""
    env_file = scratch / "job.env"
    body = f"hostname > {scratch}/master; env -0 > {env_file}.tmp; mv {env_file}.tmp {env_file}"
    job = sge.submit(f"{body}\nsleep {LIFE_S * 20:g}", slots, cwd=scratch)
    deadline = time.monotonic() + 60
    while not env_file.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"Grid Engine job {job} did not start within 60 s")
        time.sleep(0.1)
    pairs = (i.split("=", 1) for i in env_file.read_text().split("\0") if "=" in i)
    return job, (scratch / "master").read_text().strip(), dict(pairs)


def measure(hosts: int, per_host: int, repeats: int) -> list[dict[str, object]]:
    records: list[dict[str, object]] = []
    scratch = Path(tempfile.mkdtemp(prefix="bench-sge-"))
    scratch.chmod(0o755)
    with Cluster(hosts) as cluster, SgeCluster(cluster, slots_per_host=per_host) as sge:
        assert_routes_to_bridge(cluster)
        job, first, env = _hold_job(sge, hosts * per_host, scratch)
        names = [line.split()[0] for line in Path(env["PE_HOSTFILE"]).read_text().splitlines()]
        for _ in range(repeats):
            for launcher in LAUNCHERS:
                stamps = Path(tempfile.mkdtemp(prefix="stamp-", dir=scratch))
                task = list(task_argv(stamps, "stamp", hosts * per_host, LIFE_S))
                script = _command(launcher, names, per_host, task, scratch / "dtrain-logs")
                began = time.time()
                done = sge.run(["sh", "-c", script], first, env=env, cwd=scratch, timeout=120)
                ended = time.time()
                starts = [float(p.read_text()) for p in stamps.glob("*.start")]
                complete = len(starts) == hosts * per_host and done.returncode == 0
                records.append(
                    {
                        "launcher": launcher,
                        "exit": done.returncode,
                        "wall_s": ended - began,
                        "launch_s": max(starts) - began if complete else None,
                    }
                )
        sge.qdel(job)
    shutil.rmtree(scratch, ignore_errors=True)
    return records


def _median(records: list[dict[str, object]], launcher: str, key: str) -> float | None:
    values = [r[key] for r in records if r["launcher"] == launcher]
    floats = [float(v) for v in values if isinstance(v, float)]
    return statistics.median(floats) if floats and len(floats) == len(values) else None


def report(records: list[dict[str, object]], hosts: int, per_host: int) -> str:
    runs = sum(1 for r in records if r["launcher"] == "dtrain")
    lines = [
        f"### Grid Engine: {hosts} hosts x {per_host} tasks, {runs} interleaved runs, medians",
        "",
        "| | dtrain launch | qrsh -inherit by hand | dtrain / by hand |",
        "|---|---|---|---|",
    ]
    for key, name in (("launch_s", "last task started"), ("wall_s", "whole command")):
        ours, theirs = (_median(records, launcher, key) for launcher in LAUNCHERS)
        ratio = f"x{ours / theirs:.2f}" if ours and theirs else "-"
        shown = [f"{v:.2f} s" if v is not None else "failed" for v in (ours, theirs)]
        lines.append(f"| {name} | {shown[0]} | {shown[1]} | {ratio} |")
    return "\n".join(lines) + "\n"


if __name__ == "__main__":
    shape = [int(a) for a in sys.argv[1:4]] or [3, 2, 5]
    n_hosts, n_per_host, n_repeats = (shape + [3, 2, 5][len(shape) :])[:3]
    print(report(measure(n_hosts, n_per_host, n_repeats), n_hosts, n_per_host), end="")
