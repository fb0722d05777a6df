"""Fails on a job's first attempts, then succeeds: `restart_probe.py TASK N CODE [DELAY_S]`.

Every task first prints its attempt variables as one JSON line; then the task named TASK (or
every task: `all`) exits with CODE while DTRAIN_RESTART_COUNT < N, after DELAY_S; the others
(and every task from attempt N on) exit 0 after DELAY_S. CODE `hang` sleeps instead. The line
also counts the processes of an earlier attempt of the same job this host still runs
(`earlier`, read from /proc by their environment): a restart must find none.
"""

import json
import os
import sys
import time

KEYS = (
    "DTRAIN_RESTART_COUNT",
    "DTRAIN_MAX_RESTARTS",
    "TORCHELASTIC_RESTART_COUNT",
    "TORCHELASTIC_MAX_RESTARTS",
    "DTRAIN_TASK",
    "WORLD_SIZE",
    "RANK",
    "DMLC_NUM_WORKER",
    "DMLC_NUM_SERVER",
    "DMLC_ROLE",
)


def earlier_attempts(job: str, attempt: int) -> int:
    """This host's processes of `job` started for an earlier attempt."""
    found = 0
    for entry in os.listdir("/proc"):
        try:
            with open(f"/proc/{entry}/environ", "rb") as file:
                env = dict(item.split(b"=", 1) for item in file.read().split(b"\0") if b"=" in item)
        except (OSError, ValueError):
            continue
        count = env.get(b"DTRAIN_RESTART_COUNT")
        if env.get(b"DTRAIN_JOB_ID") == job.encode() and count is not None:
            found += int(count) < attempt
    return found


task, failing, code = sys.argv[1], int(sys.argv[2]), sys.argv[3]
delay_s = float(sys.argv[4]) if len(sys.argv) > 4 else 0.0
attempt = int(os.environ.get("DTRAIN_RESTART_COUNT", "0"))
line: dict[str, object] = {key: os.environ.get(key) for key in KEYS}
line["earlier"] = earlier_attempts(os.environ.get("DTRAIN_JOB_ID", ""), attempt)
print(json.dumps(line), flush=True)
fails = attempt < failing and task in ("all", os.environ.get("DTRAIN_TASK"))
if fails and code == "hang":
    time.sleep(3600)
time.sleep(delay_s)
sys.exit(int(code) if fails else 0)
