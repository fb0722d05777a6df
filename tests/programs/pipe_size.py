"""Write COUNT numbered lines to stdout, flushing each (one write per line, like `python -u`),
PAUSE seconds apart, then print the stdout pipe's capacity to stderr."""

import fcntl
import sys
import time

count, pause = int(sys.argv[1]), float(sys.argv[2])
F_GETPIPE_SZ = 1032  # fcntl.F_GETPIPE_SZ from Python 3.10 on
for i in range(count):
    sys.stdout.write(f"{i:08d} {'x' * 90}\n")
    sys.stdout.flush()
    if pause:
        time.sleep(pause)
sys.stderr.write(f"{fcntl.fcntl(1, F_GETPIPE_SZ)}\n")
