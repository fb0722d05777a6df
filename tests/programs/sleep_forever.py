"""Sleep until killed, like a TensorFlow ps task in `server.join()`."""

import os
import time

print(f"sleeping as pid {os.getpid()}", flush=True)
while True:
    time.sleep(3600)
