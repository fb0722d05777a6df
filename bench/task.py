"""The benchmark's task: the same tiny program under every launcher, on every host.

It records when it started as a file in the run's stamp directory (the hosts share /tmp with
the harness and one clock), so launch latency is read from files after the fact: no polling
of remote hosts while the launcher is busy, and no clock skew. Standard library only; it runs
under the hosts' /usr/bin/python3 with -S. Every mode ends by itself within `--life` seconds,
so a harness crash cannot leave it running for long.

Modes: stamp (exit 0 at once), sleep (silent until killed), fail (the first task to start waits
until all have started, then exits 7; the rest sleep), log (write MB of lines to stdout).
"""

import time

STARTED = time.time()

import argparse  # noqa: E402 - the start time is taken before anything else
import os  # noqa: E402
import signal  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402

FAIL_CODE = 7
POLL_S = 0.02


def write_atomically(path: str, text: str) -> None:
    """Readers see the whole file or none of it."""
    temporary = path + ".tmp"
    with open(temporary, "w") as out:
        out.write(text)
    os.replace(temporary, path)


def count(folder: str, suffix: str) -> int:
    return sum(1 for name in os.listdir(folder) if name.endswith(suffix))


def wait_for(folder: str, suffix: str, expected: int, deadline: float) -> bool:
    while time.time() < deadline:
        if count(folder, suffix) >= expected:
            return True
        time.sleep(POLL_S)
    return False


def write_lines(megabytes: float) -> None:
    """Numbered 100-byte lines, like a chatty training log."""
    line = "x" * 90
    lines = int(megabytes * 1024 * 1024 / 100)
    out = sys.stdout
    for i in range(lines):
        out.write(f"{i:08d} {line}\n")
    out.flush()


def main() -> int:
    parser = argparse.ArgumentParser()
    parser.add_argument("--dir", required=True, help="the run's stamp directory (its tag)")
    parser.add_argument("--mode", choices=("stamp", "sleep", "fail", "log"), required=True)
    parser.add_argument("--expect", type=int, required=True, help="tasks in the job")
    parser.add_argument("--life", type=float, default=60.0, help="never live longer than this")
    parser.add_argument("--mb", type=float, default=0.0, help="log mode: megabytes to write")
    args = parser.parse_args()
    # The harness ends leftover tasks with SIGUSR1 (no launcher sends it): a clean exit 0,
    # so a launcher still waiting reports the failing task's code, not the harness's kill.
    signal.signal(signal.SIGUSR1, lambda signum, frame: os._exit(0))
    deadline = STARTED + args.life
    name = f"{socket.gethostname()}.{os.getpid()}"
    write_atomically(os.path.join(args.dir, name + ".start"), f"{STARTED:.6f}\n")
    if args.mode == "log":
        write_lines(args.mb)
    if args.mode in ("stamp", "log"):
        write_atomically(os.path.join(args.dir, name + ".done"), f"{time.time():.6f}\n")
        return 0
    if args.mode == "fail":
        try:
            os.close(os.open(os.path.join(args.dir, "fail.claim"), os.O_CREAT | os.O_EXCL))
            is_failer = True
        except FileExistsError:
            is_failer = False
        if is_failer:
            wait_for(args.dir, ".start", args.expect, deadline)
            write_atomically(os.path.join(args.dir, "failed"), f"{time.time():.6f}\n")
            return FAIL_CODE
    time.sleep(max(0.0, deadline - time.time()))
    return 0


if __name__ == "__main__":
    sys.exit(main())
