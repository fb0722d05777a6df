"""The `dtrain` program: its console script and `python -m dtrain`.

Before the command line's modules load, dataclasses is given the cache of its compiled methods
(`codecache`): what only the program does, never a program that imports dtrain."""

from __future__ import annotations

from typing import NoReturn


def main() -> NoReturn:
    from dtrain import codecache

    codecache.install()
    from dtrain.cli import run

    run()


if __name__ == "__main__":
    main()
