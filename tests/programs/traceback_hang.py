"""Raise an unhandled exception, then block at interpreter exit like an MXNet kvstore worker."""

import threading
import time


def block_forever() -> None:
    while True:
        time.sleep(3600)


# A non-daemon thread keeps the interpreter from exiting after the traceback is printed.
threading.Thread(target=block_forever).start()
print("about to fail", flush=True)
raise RuntimeError("injected failure for the test")
