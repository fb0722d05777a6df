"""`python -m bench.restart`: from a task's failure to every task of the next attempt running,
`--max-restarts 1 --restart-delay 0` against a person's relaunch (dtrain twice, back to back).

Same cluster, same run, interleaved. Each task stamps its start into its attempt's folder
(the hosts share /tmp and this machine's clock); the first task of the failing attempt waits
until every task started, stamps `failed` and exits 7; the others sleep until stopped.
"""

from __future__ import annotations

import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))

TASK = r"""
import os, sys, time
started = time.time()
base, expect = sys.argv[1], int(sys.argv[2])
folder = os.path.join(base, "a" + os.environ.get("DTRAIN_RESTART_COUNT", sys.argv[3]))
os.makedirs(folder, exist_ok=True)
def stamp(name, t):
    with open(os.path.join(folder, name + ".tmp"), "w") as out:
        out.write(repr(t))
    os.replace(os.path.join(folder, name + ".tmp"), os.path.join(folder, name))
stamp("%s.%d.start" % (os.uname()[1], os.getpid()), started)
if not folder.endswith("a0"):
    sys.exit(0)
try:
    os.close(os.open(os.path.join(folder, "claim"), os.O_CREAT | os.O_EXCL))
except FileExistsError:
    time.sleep(60)
    sys.exit(0)
while sum(n.endswith(".start") for n in os.listdir(folder)) < expect and time.time() < started + 60:
    time.sleep(0.01)
stamp("failed", time.time())
sys.exit(7)
"""


def gap_s(base: Path) -> float:
    """From the failure stamp to the last task of the next attempt starting."""
    failed = float((base / "a0" / "failed").read_text())
    starts = [float(p.read_text()) for p in (base / "a1").glob("*.start")]
    return max(starts) - failed


def dtrain(common: list[str], *rest: str) -> int:
    argv = [sys.executable, "-m", "dtrain", "launch", *common, *rest]
    return subprocess.run(argv, cwd=REPO, capture_output=True, timeout=180).returncode


def measure(n_hosts: int, reps: int, scratch: Path) -> tuple[list[float], list[float]]:
    from tests.cluster.netcluster import Cluster, assert_routes_to_bridge

    cluster = Cluster(n_hosts)
    cluster.start()
    try:
        assert_routes_to_bridge(cluster)
        for host in cluster.hosts:
            cluster.blank_bashrc(host)
        task = scratch / "task.py"
        task.write_text(TASK)
        common = ["-H", str(cluster.hosts_file()), "--ssh-config", str(cluster.ssh_config)]
        common += ["--framework", "torch", "--grace", "1", "--log-dir", str(scratch / "logs")]
        restart, by_hand = [], []
        for rep in range(reps):
            for way in ("restart", "by hand") if rep % 2 == 0 else ("by hand", "restart"):
                base = Path(tempfile.mkdtemp(dir=scratch))
                job = ["/usr/bin/python3", "-S", str(task), str(base), str(n_hosts)]
                if way == "restart":
                    flags = ["--max-restarts", "1", "--restart-delay", "0", "--restart-window", "0"]
                    assert dtrain(common, *flags, "--", *job, "0") == 0
                    restart.append(gap_s(base))
                else:
                    assert dtrain(common, "--", *job, "0") == 7
                    assert dtrain(common, "--", *job, "1") == 0
                    by_hand.append(gap_s(base))
        return restart, by_hand
    finally:
        cluster.stop()


def main() -> int:
    shapes = [(1, 6), (8, 4), (48, 2)] if "--full" in sys.argv else [(1, 6), (8, 4)]
    print("| hosts | restart (s, median) | by hand: dtrain twice (s, median) | by hand / restart |")
    print("|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory(prefix="dtrain-bench-restart-") as scratch:
        for n_hosts, reps in shapes:
            restart, by_hand = measure(n_hosts, reps, Path(scratch))
            a, b = statistics.median(restart), statistics.median(by_hand)
            print(f"| {n_hosts} | {a:.3f} | {b:.3f} | {b / a:.2f}x |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
