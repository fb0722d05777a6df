"""Where dtrain's launch time goes: a phase timeline and a sampled profile of one launch, and
the steps of launches at one host beside the Python floor's.

Both wrap the ordinary `dtrain launch` of the trivial job at the headline size: the timeline
runner (bench/timeline.py) stamps each launch step; py-spy samples every thread of the
launcher, so the connect pool, the agents' reader threads and paramiko's transport threads
all show (cProfile would see only the main thread).
"""

from __future__ import annotations

import json
import shutil
import sys
from collections import Counter
from pathlib import Path
from typing import Any

from bench import scenarios
from bench.launchers import FLOOR, REPO, Command

TIMELINE = REPO / "bench" / "timeline.py"
SAMPLE_RATE = 200
TOP = 15


def timeline(
    ctx: scenarios.Context, hosts: int, per_host: int, launcher: str = "dtrain", rep: int = 0
) -> dict[str, Any]:
    """One launch with each step stamped: dtrain through bench/timeline.py, the Python floor
    by its own stamps (PYFLOOR_STAMPS), any other launcher as it is (its launch time only)."""

    def wrap(command: Command, stamp: Path) -> Command:
        out = str(stamp / "timeline.json")
        if launcher == FLOOR:
            return Command(command.argv, {**command.env, "PYFLOOR_STAMPS": out})
        return Command((sys.executable, str(TIMELINE), out, *command.argv[1:]), command.env)

    stamped = launcher in ("dtrain", FLOOR)
    run = scenarios.Run(
        ctx, launcher, hosts, per_host, "trivial", rep, wrap=wrap if stamped else None
    )
    try:
        run.start()
        run.measure_job(120.0)
        path = run.stamp / "timeline.json"
        if path.exists():
            data = json.loads(path.read_text())
            run.record["phases"] = data["events"]
            run.record["python_started_s"] = data["t0"] - run.t0
    finally:
        run.cleanup()
    return {**run.record, "scenario": "timeline"}


def steps(ctx: scenarios.Context, hosts: int, per_host: int, reps: int) -> list[dict[str, Any]]:
    """dtrain and the Python floor, each step stamped, and pdsh, interleaved (the order
    rotates): where, step by step, dtrain falls behind the floor at a size where it and pdsh
    are close. Each record's scenario is "steps"."""
    order = ["dtrain", FLOOR, "pdsh"]
    records = []
    for rep in range(reps):
        for launcher in scenarios.rotated(order, rep):
            records.append({**timeline(ctx, hosts, per_host, launcher, rep), "scenario": "steps"})
    return records


def sampled(
    ctx: scenarios.Context,
    hosts: int,
    per_host: int,
    scenario: str = "trivial",
    megabytes: float = 0.0,
) -> dict[str, Any]:
    """py-spy over one run; the summary (not the raw stacks) goes into the record."""
    spy = shutil.which("py-spy") or str(Path(sys.executable).parent / "py-spy")
    if not Path(spy).exists():
        return {"scenario": "profile", "bashrc": ctx.bashrc, "ok": False,
                "errors": ["py-spy is not installed (pip install py-spy)"]}  # fmt: skip

    def wrap(command: Command, stamp: Path) -> Command:
        out = stamp / "profile.txt"
        argv = (spy, "record", "--rate", str(SAMPLE_RATE), "--format", "raw", "--nolineno")
        return Command((*argv, "--nonblocking", "-o", str(out), "--", *command.argv), command.env)

    run = scenarios.Run(ctx, "dtrain", hosts, per_host, scenario, 0, megabytes, wrap=wrap)
    try:
        run.start()
        run.measure_job(120.0)
        path = run.stamp / "profile.txt"
        if path.exists():
            run.record["profile"] = summarize(path.read_text())
    finally:
        run.cleanup()
    return {**run.record, "scenario": "profile", "profiled": scenario}


# The launcher's threads, by the function their stacks run under.
THREAD_ROLES = (
    ("Transport.run (paramiko/transport.py)", "paramiko transport threads"),
    ("AgentSession._read_loop (dtrain/agents/session.py)", "agent reader threads"),
    ("Heartbeat._run (dtrain/agents/session.py)", "heartbeat thread"),
    ("Thread._bootstrap (threading.py)", "other threads"),
)


def summarize(raw: str) -> dict[str, Any]:
    """Collapsed stacks -> seconds of thread activity, inclusive and self, per function, and
    per thread role (the main thread runs the supervisor: log files and console)."""
    inclusive: Counter[str] = Counter()
    own: Counter[str] = Counter()
    roles: Counter[str] = Counter()
    total = 0
    for line in raw.splitlines():
        stack, _, count_text = line.rpartition(" ")
        if not stack or not count_text.isdigit():
            continue
        count = int(count_text)
        frames = stack.split(";")
        total += count
        for frame in set(frames):
            inclusive[frame] += count
        own[frames[-1]] += count
        role = next((name for entry, name in THREAD_ROLES if entry in frames), "main thread")
        roles[role] += count
    seconds = 1.0 / SAMPLE_RATE
    return {
        "rate": SAMPLE_RATE,
        "active_s": total * seconds,
        "inclusive": [(f, n * seconds) for f, n in inclusive.most_common(TOP * 2)],
        "self": [(f, n * seconds) for f, n in own.most_common(TOP)],
        "threads": [(name, n * seconds) for name, n in roles.most_common()],
    }
