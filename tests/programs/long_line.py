"""Write one line of N megabytes in pieces, then, a moment later, its newline on its own."""

import sys
import time

megabytes = float(sys.argv[1])
out = sys.stdout.buffer
piece = b"x" * 65536
for _ in range(int(megabytes * 16)):
    out.write(piece)
    out.flush()
time.sleep(0.5)
out.write(b"\n")
out.flush()
