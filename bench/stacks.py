"""How long `dtrain stacks` takes against py-spy by hand over ssh (a phase of `python -m bench`).

On the namespaced sshd test cluster, starts jobs with `dtrain launch` (every task blocked in a
named function, as a hung job's are), and times, interleaved on the same tasks:

* dtrain: `dtrain stacks -H hosts --job J`: one command; every host's agent runs py-spy on its
  tasks in parallel, and the answer comes grouped;
* by hand: what users do today (the scripts people share for this): per host, one
  `ssh host pgrep -f SCRIPT` to find the pids, then one `ssh host py-spy dump --pid PID` per
  task, one after another.
"""

from __future__ import annotations

import json
import shlex
import signal
import statistics
import subprocess
import sys
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # tests.cluster.netcluster lives in the repo, not the package

from tests.cluster.netcluster import Cluster  # noqa: E402

SCRIPT = REPO / "tests" / "programs" / "where_stuck.py"
PYTHON = sys.executable
PY_SPY = str(Path(PYTHON).parent / "py-spy")
START_TIMEOUT_S = 120.0
COMMAND_TIMEOUT_S = 120.0


def dtrain_argv(*args: str) -> list[str]:
    return [PYTHON, "-m", "dtrain", *args]


def start_job(
    cluster: Cluster, hosts: int, tasks: int, scratch: Path
) -> tuple[subprocess.Popen[bytes], str, Path]:
    """A running job of `tasks` tasks spread over `hosts` hosts, all ready; its id and log dir."""
    names = [f"h{k}" for k in range(1, hosts + 1)]
    hosts_file = cluster.hosts_file(names=names, slots=tasks // hosts)
    log_root = scratch / f"logs-{hosts}-{tasks}"
    argv = dtrain_argv(
        "launch", "-H", str(hosts_file), "--ssh-config", str(cluster.ssh_config),
        "--log-dir", str(log_root), "--framework", "torch", "-n", str(tasks),
        "--", PYTHON, str(SCRIPT), "none",
    )  # fmt: skip
    proc = subprocess.Popen(argv, cwd=REPO, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    deadline = time.monotonic() + START_TIMEOUT_S
    while time.monotonic() < deadline:
        latest = log_root / "latest"
        logs = [latest / f"worker.{i}.log" for i in range(tasks)]
        if latest.exists() and all(p.exists() and "ready" in p.read_text() for p in logs):
            return proc, latest.resolve().name, hosts_file
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    proc.wait(30)
    raise RuntimeError(f"{tasks} tasks on {hosts} hosts did not start within {START_TIMEOUT_S}s")


def time_dtrain(cluster: Cluster, hosts_file: Path, job: str, scratch: Path, tasks: int) -> float:
    argv = dtrain_argv(
        "stacks", "-H", str(hosts_file), "--ssh-config", str(cluster.ssh_config),
        "--job", job, "--log-dir", str(scratch), "--json",
    )  # fmt: skip
    started = time.perf_counter()
    out = subprocess.run(argv, cwd=REPO, capture_output=True, timeout=COMMAND_TIMEOUT_S)
    elapsed = time.perf_counter() - started
    taken = [t for t in json.loads(out.stdout)["data"]["tasks"] if t["threads"]]
    if len(taken) != tasks:
        raise RuntimeError(f"dtrain stacks took {len(taken)} of {tasks} stacks: {out.stderr!r}")
    return elapsed


def time_by_hand(cluster: Cluster, hosts: int, tasks: int) -> float:
    """pgrep per host, then one ssh per pid running py-spy dump, one after another."""
    started = time.perf_counter()
    dumped = 0
    for k in range(1, hosts + 1):
        find = [*cluster.ssh_argv(f"h{k}"), f"pgrep -f {shlex.quote(SCRIPT.name)}"]
        found = subprocess.run(find, capture_output=True, text=True, timeout=COMMAND_TIMEOUT_S)
        for pid in found.stdout.split():
            dump = [*cluster.ssh_argv(f"h{k}"), f"{shlex.quote(PY_SPY)} dump --pid {pid}"]
            result = subprocess.run(dump, capture_output=True, timeout=COMMAND_TIMEOUT_S)
            dumped += result.returncode == 0
    elapsed = time.perf_counter() - started
    if dumped != tasks:
        raise RuntimeError(f"py-spy by hand dumped {dumped} of {tasks} tasks")
    return elapsed


def measure(
    cluster: Cluster, scratch: Path, reps: int, configs: Sequence[tuple[int, int]]
) -> list[dict[str, float]]:
    rows = []
    for hosts, tasks in configs:
        proc, job, hosts_file = start_job(cluster, hosts, tasks, scratch)
        try:
            ours, theirs = [], []
            for rep in range(reps):
                order = (0, 1) if rep % 2 == 0 else (1, 0)  # interleaved: neither always first
                for which in order:
                    if which == 0:
                        ours.append(time_dtrain(cluster, hosts_file, job, scratch, tasks))
                    else:
                        theirs.append(time_by_hand(cluster, hosts, tasks))
        finally:
            proc.send_signal(signal.SIGINT)
            proc.wait(60)
        dtrain_s, by_hand_s = statistics.median(ours), statistics.median(theirs)
        rows.append({"hosts": hosts, "tasks": tasks, "dtrain_s": dtrain_s, "by_hand_s": by_hand_s})
    return rows


def table(rows: Sequence[dict[str, float]], reps: int) -> str:
    lines = [
        f"Median of {reps}, seconds, same run, interleaved:",
        "",
        "| hosts | tasks | dtrain stacks | py-spy by hand over ssh | by hand / dtrain |",
        "|---:|---:|---:|---:|---:|",
    ]
    for row in rows:
        ratio = row["by_hand_s"] / row["dtrain_s"]
        lines.append(
            f"| {row['hosts']:.0f} | {row['tasks']:.0f} | {row['dtrain_s']:.2f} | "
            f"{row['by_hand_s']:.2f} | {ratio:.1f}x |"
        )
    return "\n".join(lines) + "\n"
