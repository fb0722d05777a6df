"""`python -m dtrain` is the `dtrain` command."""

from dtrain.cli import run

run()
