"""Act according to this task's name: `by_task.py TASK=ACTION ... [*=ACTION]`.

Actions: `exit:CODE[:DELAY_S]`, `sleep` (forever), `ignore-term` (forever, ignoring SIGTERM),
`kill-self:SIGNUM[:DELAY_S]`, `tree` (spawn descendants, sleep), `tree-exit:DELAY_S` (spawn
descendants, then the leader exits 0), `traceback` (unhandled exception, then hang at exit).
Each task prints `ready <task> <pid>` first so tests can wait for it.
"""

import os
import signal
import subprocess
import sys
import threading
import time

task = os.environ.get("DTRAIN_TASK", "?")
actions = dict(arg.split("=", 1) for arg in sys.argv[1:])
action = actions.get(task, actions.get("*", "exit:0"))
kind, _, rest = action.partition(":")
print(f"ready {task} {os.getpid()}", flush=True)


def spawn_tree() -> None:
    sleeper = [sys.executable, "-c", "import time; time.sleep(3600)"]
    child = subprocess.Popen(sleeper)
    escaped = subprocess.Popen(sleeper, start_new_session=True)
    print(f"descendants {child.pid} {escaped.pid}", flush=True)


if kind == "exit":
    code, _, delay = rest.partition(":")
    time.sleep(float(delay or 0))
    print(f"{task} exits with {code}", file=sys.stderr, flush=True)
    sys.exit(int(code))
elif kind == "kill-self":
    signum, _, delay = rest.partition(":")
    time.sleep(float(delay or 0))
    os.kill(os.getpid(), int(signum))
elif kind in ("sleep", "ignore-term", "tree"):
    if kind == "ignore-term":
        signal.signal(signal.SIGTERM, signal.SIG_IGN)
    if kind == "tree":
        spawn_tree()
    while True:
        time.sleep(3600)
elif kind == "tree-exit":
    spawn_tree()
    time.sleep(float(rest or 0))
    os._exit(0)
elif kind == "traceback":
    threading.Thread(target=lambda: time.sleep(3600)).start()
    raise RuntimeError(f"injected failure in {task}")
else:
    sys.exit(f"unknown action {action!r}")
