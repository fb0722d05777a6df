"""Run mxnet's tools/launch.py (the dmlc tracker) unchanged on a Python without Thread.isAlive.

Python 3.9 removed `Thread.isAlive`, which the tracker still calls; the alias is added at run
time and the wheel's own launch.py then runs as `__main__`. Usage: tracker_shim.py LAUNCH_PY ARGS.
"""

import runpy
import sys
import threading

if __name__ == "__main__":
    threading.Thread.isAlive = threading.Thread.is_alive  # type: ignore[attr-defined]
    sys.argv = sys.argv[1:]
    runpy.run_path(sys.argv[0], run_name="__main__")
