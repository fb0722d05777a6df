"""The `dtrain launch` process a job's job.json names, and jobs whose launcher died. Pure.

Its own module, apart from the sweep's other results, because every launch records its
launcher: importing those (their dataclasses) would cost each launch's start ~9 ms.
"""

from __future__ import annotations

import math
from collections.abc import Mapping
from dataclasses import dataclass


def _seconds(value: object) -> float | None:
    """A time from job.json: a finite number, or None (older files, or anything else)."""
    if isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value):
        return float(value)
    return None


@dataclass(frozen=True, slots=True)
class Launcher:
    """The `dtrain launch` process that ran a job, as its job.json names it.

    The pid with when it started and when its machine booted (seconds since the epoch, as
    psutil reads them), because pids are reused: the same pid started as long after the same
    boot is the same process.
    """

    pid: int
    host: str
    create_time: float | None = None
    boot_time: float | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "host": self.host,
            "create_time": self.create_time,
            "boot_time": self.boot_time,
        }

    @classmethod
    def from_dict(cls, entry: object) -> Launcher | None:
        """From job.json's `launcher`; None when it is missing or malformed (older files)."""
        if not isinstance(entry, Mapping):
            return None
        pid, host = entry.get("pid"), entry.get("host")
        if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(host, str):
            return None
        return cls(
            pid=pid,
            host=host,
            create_time=_seconds(entry.get("create_time")),
            boot_time=_seconds(entry.get("boot_time")),
        )


@dataclass(frozen=True, slots=True)
class DeadLauncherJob:
    """A job whose job.json said running after its launcher was gone (killed, crashed)."""

    job_id: str
    log_dir: str
    launcher: Launcher
    started_at: float | None = None

    def to_dict(self, processes_left: int) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "state": "launcher_died",
            "log_dir": self.log_dir,
            "launcher": self.launcher.to_dict(),
            "started_at": self.started_at,
            "processes_left": processes_left,
        }
