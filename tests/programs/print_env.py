"""Print argv and the environment as one JSON line, for byte-exact round-trip tests."""

import json
import os
import sys

keys = sys.argv[1].split(",") if len(sys.argv) > 1 and sys.argv[1] != "-" else None
env = {k: v for k, v in os.environ.items() if keys is None or k in keys}
sys.stdout.write(json.dumps({"argv": sys.argv[1:], "env": env, "cwd": os.getcwd()}) + "\n")
