"""`python -m bench.ab --base DIR [--base DIR ...]`: this checkout against others, and pdsh.

Measures one change on its own: the same trivial (or log) job under dtrain from this checkout,
dtrain from DIR (e.g. `git archive main | tar -x -C DIR`) and pdsh, interleaved on the same
namespaced sshd hosts (tests/cluster/netcluster.py, needs root), and prints medians. Only the
ratios between columns mean anything on a shared machine.
"""

from __future__ import annotations

import argparse
import statistics
import sys
import tempfile
from collections.abc import Callable, Sequence
from dataclasses import replace
from pathlib import Path
from typing import Any

from bench import launchers, run, scenarios

Builder = Callable[[launchers.Job, launchers.Setup], launchers.Command]
FIELDS = ("launch_s", "e2e_s", "cpu_s", "remote_cpu_s", "rss_mb", "mb_per_s")


def with_pythonpath(folder: Path) -> Builder:
    """dtrain's launch command, importing dtrain from `folder`: `python -m dtrain`, which every
    checkout has (the console script names the entry point of the installed one)."""

    def build(job: launchers.Job, setup: launchers.Setup) -> launchers.Command:
        command = launchers.dtrain(job, setup)
        argv = (sys.executable, "-m", "dtrain", *command.argv[1:])
        return launchers.Command(argv, {**command.env, "PYTHONPATH": str(folder)})

    return build


def summary(records: Sequence[dict[str, Any]]) -> dict[str, float]:
    """Median of each field over the runs that went well."""
    good = [r for r in records if r.get("ok")]
    for r in good:
        if r.get("scenario") == "log" and r.get("e2e_s"):
            r["mb_per_s"] = r["bytes_out"] / r["e2e_s"] / 1e6
    return {f: statistics.median(r[f] for r in good if r.get(f) is not None)
            for f in FIELDS if any(r.get(f) is not None for r in good)}  # fmt: skip


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="python -m bench.ab", description=__doc__)
    parser.add_argument(
        "--base", type=Path, action="append", required=True, help="another checkout (repeatable)"
    )
    parser.add_argument("--hosts", type=run.parse_ints, default=(8,))
    parser.add_argument("--per-host", type=run.parse_ints, default=(4,))
    parser.add_argument("--reps", type=int, default=6)
    parser.add_argument("--scenario", choices=("trivial", "log"), default="trivial")
    parser.add_argument("--log-mb", type=float, default=40.0, help="MB per host (log)")
    parser.add_argument("--bashrc", default="blank", help="as-is or blank")
    parser.add_argument("--peers", default="pdsh", help="comma list of pdsh,ssh,pyfloor (or none)")
    args = parser.parse_args(argv)
    run.unwind_on_sigterm()
    builders: dict[str, Builder] = launchers.BUILDERS  # type: ignore[assignment]
    builders["dtrain"] = with_pythonpath(run.REPO)
    names = ["dtrain"]
    launchers.compile_dtrain(run.REPO)
    for folder in args.base:
        names.append(f"dtrain-{folder.name}")
        builders[names[-1]] = with_pythonpath(folder.resolve())
        launchers.compile_dtrain(folder.resolve())
    names += [p for p in args.peers.split(",") if p in ("pdsh", "ssh", launchers.FLOOR)]
    if args.scenario == "log":
        names = [n for n in names if n not in ("pdsh", launchers.FLOOR)]
    settings = replace(run.Settings(), host_counts=(max(args.hosts),))
    records: dict[tuple[int, int, str], list[dict[str, Any]]] = {}
    # every log run leaves its launchers' output here: gigabytes, gone when the run ends
    with (
        tempfile.TemporaryDirectory(prefix="dtrain-ab-") as scratch,
        run.cluster_session(settings, args.bashrc, Path(scratch)) as ctx,
    ):
        for rep in range(args.reps):
            for hosts in args.hosts:
                for per_host in args.per_host:
                    for name in scenarios.rotated(names, rep):
                        mb = args.log_mb / per_host if args.scenario == "log" else 0.0
                        record = scenarios.job(ctx, name, hosts, per_host, args.scenario, rep,
                                               megabytes=mb)  # fmt: skip
                        records.setdefault((hosts, per_host, name), []).append(record)
                        if not record.get("ok"):
                            run.say(run.describe(record))
    for (hosts, per_host, name), found in sorted(records.items()):
        medians = summary(found)
        text = "  ".join(f"{k}={v:.3f}" for k, v in medians.items())
        print(f"{hosts}x{per_host} {args.bashrc} {name:12} n={len(found)} {text}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
