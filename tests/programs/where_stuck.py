"""Stand still in a named function: `where_stuck.py BUSY_TASK`.

The task named BUSY_TASK spins in `compute_step`; every other task blocks in `wait_for_peer`.
Each prints `ready <task>` first so tests can wait for it.
"""

import os
import sys
import time

task = os.environ.get("DTRAIN_TASK", "?")


def wait_for_peer() -> None:
    time.sleep(3600)


def compute_step() -> None:
    deadline = time.monotonic() + 3600
    while time.monotonic() < deadline:
        spin_until = time.monotonic() + 0.01
        while time.monotonic() < spin_until:
            pass
        time.sleep(0.01)  # half a core: busy, yet light on a shared machine


print(f"ready {task}", flush=True)
if task == sys.argv[1]:
    compute_step()
else:
    wait_for_peer()
