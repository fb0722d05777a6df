"""`python -m bench`: dtrain against the peers people use instead, on real clusters, one run.

Brings up the suite's namespaced sshd cluster (tests/cluster/netcluster.py) itself and runs
every launcher on the same hosts in the same run, interleaved (the order rotates with each
repetition): launch, teardown, orphans and log relay against pdsh and one ssh per task, a
restarted job against relaunching it; then each engine on its own real cluster against that
engine by hand (bench/engines.py: srun, mpirun, qrsh -inherit, podman), and `dtrain stacks`
against py-spy by hand. Writes docs/benchmarks.md (tables of medians and ratios) and its plot
from that one run. With `--before TREE`, a second dtrain tree runs beside this one as
"dtrain (before)", so a change is judged against what it changed, in the same minutes.

The cluster is held in short sessions (one per group of measurements) and released in
between, so other users of the machine-wide cluster lock are not starved.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # tests.cluster.netcluster lives in the repo, not the package

from bench import engines, launchers, report, restart, scenarios, stacks  # noqa: E402
from bench.launchers import BEFORE  # noqa: E402

LOCK_BREATHER_S = 1.0  # between cluster sessions: lets a waiting user of the lock in
Shape = tuple[int, int]  # (hosts, tasks per host)


@dataclass(frozen=True)
class Settings:
    """What one run measures; `--quick` and the full run differ only in these numbers."""

    launch: tuple[tuple[Shape, int], ...] = (((1, 1), 20), ((8, 4), 12), ((48, 4), 6))
    teardown: tuple[Shape, ...] = ((8, 4), (48, 4))  # dtrain; the peers at the first only
    teardown_reps: int = 3
    teardown_bound_s: float = 5.0
    signals: Shape = (48, 4)
    window_s: float = 5.0
    log: tuple[Shape, ...] = ((1, 1), (8, 4))
    log_reps: int = 6
    log_mb_per_host: float = 40.0  # split over the host's tasks
    restart: tuple[tuple[int, int], ...] = ((1, 6), (8, 4), (48, 2))  # (hosts, reps)
    slurm: Shape = (4, 4)
    mpi: Shape = (4, 2)
    sge: Shape = (3, 2)
    engine_reps: int = 4
    engine_cap_s: float = 10.0  # a peer that never stops the rest after a failure
    containers_hosts: int = 2
    containers_reps: int = 6
    stacks: tuple[tuple[int, int], ...] = ((1, 8), (8, 32))  # (hosts, tasks)
    stacks_reps: int = 2

    @property
    def max_hosts(self) -> int:
        shapes = [s for s, _ in self.launch] + [*self.teardown, self.signals, *self.log]
        return max([h for h, _ in shapes] + [h for h, _ in self.restart])


QUICK = Settings(
    launch=(((1, 1), 1), ((4, 2), 1)),
    teardown=((4, 2),),
    teardown_reps=1,
    signals=(4, 2),
    log=((1, 1),),
    log_reps=1,
    log_mb_per_host=8.0,
    restart=((2, 1),),
    slurm=(2, 2),
    mpi=(2, 1),
    sge=(2, 1),
    engine_reps=1,
    containers_reps=1,
    stacks=((1, 1),),
    stacks_reps=1,
)


class Results:
    """Records appended to records.jsonl as they come, so a crash keeps what was measured."""

    def __init__(self, folder: Path) -> None:
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "records.jsonl"
        self.path.write_text("")

    def add(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as out:
            out.write(json.dumps(record) + "\n")
        shown = {k: round(v, 3) if isinstance(v, float) else v for k, v in record.items()}
        say(" ".join(f"{k}={v}" for k, v in shown.items() if k not in ("stderr_tail", "rep")))


def say(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


@contextlib.contextmanager
def cluster_session(n_hosts: int, scratch: Path, before: Path | None) -> Iterator[Any]:
    """A fresh cluster with every remote ~/.bashrc blanked; always torn down."""
    from tests.cluster.netcluster import Cluster, assert_routes_to_bridge

    cluster = Cluster(n_hosts)
    cluster.start()  # waits (bounded) for the machine-wide cluster lock
    started = time.monotonic()
    try:
        assert_routes_to_bridge(cluster)
        for host in cluster.hosts:
            cluster.blank_bashrc(host)
        folder = Path(tempfile.mkdtemp(prefix="s-", dir=scratch))
        setup = launchers.Setup(ssh_config=cluster.ssh_config, scratch=folder, before=before)
        hosts = tuple(h.name for h in cluster.hosts)
        say(f"cluster {cluster.prefix} up ({len(hosts)} hosts)")
        yield cluster, scenarios.Context(cluster=cluster, setup=setup, hosts=hosts)
    finally:
        cluster.stop()
        say(f"cluster down after {time.monotonic() - started:.0f}s")
        time.sleep(LOCK_BREATHER_S)


def ours(ctx: scenarios.Context) -> list[str]:
    return ["dtrain", BEFORE] if ctx.setup.before is not None else ["dtrain"]


def phase_launch(ctx: scenarios.Context, settings: Settings, results: Results) -> None:
    """The trivial job (every task exits 0 at once), every launcher, interleaved."""
    names = [*ours(ctx), "pdsh", "ssh"]
    for rep in range(max(reps for _, reps in settings.launch)):
        for (hosts, per_host), reps in settings.launch:
            if rep < reps:
                for name in scenarios.rotated(names, rep + hosts):
                    results.add(scenarios.job(ctx, name, hosts, per_host, "trivial", rep))


def phase_teardown(ctx: scenarios.Context, settings: Settings, results: Results) -> None:
    """dtrain's teardown after one failure, repeated; the peers once (they never tear down)."""
    bound = settings.teardown_bound_s
    for rep in range(settings.teardown_reps):
        for hosts, per_host in settings.teardown:
            for name in scenarios.rotated(ours(ctx), rep):
                run = scenarios.Run(ctx, name, hosts, per_host, "teardown", rep)
                results.add(scenarios.teardown(run, bound))
    hosts, per_host = settings.teardown[0]
    for name in ("pdsh", "ssh"):
        results.add(
            scenarios.teardown(scenarios.Run(ctx, name, hosts, per_host, "teardown", 0), bound)
        )


