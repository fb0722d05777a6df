"""From a task's failure to every task of the next attempt running: `--max-restarts 1
--restart-delay 0` against a person's relaunch (dtrain twice, back to back). A phase of
`python -m bench`, on its sshd cluster, the two ways interleaved.

Each task stamps its start into its attempt's folder (the hosts share /tmp and this machine's
clock); the first task of the failing attempt waits until every task started, stamps `failed`
and exits 7; the others sleep until stopped.
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any

from bench.scenarios import Context, rotated

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
WAYS = ("restart", "by hand")


def gap_s(base: Path) -> float:
    """From the failure stamp to the last task of the next attempt starting."""
    failed = float((base / "a0" / "failed").read_text())
    return max(float(p.read_text()) for p in (base / "a1").glob("*.start")) - failed


def measure(ctx: Context, n_hosts: int, reps: int) -> list[dict[str, Any]]:
    scratch = ctx.setup.scratch
    task = scratch / "restart_task.py"
    task.write_text(TASK)
    hosts = scratch / f"restart-hosts-{n_hosts}"
    hosts.write_text("".join(f"{name}\n" for name in ctx.hosts[:n_hosts]))
    common = [sys.executable, "-m", "dtrain", "launch", "-H", str(hosts), "--framework", "torch"]
    common += ["--ssh-config", str(ctx.setup.ssh_config), "--grace", "1"]
    common += ["--log-dir", str(scratch / "restart-logs")]

    def dtrain(*rest: str) -> int:
        return subprocess.run([*common, *rest], capture_output=True, timeout=180).returncode

    records = []
    for rep in range(reps):
        for way in rotated(WAYS, rep):
            base = Path(tempfile.mkdtemp(dir=scratch))
            job = ["/usr/bin/python3", "-S", str(task), str(base), str(n_hosts)]
            if way == "restart":
                flags = ["--max-restarts", "1", "--restart-delay", "0", "--restart-window", "0"]
                ok = dtrain(*flags, "--", *job, "0") == 0
            else:
                ok = dtrain("--", *job, "0") == 7 and dtrain("--", *job, "1") == 0
            record = {"scenario": "restart", "launcher": way, "rep": rep, "hosts": n_hosts}
            records.append(
                {**record, "per_host": 1, "ok": ok, "gap_s": gap_s(base) if ok else None}
            )
    return records
