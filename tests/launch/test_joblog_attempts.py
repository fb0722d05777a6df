"""A restarting job's directory: each attempt's logs kept in attempt-N/, the top level linking
each name to the newest attempt's file, `latest` on the job; which launcher `dtrain kill` may
signal."""

from __future__ import annotations

import os
import stat
from pathlib import Path

from dtrain.launch import joblog
from dtrain.plan import planner
from dtrain.plan.hosts import Host, local_host
from dtrain.plan.spec import Framework, JobPlan
from dtrain.processes.launcher import Launcher


def plan_for(job: str, workers: int, framework: str = "dmlc") -> JobPlan:
    request = planner.JobRequest(
        command=("python", "t.py"),
        local_host=local_host("here"),
        framework=Framework.parse(framework),
        num_workers=workers,
        num_servers=1,
        hosts=(Host("h1"), Host("h2")),
    )
    facts = planner.Facts(
        job_id=job,
        hosts={
            h.key: planner.HostFacts(
                address=f"198.18.0.{10 + i}", interfaces={}, free_ports=(9000,)
            )
            for i, h in enumerate((*request.hosts, request.local_host), start=1)
        },
    )
    return planner.plan_job(request, facts)


def test_each_attempt_keeps_its_logs_and_the_top_level_follows_the_newest(
    tmp_path: Path,
) -> None:
    paths = joblog.create(tmp_path, "job")
    joblog.populate(paths, plan_for("job", 3), "here", attempt=1)
    assert os.readlink(tmp_path / "latest") == "job"
    joblog.populate(paths, plan_for("job", 2), "here", attempt=2)  # a host dropped: fewer
    attempt = paths.dir / "attempt-2"
    assert stat.S_IMODE(attempt.stat().st_mode) == 0o700
    assert os.readlink(paths.dir / "worker.1.log") == "attempt-2/worker.1.log"
    assert not (paths.dir / "worker.2.log").is_symlink()  # no link into an older attempt
    assert (paths.dir / "attempt-1").is_dir()
    assert os.readlink(tmp_path / "latest") == "job"


def test_only_a_live_launcher_on_this_host_is_named_for_kill(tmp_path: Path) -> None:
    me = joblog.this_launcher("here")
    gone = Launcher(pid=me.pid, host="here", create_time=1.0, boot_time=me.boot_time)
    elsewhere = Launcher(me.pid, "there", me.create_time, me.boot_time)
    for job, launcher in (("a", me), ("b", gone), ("c", elsewhere)):
        paths = joblog.create(tmp_path, job)
        job_file = joblog.JobFile(paths)
        job_file.start(plan_for(job, 1), launcher)
        job_file.update(max_restarts=1)
    paths = joblog.create(tmp_path, "d")  # no --max-restarts: its tasks killed end it
    joblog.JobFile(paths).start(plan_for("d", 1), me)
    assert joblog.running_launchers(tmp_path, "here") == [("a", me)]
    assert joblog.running_launchers(tmp_path, "here", job="b") == []
