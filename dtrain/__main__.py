"""The `dtrain` program: its console script and `python -m dtrain`.

A Ctrl-C while the command line's modules load is held until the command line can report it
(no traceback; with --json, a document)."""

from __future__ import annotations

import signal
from typing import NoReturn


def main() -> NoReturn:
    held: list[int] = []
    if signal.getsignal(signal.SIGINT) is signal.default_int_handler:  # not SIG_IGN (`cmd &`)
        signal.signal(signal.SIGINT, lambda signum, frame: held.append(signum))
    from dtrain.cli import run

    run(interrupted=bool(held))


if __name__ == "__main__":
    main()
