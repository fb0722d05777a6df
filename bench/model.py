"""What dtrain's launch does past this machine: a small simulation calibrated by measurements.

On a real cluster each host's own work (sshd, its login shell, the agent's start) runs on that
host, in parallel with every other host; what grows with the host count is the launcher's own
work, which runs on one machine and mostly under one GIL. So the simulation treats the launcher
as one CPU served first come, first served, and each host as a pipeline of steps that each
need some launcher CPU and then some time elsewhere (network and the remote host):

  connect+auth (at most MAX_PARALLEL_CONNECTS at a time) -> first channel -> agent boot and
  hello -> [every host] -> launch request -> [every host] -> start request -> [every host]

with the waits dtrain has between its requests. Per-step CPU and latency come from the
in-process calibration (bench/calibrate.py); whatever launcher CPU per host and per task the
end-to-end runs show beyond that (events, heartbeats, threads) is charged to the start step.
Fits are plain least squares on the measured runs.
"""

from __future__ import annotations

import heapq
import math
import statistics
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, replace
from typing import Any

DTRAIN_POOL_WIDTH = 32  # dtrain/transport/ssh.py MAX_PARALLEL_CONNECTS


@dataclass(frozen=True)
class Step:
    """Launcher CPU first (queued on the one launcher CPU), then time spent elsewhere."""

    cpu_s: float
    latency_s: float


@dataclass(frozen=True)
class Costs:
    fixed_s: float  # interpreter, imports, planning: once per launch
    connect: Step
    channel: Step
    agent: Step
    launch: Step
    start: Step  # per host; CPU per task is added, and latency is per task spawned
    task_cpu_s: float
    task_start_s: float  # from the start request to the task's first statement


def fit(points: Sequence[tuple[Sequence[float], float]], features: int = 2) -> list[float]:
    """Least squares y = b0 + b1*x1 + ... (normal equations; a handful of variables).

    All zeros when the points cannot determine the coefficients (too few distinct sizes).
    """
    if len(points) <= features:
        return [0.0] * (features + 1)
    rows = [[1.0, *xs] for xs, _ in points]
    ys = [y for _, y in points]
    n = len(rows[0])
    a = [[sum(r[i] * r[j] for r in rows) for j in range(n)] for i in range(n)]
    b = [sum(r[i] * y for r, y in zip(rows, ys, strict=True)) for i in range(n)]
    for col in range(n):  # Gauss-Jordan with partial pivoting
        pivot = max(range(col, n), key=lambda r: abs(a[r][col]))
        a[col], a[pivot] = a[pivot], a[col]
        b[col], b[pivot] = b[pivot], b[col]
        if abs(a[col][col]) < 1e-12:
            return [0.0] * n
        for r in range(n):
            if r != col:
                factor = a[r][col] / a[col][col]
                a[r] = [x - factor * y for x, y in zip(a[r], a[col], strict=True)]
                b[r] -= factor * b[col]
    return [b[i] / a[i][i] for i in range(n)]


def simulate(hosts: int, per_host: int, costs: Costs, width: int = DTRAIN_POOL_WIDTH) -> float:
    """Seconds from `dtrain launch` to the last task running, for `hosts` separate machines."""
    cpu_free = 0.0

    def serve(ready: float, step: Step) -> float:
        nonlocal cpu_free
        begin = max(ready, cpu_free)
        cpu_free = begin + step.cpu_s
        return cpu_free + step.latency_s

    # Connect: a pool of `width` slots; each slot connects its host, opens the agent's channel
    # and sends the agent, then frees; the agent boots on its host while the pool goes on.
    slots = [costs.fixed_s] * min(width, hosts)
    heapq.heapify(slots)
    booted = []
    for _ in range(hosts):
        ready = heapq.heappop(slots)
        opened = serve(serve(ready, costs.connect), costs.channel)
        heapq.heappush(slots, opened)
        booted.append(serve(opened, costs.agent))
    barrier = max(booted)  # the hello waits for every host's agent
    barrier = max(serve(barrier, costs.launch) for _ in range(hosts))
    start = Step(costs.start.cpu_s + per_host * costs.task_cpu_s, costs.start.latency_s * per_host)
    barrier = max(serve(barrier, start) for _ in range(hosts))
    return barrier + costs.task_start_s


