"""Exit with the code given (after an optional delay): `exit_with.py CODE [DELAY_S]`."""

import sys
import time

if len(sys.argv) > 2:
    time.sleep(float(sys.argv[2]))
print(f"exiting with {sys.argv[1]}", flush=True)
print(f"stderr line before exit {sys.argv[1]}", file=sys.stderr, flush=True)
sys.exit(int(sys.argv[1]))
