"""Start children and grandchildren (one escaping with setsid), print their pids, then sleep.

`spawn_tree.py EXIT_AFTER_S`: the leader exits with 0 after EXIT_AFTER_S (or never if -1), while
the descendants keep sleeping: dtrain must take them down with their task.
"""

import os
import subprocess
import sys
import time

child = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(3600)"])
escaped = subprocess.Popen(
    [sys.executable, "-c", "import time; time.sleep(3600)"], start_new_session=True
)
middle = subprocess.Popen(
    [
        sys.executable,
        "-c",
        "import subprocess, sys, time; "
        "g = subprocess.Popen([sys.executable, '-c', 'import time; time.sleep(3600)']); "
        "print('grandchild', g.pid, flush=True); time.sleep(3600)",
    ]
)
print(
    f"leader {os.getpid()} child {child.pid} escaped {escaped.pid} middle {middle.pid}", flush=True
)
delay = float(sys.argv[1]) if len(sys.argv) > 1 else -1
if delay >= 0:
    time.sleep(delay)
    os._exit(0)
while True:
    time.sleep(3600)
