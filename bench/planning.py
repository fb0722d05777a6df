"""How long planning takes as jobs grow: `python -m bench.planning [SIZE ...]`.

Plans are pure, so this needs no cluster and no root: it builds each request and the facts a
launch would have looked up (addresses, free ports), then times `tracker.plan_job` alone and
with the `--dry-run` text. Jobs use 1000 hosts with 100 slots each, or this machine alone
(`dmlc-local`, as `dtrain launch --dry-run -n N -s N` plans it).

TensorFlow jobs carry every task's address in every task's `TF_CONFIG`, so their plan grows
with the square of the task count whatever the planner does; they stop at 2000 tasks here.
"""

from __future__ import annotations

import argparse
import time
from collections.abc import Callable, Sequence

from dtrain import render
from dtrain.errors import UsageError
from dtrain.plan import planner
from dtrain.plan.hosts import Host, local_host
from dtrain.plan.spec import Framework

SIZES = (1000, 10000, 100000)
HOSTS = 1000
SLOTS = 100
MAX_TF_TASKS = 2000


def _facts(hosts: Sequence[Host], ports: int) -> planner.Facts:
    return planner.Facts(
        job_id="20261123-000000-bench",
        hosts={
            host.name: planner.HostFacts(
                address=f"198.18.{i // 250}.{i % 250}.{1 if host.is_local else 2}",
                interfaces={"eth0": f"198.18.{i // 250}.{i % 250}.{1 if host.is_local else 2}"},
                free_ports=tuple(range(20000, 20000 + ports)),
            )
            for i, host in enumerate(hosts)
        },
    )


def request(kind: str, tasks: int) -> tuple[planner.JobRequest, planner.Facts]:
    """A job of about `tasks` tasks of one kind, and the facts a launch would have found."""
    here = local_host("launcher")
    hosts = tuple(Host(name=f"node{i}", slots=SLOTS) for i in range(HOSTS))
    command = ("python3", "train.py")
    if kind == "dmlc-local":
        half = tasks // 2
        req = planner.JobRequest(command, here, num_workers=half, num_servers=half)
        return req, _facts((here,), 1)
    framework = Framework.parse(kind.split("-")[0])
    servers = tasks // 10 if kind in ("dmlc", "tf", "paddle-ps") else None
    workers = tasks - (servers or 0)
    req = planner.JobRequest(
        command if framework is not Framework.TF else (*command, "--ps_hosts={ps_hosts}"),
        here,
        framework=framework,
        num_workers=workers,
        num_servers=servers,
        hosts=hosts,
        host_ip="198.18.9.1",
    )
    return req, _facts((here, *hosts), SLOTS + 1)


def timed(action: Callable[[], object]) -> float:
    started = time.perf_counter()
    action()
    return time.perf_counter() - started


def measure(kind: str, tasks: int) -> tuple[float, float]:
    """Seconds to plan, and to plan and render the dry run's text."""
    req, facts = request(kind, tasks)
    plan_s = timed(lambda: planner.plan_job(req, facts))
    text_s = timed(lambda: render.plan_text(planner.plan_job(req, facts)))
    return plan_s, text_s


KINDS = ("dmlc-local", "dmlc", "torch", "paddle", "paddle-ps", "tf")


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.planning", description=__doc__)
    parser.add_argument("sizes", nargs="*", type=int, default=list(SIZES))
    parser.add_argument("--kind", action="append", choices=KINDS, help="default: all")
    args = parser.parse_args(argv)
    print(f"{'job':<12}{'tasks':>8}{'plan s':>10}{'+ dry-run text s':>18}")
    for kind in args.kind or KINDS:
        for size in args.sizes:
            if kind == "tf" and size > MAX_TF_TASKS:
                continue
            try:
                plan_s, text_s = measure(kind, size)
            except UsageError as exc:  # e.g. an environment Linux would refuse to start
                print(f"{kind:<12}{size:>8}  refused: {exc.what}", flush=True)
                continue
            print(f"{kind:<12}{size:>8}{plan_s:>10.2f}{text_s:>18.2f}", flush=True)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
