"""Write N megabytes of numbered lines to stdout, for throughput and ordering tests."""

import sys

megabytes = float(sys.argv[1])
line = "x" * 90
count = int(megabytes * 1024 * 1024 / 100)
out = sys.stdout
for i in range(count):
    out.write(f"{i:08d} {line}\n")
out.flush()