def calibrate(records: Sequence[Mapping[str, Any]], bashrc: str) -> dict[str, Any] | None:
    """Costs and fits from one bashrc mode's records; None if they are missing."""
    calibration = next(
        (r for r in records if r["scenario"] == "calibration" and r["bashrc"] == bashrc), None
    )
    timeline = next(
        (r for r in records if r["scenario"] == "timeline" and r["bashrc"] == bashrc), None
    )
    trivial = [
        r for r in records
        if r["scenario"] == "trivial" and r["bashrc"] == bashrc and r.get("ok")
    ]  # fmt: skip
    if calibration is None or not trivial:
        return None

    def points(launcher: str, key: str) -> list[tuple[list[float], float]]:
        """One point per size, its median: sizes run more often weigh no more in the fit."""
        by_size: dict[tuple[float, float], list[float]] = {}
        for r in trivial:
            if r["launcher"] == launcher and r.get(key) is not None:
                size = (float(r["hosts"]), float(r["tasks"]))
                by_size.setdefault(size, []).append(float(r[key]))
        return [([h, t], statistics.median(v)) for (h, t), v in sorted(by_size.items())]

    cpu_fits = {name: fit(points(name, "cpu_s")) for name in ("dtrain", "pdsh", "ssh", "tracker")}
    _, host_cpu, task_cpu = cpu_fits["dtrain"]
    rss_fit = fit(points("dtrain", "rss_mb"))
    footprints = [
        r for r in records
        if r["scenario"] in ("sigint", "sigkill") and r.get("group") == "alone"
        and r.get("footprint") and r.get("launcher") == "dtrain"
    ]  # fmt: skip
    fd_fit = fit([([r["hosts"], r["tasks"]], r["footprint"]["fds"]) for r in footprints])
    thread_fit = fit([([r["hosts"], r["tasks"]], r["footprint"]["threads"]) for r in footprints])

    def step(name: str) -> Step:
        cpu = calibration[f"{name}_cpu_s"]
        return Step(cpu, max(0.0, calibration[f"{name}_s"] - cpu))

    connect, channel, agent = step("connect"), step("channel"), step("agent")
    phases = {e["phase"]: e["end_s"] - e["start_s"] for e in (timeline or {}).get("phases", [])}
    request_s = phases.get("request 'launch' on all hosts", 0.005)
    start_s = phases.get("request 'start' on all hosts", 0.05)
    start_end = max(
        (e["end_s"] for e in (timeline or {}).get("phases", []) if "'start'" in e["phase"]),
        default=None,
    )
    task_start = 0.03
    if timeline and start_end is not None and timeline.get("launch_s") is not None:
        task_start = max(0.0, timeline["launch_s"] - timeline["python_started_s"] - start_end)
    known = connect.cpu_s + channel.cpu_s + agent.cpu_s
    rest = max(0.0, host_cpu - known)
    headline_k = max(r["per_host"] for r in trivial)
    costs = Costs(
        fixed_s=0.0,
        connect=connect,
        channel=channel,
        agent=agent,
        launch=Step(0.0, request_s),
        start=Step(rest, max(0.0, start_s / max(1, headline_k))),
        task_cpu_s=max(0.0, task_cpu),
        task_start_s=task_start,
    )
    measured: dict[str, float] = {}
    by_config: dict[tuple[int, int], list[float]] = {}
    for r in trivial:
        if r["launcher"] == "dtrain" and r.get("launch_s") is not None:
            by_config.setdefault((r["hosts"], r["per_host"]), []).append(r["launch_s"])
    for (h, k), values in sorted(by_config.items()):
        measured[f"{h}x{k}"] = statistics.median(values)
    # The fixed part (interpreter, imports, planning) is what one host's launch measured here
    # beyond its per-host pipeline: with one host nothing is shared, so this machine is fair.
    smallest = min(by_config, default=None)
    if smallest is not None:
        h, k = smallest
        pipeline = simulate(h, k, costs)
        costs = replace(costs, fixed_s=max(0.0, measured[f"{h}x{k}"] - pipeline))
    return {
        "costs": costs,
        "cpu_fits": cpu_fits,
        "rss_fit": rss_fit,
        "fd_fit": fd_fit,
        "thread_fit": thread_fit,
        "measured": measured,
        "calibration": calibration,
    }


def predict(fits: Sequence[float], hosts: int, tasks: int) -> float:
    return fits[0] + fits[1] * hosts + fits[2] * tasks


def waves(hosts: int, width: int = DTRAIN_POOL_WIDTH) -> int:
    return math.ceil(hosts / width)
