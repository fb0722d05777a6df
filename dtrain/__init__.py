"""dtrain: launch distributed training jobs over ssh, and never leave a process behind."""

__version__ = "0.1.0"