def phase_signals(ctx: scenarios.Context, settings: Settings, results: Results) -> None:
    """Orphans after SIGINT and SIGKILL, each launcher alone on the hosts."""
    hosts, per_host = settings.signals
    for signum, scenario in ((signal.SIGINT, "sigint"), (signal.SIGKILL, "sigkill")):
        for name in [*ours(ctx), "pdsh", "ssh"]:
            run = scenarios.Run(ctx, name, hosts, per_host, scenario, 0)
            results.add(scenarios.interrupt(run, signum, settings.window_s))


def phase_log(ctx: scenarios.Context, settings: Settings, results: Results) -> None:
    """Each host's tasks write log_mb_per_host MB of 100-byte lines between them; the
    launcher's stdout is a file. Against raw `ssh host cmd >file`, one per task."""
    for rep in range(settings.log_reps):
        for hosts, per_host in settings.log:
            megabytes = settings.log_mb_per_host / per_host
            for name in scenarios.rotated([*ours(ctx), "ssh"], rep + hosts):
                results.add(scenarios.job(ctx, name, hosts, per_host, "log", rep, megabytes))


def phase_restart(ctx: scenarios.Context, settings: Settings, results: Results) -> None:
    """A restarted job against relaunching it by hand (bench/restart.py)."""
    for n_hosts, reps in settings.restart:
        for record in restart.measure(ctx, n_hosts, reps):
            results.add(record)


PHASES: dict[str, Callable[[scenarios.Context, Settings, Results], None]] = {
    "launch": phase_launch,
    "teardown": phase_teardown,
    "signals": phase_signals,
    "log": phase_log,
    "restart": phase_restart,
}
SESSIONS = (("launch",), ("teardown", "signals"), ("log",), ("restart",))
# Each engine builds its own cluster (bench/engines.py).
ENGINES: dict[str, Callable[[Settings], list[dict[str, Any]]]] = {
    "slurm": lambda s: engines.slurm(s.slurm, s.engine_reps, s.engine_cap_s),
    "mpi": lambda s: engines.mpi(s.mpi, s.engine_reps, s.engine_cap_s),
    "sge": lambda s: engines.sge(s.sge, s.engine_reps, s.engine_cap_s),
    "containers": lambda s: engines.containers(s.containers_hosts, s.containers_reps),
}


def phase_stacks(settings: Settings, results: Results, scratch: Path) -> None:
    """`dtrain stacks` against py-spy by hand over ssh (bench/stacks.py)."""
    with cluster_session(max(h for h, _ in settings.stacks), scratch, None) as (cluster, _):
        for row in stacks.measure(cluster, scratch, settings.stacks_reps, settings.stacks):
            results.add({"scenario": "stacks", "reps": settings.stacks_reps, **row})


def versions() -> dict[str, str]:
    """What the report's header names."""

    def first_line(*argv: str) -> str:
        out = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
        return (out.stdout + out.stderr).strip().splitlines()[0]

    commit = first_line("git", "-C", str(REPO), "describe", "--always", "--dirty")
    return {"commit": commit, "openssh": first_line("ssh", "-V"), "pdsh": first_line("pdsh", "-V"),
            "python": sys.version.split()[0]}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench", description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="a smoke run of a few minutes")
    parser.add_argument("--before", type=Path, help="another dtrain tree, run as 'dtrain (before)'")
    every = [*PHASES, *ENGINES, "stacks"]
    parser.add_argument("--phases", default=",".join(every), help=f"of {','.join(every)}")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument("--report", type=Path, metavar="RESULTS_DIR", help="only rewrite the doc")
    args = parser.parse_args(argv)
    if args.report is not None:
        report.write(args.report, args.doc)
        return 0
    if shutil.which("pdsh") is None:
        parser.error("pdsh is not installed: apt-get install -y pdsh")
    if args.before is not None and not (args.before / "dtrain" / "__init__.py").is_file():
        parser.error(f"--before {args.before}: no dtrain/ package there (a tree of this repo)")
    for tree in (REPO, args.before):
        if tree is not None:
            launchers.compile_dtrain(tree)  # as installing does: no run compiles at start-up
    signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(128 + signum))  # unwind
    settings = QUICK if args.quick else Settings()
    wanted = args.phases.split(",")
    folder = REPO / "bench" / "results" / time.strftime("%Y%m%d-%H%M%S")
    results = Results(folder)
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="dtrain-bench-"))
    try:
        for session in SESSIONS:
            if todo := [name for name in session if name in wanted]:
                with cluster_session(settings.max_hosts, scratch, args.before) as (_, ctx):
                    for name in todo:
                        PHASES[name](ctx, settings, results)
        for name in (name for name in ENGINES if name in wanted):
            for record in ENGINES[name](settings):
                results.add(record)
        if "stacks" in wanted:
            phase_stacks(settings, results, scratch)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        meta = {
            "settings": asdict(settings),
            "argv": sys.argv[1:] if argv is None else list(argv),
            "runtime_s": round(time.monotonic() - started),
            "versions": versions(),
            "before": str(args.before) if args.before else None,
        }
        (folder / "meta.json").write_text(json.dumps(meta, indent=1))
    say(f"done in {meta['runtime_s']} s; records in {folder}")
    report.write(folder, args.doc)
    say(f"wrote {args.doc}")
    return 0
