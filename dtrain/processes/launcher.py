"""The `dtrain launch` process a job's job.json names, and jobs whose launcher died. Pure.

Its own module, apart from the sweep's other results, because every launch records its
launcher: importing those (their dataclasses) would cost each launch's start ~9 ms.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class Launcher:
    """The `dtrain launch` process that ran a job, as its job.json names it.

    The pid with its start time (clock ticks since boot) and the boot, because pids are reused.
    """

    pid: int
    host: str
    start_ticks: int | None = None
    boot_id: str | None = None

    def to_dict(self) -> dict[str, object]:
        return {
            "pid": self.pid,
            "host": self.host,
            "start_ticks": self.start_ticks,
            "boot_id": self.boot_id,
        }

    @classmethod
    def from_dict(cls, entry: object) -> Launcher | None:
        """From job.json's `launcher`; None when it is missing or malformed (older files)."""
        if not isinstance(entry, Mapping):
            return None
        pid, host = entry.get("pid"), entry.get("host")
        if not isinstance(pid, int) or isinstance(pid, bool) or not isinstance(host, str):
            return None
        ticks, boot = entry.get("start_ticks"), entry.get("boot_id")
        return cls(
            pid=pid,
            host=host,
            start_ticks=ticks if isinstance(ticks, int) and not isinstance(ticks, bool) else None,
            boot_id=boot if isinstance(boot, str) else None,
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
