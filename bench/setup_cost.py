"""What `--setup` adds to a launch, same run, as a ratio: `python -m bench.setup_cost`.

Needs root: it builds the suite's namespaced sshd hosts (tests/cluster/netcluster.py) and, on
them, launches the same trivial job with and without a trivial `--setup` command, interleaved,
repeat after repeat. The setup runs once per host, started by its agent in `$SHELL`, so the
difference is that shell's work and one request per host, not one round per task. Traffic
stays on the suite's bridge (198.18.0.0/24); the hosts are torn down at the end whatever
happens.
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Sequence
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
sys.path.insert(0, str(REPO))

from tests.cluster.netcluster import Cluster, assert_routes_to_bridge  # noqa: E402

SETUP = "export DTRAIN_SETUP_PROBE=1"
RUN_LIMIT_S = 60.0


def measure(hosts: int, repeats: int) -> dict[str, list[float]]:
    times: dict[str, list[float]] = {"without --setup": [], "with --setup": []}
    with Cluster(hosts) as cluster, tempfile.TemporaryDirectory(prefix="bench-setup-") as cwd:
        assert_routes_to_bridge(cluster)
        base = [sys.executable, "-m", "dtrain", "launch", "-H", str(cluster.hosts_file())]
        base += ["--ssh-config", str(cluster.ssh_config), "-n", str(hosts), "-s", "0"]
        for _ in range(repeats):
            for kind, extra in (("without --setup", []), ("with --setup", ["--setup", SETUP])):
                started = time.monotonic()
                subprocess.run(
                    [*base, *extra, "--", "true"],
                    cwd=cwd,
                    check=True,
                    capture_output=True,
                    stdin=subprocess.DEVNULL,
                    timeout=RUN_LIMIT_S,
                )
                times[kind].append(time.monotonic() - started)
    return times


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--hosts", type=int, default=3)
    parser.add_argument("--repeats", type=int, default=7)
    args = parser.parse_args(argv)
    if os.geteuid() != 0:
        print("bench.setup_cost: run as root: it builds network namespaces")
        return 2
    times = measure(args.hosts, args.repeats)
    plain, setup = (statistics.median(v) for v in times.values())
    print(f"{args.hosts} hosts, trivial job, {args.repeats} interleaved runs, medians:")
    print(f"  without --setup  {plain:.2f} s")
    print(f"  with --setup     {setup:.2f} s  (x{setup / plain:.2f})")
    return 0


if __name__ == "__main__":
    sys.exit(main())
