"""Ignore SIGTERM, so only SIGKILL stops it (a worker stuck in native code)."""

import os
import signal
import time

signal.signal(signal.SIGTERM, signal.SIG_IGN)
print(f"ignoring SIGTERM as pid {os.getpid()}", flush=True)
while True:
    time.sleep(3600)
