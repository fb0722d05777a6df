"""`dtrain launch` from request to result: lifecycle, supervisor, sync, results."""

# What --sync-dst-dir never copies (--sync-exclude adds to it). Kept here, not in `sync`, so that
# a launch's options can name it without loading the copier before the first connection.
DEFAULT_EXCLUDES = ("__pycache__", "*.pyc", ".git", "dtrain-logs")
