"""Print a handled traceback, then keep computing for a while and exit 0: not a hang."""

import sys
import time
import traceback

try:
    raise ValueError("handled")
except ValueError:
    traceback.print_exc()
deadline = time.monotonic() + float(sys.argv[1])
total = 0
while time.monotonic() < deadline:
    total += sum(range(1000))
print("done", total > 0, flush=True)
