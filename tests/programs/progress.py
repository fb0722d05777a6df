"""Write what progress bars write: a partial line, then `\\r` updates, then a burst of them.

argv: a path. The partial line and each shown update wait (bounded) for `PATH.N` to exist,
which the test creates once it has seen that output on dtrain's console.
"""

import os
import sys
import time

base = sys.argv[1]
out = sys.stdout


def wait_for(step: int) -> None:
    deadline = time.monotonic() + 20
    while not os.path.exists(f"{base}.{step}") and time.monotonic() < deadline:
        time.sleep(0.02)


out.write("start\nloading")
out.flush()
wait_for(1)
out.write(" done\n")
for step, percent in enumerate((10, 50), start=2):
    out.write(f"\rbar {percent}%")
    out.flush()
    wait_for(step)
for n in range(1000):
    out.write(f"\rburst {n}")
    out.flush()
out.write("\rbar 100%\n")
out.flush()
