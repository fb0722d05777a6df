"""docs/benchmarks.md from one run's records: tables of medians and ratios, no prose.

Ratios between two launchers are the median of their run-by-run ratios (the runs sharing a
repetition number ran back to back), with the sign test's 95% interval where there are enough
runs (bench/stats.py).
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable, Sequence
from pathlib import Path
from typing import Any

from bench import stacks, stats
from bench.launchers import BEFORE, LABELS

Record = dict[str, Any]
Shape = tuple[int, int]


def shape_of(record: Record) -> Shape:
    return record.get("hosts", 0), record.get("per_host", 0)


HEADER = """# Benchmarks: dtrain against what people launch with instead

Made by one run of `sudo .venv/bin/python -m bench {argv}` ({minutes:.0f} min, commit
{commit}) on a shared 2-core machine: the suite's namespaced hosts (tests/cluster/: sshd on
each, every remote `~/.bashrc` blanked; Slurm, Grid Engine, Open MPI and podman each on a
cluster of its own), every launcher starting the same tiny task (`bench/task.py`) on the same
hosts in the same minutes, interleaved, the order rotating with each repetition. Absolute
times are this machine's; the ratios are what to read. "dtrain (before)" is the tree given by
`--before`, run beside this one. Python {python},
{openssh}, {pdsh}. Rerun: `sudo .venv/bin/python -m bench [--before TREE] [--quick]`;
rewrite this page from a run's records: `python -m bench --report bench/results/<stamp>`.
"""
LAUNCH = """## Launch: from the launcher's start to every task running

The trivial job (every task writes its start time, then exits 0). Medians; the ratio is run
by run, with its 95% interval where there are 6 runs or more."""
LOG = """## Log relay throughput against raw ssh

Each host's tasks write {megabytes:g} MB of 100-byte lines to stdout between them; the
launcher's stdout is a file. MB/s counts the bytes written from the first task's start to the
launcher's exit. Raw ssh is `ssh host cmd >file`, one per task."""


def load(folder: Path) -> tuple[list[Record], dict[str, Any]]:
    lines = (folder / "records.jsonl").read_text().splitlines()
    meta = json.loads((folder / "meta.json").read_text())
    return [json.loads(line) for line in lines if line], meta


def rows_of(records: Iterable[Record], scenario: str, shape: Shape) -> list[Record]:
    return [r for r in records if r.get("scenario") == scenario and shape_of(r) == shape]


def pick(records: Iterable[Record], scenario: str, shape: Shape, launcher: str) -> list[Record]:
    return [r for r in rows_of(records, scenario, shape) if r.get("launcher") == launcher]


def median(records: Iterable[Record], key: str) -> float | None:
    values = [r[key] for r in records if isinstance(r.get(key), (int, float))]
    return statistics.median(values) if values else None


def ratio(records: Sequence[Record], top: str, bottom: str, key: str) -> tuple[float, str] | None:
    """The median of `top` ÷ `bottom` run by run, and how it reads with its interval."""
    values = stats.paired_ratios(records, top, bottom, key)
    if not values:
        return None
    middle = statistics.median(values)
    interval = stats.median_interval(values)
    shown = f"x{middle:.2f}"
    if interval is not None:
        shown += f" (x{interval[0]:.2f}-x{interval[1]:.2f})"
    return middle, shown


def secs(value: float | None) -> str:
    if value is None:
        return "-"
    return f"{value * 1000:.0f} ms" if value < 1 else f"{value:.2f} s"


def launchers_in(records: Iterable[Record]) -> list[str]:
    found = {r.get("launcher") for r in records}
    return [name for name in ("dtrain", BEFORE, "pdsh", "ssh") if name in found]


def shapes(records: Iterable[Record], scenario: str) -> list[Shape]:
    found = {shape_of(r) for r in records if r.get("scenario") == scenario}
    return sorted(found)


def ratio_table(records: Sequence[Record], scenario: str, key: str, peer: str) -> list[str]:
    """Medians of `key` for every launcher, by shape, and dtrain's (both trees') ratio to `peer`."""
    names = launchers_in(r for r in records if r.get("scenario") == scenario)
    ours = [n for n in names if n in ("dtrain", BEFORE)]
    lines = [
        "| hosts x tasks | runs | " + " | ".join(LABELS[n] for n in names) + " | "
        + " | ".join(f"{LABELS[n]} ÷ {LABELS[peer]}" for n in ours) + " |",
        "|---" * (2 + len(names) + len(ours)) + "|",
    ]  # fmt: skip
    for shape in shapes(records, scenario):
        rows = rows_of(records, scenario, shape)
        cells = []
        for name in names:
            value = median(pick(rows, scenario, shape, name), key)
            cells.append(f"{value:.0f} MB/s" if value and key == "mb_per_s" else secs(value))
        for name in ours:
            found = ratio(rows, name, peer, key)
            cells.append(found[1] if found else "-")
        failed = sum(1 for r in rows if not r["ok"])
        runs = f"{len(pick(rows, scenario, shape, 'dtrain'))}" + (
            f" ({failed} failed)" * bool(failed)
        )
        lines.append(f"| {shape[0]}x{shape[1]} | {runs} | " + " | ".join(cells) + " |")
    return lines


def teardown_table(records: Sequence[Record]) -> list[str]:
    lines = [
        "## Teardown after a failure",
        "",
        "The first task to start waits until all have, then exits 7; the others sleep. Time "
        "from that exit until every other task is gone (psutil, polled every 10 ms), for up to "
        "5 s; the launcher's exit code (for a launcher that never stops the rest, the one it "
        "gives once the harness has made them exit 0).",
        "",
        "| hosts x tasks | launcher | runs | median | slowest | exit codes |",
        "|---|---|---|---|---|---|",
    ]
    for shape in shapes(records, "teardown"):
        for name in launchers_in(r for r in records if r.get("scenario") == "teardown"):
            mine = pick(records, "teardown", shape, name)
            if not mine:
                continue
            times = [r.get("teardown_s") for r in mine]
            slowest = "never (> 5 s)" if None in times else secs(max(t for t in times if t))
            codes = ", ".join(sorted({str(r.get("exit_code")) for r in mine}))
            lines.append(
                f"| {shape[0]}x{shape[1]} | {LABELS[name]} | {len(mine)} | "
                f"{secs(median(mine, 'teardown_s')) if None not in times else 'never'} | "
                f"{slowest} | {codes} |"
            )
    return lines


def exit_text(record: Record) -> str:
    if record.get("exit_after_harness_stop"):
        return f"kept running (then {record.get('exit_code')})"
    code = record.get("exit_code")
    return f"killed (signal {-code})" if isinstance(code, int) and code < 0 else str(code)


def signal_table(records: Sequence[Record]) -> list[str]:
    found = shapes(records, "sigint")
    if not found:
        return []
    hosts, per_host = found[0]
    lines = [
        f"## Orphans: {hosts}x{per_host} tasks, the launcher interrupted",
        "",
        "Every task sleeps silently; SIGINT goes to the launcher's process group (a terminal's "
        "Ctrl-C), SIGKILL to the launcher alone. Counted once nothing is left, or 5 s after the "
        "signal: the tasks still alive, and every process left below the hosts' sshd listeners "
        "(agents, shells, sshd sessions, tasks).",
        "",
        "| launcher | SIGINT: tasks alive | processes left | exit | gone after "
        "| SIGKILL: tasks alive | processes left | exit | gone after |",
        "|---|---|---|---|---|---|---|---|---|",
    ]
    for name in launchers_in(r for r in records if r.get("scenario") == "sigint"):
        cells = []
        for scenario in ("sigint", "sigkill"):
            for r in pick(records, scenario, (hosts, per_host), name)[:1]:
                gone = r.get("gone_s")
                alive = f"{r.get('tasks_left')}/{r['tasks']}"
                after = "never (> 5 s)" if gone is None else secs(gone)
                cells += [alive, str(r.get("left_on_hosts")), exit_text(r), after]
        lines.append(f"| {LABELS[name]} | " + " | ".join(cells) + " |")
    return lines


def shape_ratios(records: Sequence[Record], scenario: str, name: str, peer: str, key: str,
                 bound: Callable[[Shape], float], above: bool) -> tuple[str, bool]:  # fmt: skip
    """Each shape's ratio of `name` to `peer` against its bound: the cell, and whether all held."""
    parts, held = [], True
    for shape in shapes(records, scenario):
        found = ratio(rows_of(records, scenario, shape), name, peer, key)
        if found is None:
            parts.append(f"{shape[0]}x{shape[1]} -")
            held = False
            continue
        ok = found[0] >= bound(shape) if above else found[0] <= bound(shape)
        held = held and ok
        parts.append(f"{shape[0]}x{shape[1]} x{found[0]:.2f}" + ("" if ok else " (missed)"))
    return ", ".join(parts), held


def kept_clean(records: Sequence[Record], name: str) -> tuple[str, bool]:
    """Teardown within the bound with exit 7 every time; nothing left after either signal."""
    down = [r for r in records if r.get("scenario") == "teardown" and r["launcher"] == name]
    times = [r.get("teardown_s") for r in down]
    codes = sorted({str(r.get("exit_code")) for r in down})
    held = bool(down) and None not in times and codes == ["7"]
    slowest = secs(max((t or 0.0) for t in times)) if down else "-"
    text = f"teardown {len(down)} runs, slowest {slowest}, exit {'/'.join(codes)}"
    for scenario, code in (("sigint", 130), ("sigkill", -9)):
        for r in (r for r in records if r.get("scenario") == scenario and r["launcher"] == name):
            clean = r.get("tasks_left") == 0 and r.get("left_on_hosts") == 0
            held = held and clean and r.get("exit_code") == code
            text += f"; {scenario.upper()} at {r['hosts']}x{r['per_host']}: "
            text += f"{r.get('tasks_left')} tasks and {r.get('left_on_hosts')} processes left, "
            text += exit_text(r)
    return text, held


RAILS = (
    "launch ÷ pdsh: ≤ x1.00 from 8 hosts, ≤ x1.50 below",
    "log relay ÷ raw ssh: ≥ x0.50 at every shape",
    "teardown after a failure (exit 7); 0 left after SIGINT (exit 130) and SIGKILL",
)


def guard_rails(records: Sequence[Record]) -> list[str]:
    names = [n for n in ("dtrain", BEFORE) if any(r.get("launcher") == n for r in records)]
    lines = [
        "## Guard rails",
        "",
        "| rail | " + " | ".join(LABELS[n] for n in names) + " |",
        "|---" * (1 + len(names)) + "|",
    ]

    def judged(name: str) -> list[tuple[str, bool]]:
        return [
            shape_ratios(records, "trivial", name, "pdsh", "launch_s",
                         lambda shape: 1.0 if shape[0] >= 8 else 1.5, above=False),
            shape_ratios(records, "log", name, "ssh", "mb_per_s", lambda shape: 0.5, above=True),
            kept_clean(records, name),
        ]  # fmt: skip

    verdicts = {name: judged(name) for name in names}
    for i, title in enumerate(RAILS):
        found = (verdicts[name][i] for name in names)
        cells = [f"{'held' if held else '**missed**'}: {text}" for text, held in found]
        lines.append(f"| {title} | " + " | ".join(cells) + " |")
    return lines


ENGINES = {  # scenario: its section's title, and each dtrain way with its counterpart
    "slurm": ("Slurm: inside one allocation, against srun", [("dtrain", "srun")]),
    "mpi": ("MPI: `--launcher mpi` against Open MPI's mpirun",
            [("dtrain --launcher mpi", "mpirun")]),
    "sge": ("Grid Engine: inside one PE job, against `qrsh -inherit` per slot by hand",
            [("dtrain", "qrsh -inherit")]),
    "containers": ("Containers: podman, against the same runtime by hand over ssh",
                   [("dtrain --image", "ssh podman run"),
                    ("dtrain --container", "ssh podman exec")]),
}  # fmt: skip
ENGINE_NOTE = (
    "## Engines and containers against the same by hand\n\n"
    "Each on its own real cluster (bench/engines.py), the ways interleaved. Last task started "
    "and whole command: the job whose tasks stamp their start and exit (with containers, "
    "`python3 -S -c pass`, to the command's exit and, for `run`, its container gone). After a "
    "failure: one task exits 7 once all have started, the others sleep; from that exit to the "
    "command's (capped at {cap:g} s: never, exit none), its exit code and the tasks still "
    "alive then."
)


def engine_section(records: Sequence[Record], scenario: str) -> list[str]:
    mine = [r for r in records if r.get("scenario") == scenario]
    if not mine:
        return []
    title, pairs = ENGINES[scenario]
    hosts, per_host = shape_of(mine[0])
    lines = [f"### {title}", "", f"{hosts} hosts x {per_host} "
             "tasks. Medians; ratios run by run.", "",
             "| launcher | runs | last task started | whole command | after a failure | exit "
             "| tasks alive then |", "|---|---|---|---|---|---|---|"]  # fmt: skip
    for name in dict.fromkeys(r["launcher"] for r in mine):
        ran = [r for r in mine if r["launcher"] == name and r["mode"] == "stamp"]
        failed = [r for r in mine if r["launcher"] == name and r["mode"] == "fail"]
        capped = any(r["exit"] is None for r in failed)
        after = "never" if capped else secs(median(failed, "teardown_s")) if failed else "-"
        codes = ", ".join(sorted({"none" if r["exit"] is None else str(r["exit"]) for r in failed}))
        alive = str(max(r["alive_at_exit"] for r in failed)) if failed else "-"
        cells = [secs(median(ran, "launch_s")), secs(median(ran, "wall_s")), after, codes or "-"]
        cells.append(alive)
        lines.append(f"| {name} | {len(ran)} | " + " | ".join(cells) + " |")
    ran = [r for r in mine if r["mode"] == "stamp"]
    for ours, peer in pairs:
        for key, what in (("launch_s", "last task started"), ("wall_s", "whole command")):
            if found := ratio(ran, ours, peer, key):
                lines.append(f"\n{ours} ÷ {peer}, {what}: {found[1]}")
    return lines


def restart_section(records: Sequence[Record]) -> list[str]:
    mine = [r for r in records if r.get("scenario") == "restart"]
    if not mine:
        return []
    lines = [
        "## Restart: from a task's failure to every task of the next attempt running",
        "",
        "`--max-restarts 1 --restart-delay 0` against relaunching by hand (dtrain twice, back "
        "to back), one task per host, interleaved (bench/restart.py). Medians; the ratio is run "
        "by run.",
        "",
        "| hosts | runs | restart | by hand | by hand ÷ restart |",
        "|---|---|---|---|---|",
    ]
    for hosts in sorted({r["hosts"] for r in mine}):
        rows = [r for r in mine if r["hosts"] == hosts]
        found = ratio(rows, "by hand", "restart", "gap_s")
        cells = [
            secs(median([r for r in rows if r["launcher"] == w], "gap_s"))
            for w in ("restart", "by hand")
        ]
        failed = sum(1 for r in rows if not r["ok"])
        runs = f"{len(rows) // 2}" + f" ({failed} failed)" * bool(failed)
        lines.append(f"| {hosts} | {runs} | {' | '.join(cells)} | {found[1] if found else '-'} |")
    return lines


def plot(records: Sequence[Record], path: Path) -> None:
    """Launch latency and teardown against host count, every launcher that has them."""
    import matplotlib

    matplotlib.use("Agg")  # files only, no display
    import matplotlib.pyplot as plt
    from matplotlib.ticker import FormatStrFormatter, LogLocator, NullFormatter

    figure, axes = plt.subplots(1, 2, figsize=(10, 4))
    panels = (("trivial", "launch_s", "launch: start to every task running"),
              ("teardown", "teardown_s", "teardown after one task fails"))  # fmt: skip
    for ax, (scenario, key, title) in zip(axes, panels, strict=True):
        for name in launchers_in(r for r in records if r.get("scenario") == scenario):
            points = [
                (s[0], median(pick(records, scenario, s, name), key))
                for s in shapes(records, scenario)
            ]
            shown = [(hosts, value) for hosts, value in points if value is not None]
            if shown:
                ax.plot(*zip(*shown, strict=True), marker="o", label=LABELS[name])
        ax.set(title=title, xlabel="hosts", ylabel="seconds (median)", xscale="log", yscale="log")
        ax.set_xticks(sorted({s[0] for s in shapes(records, scenario)}))
        ax.yaxis.set_major_locator(LogLocator(subs=(1.0, 2.0, 5.0)))
        for axis in (ax.xaxis, ax.yaxis):
            axis.set_major_formatter(FormatStrFormatter("%g"))
            axis.set_minor_formatter(NullFormatter())
        ax.grid(alpha=0.3)
        if ax.lines:
            ax.legend()
    figure.tight_layout()
    figure.savefig(path, dpi=90)
    plt.close(figure)


def write(folder: Path, doc: Path) -> None:
    records, meta = load(folder)
    versions = meta["versions"]
    text = HEADER.format(argv=" ".join(meta["argv"]), minutes=meta["runtime_s"] / 60, **versions)
    settings = meta["settings"]
    image = doc.with_suffix(".png")
    sections = [
        guard_rails(records),
        [LAUNCH, "", f"![launch latency and teardown against host count]({image.name})", "",
         *ratio_table(records, "trivial", "launch_s", "pdsh")],
        teardown_table(records),
        signal_table(records),
        [LOG.format(megabytes=settings["log_mb_per_host"]), "",
         *ratio_table(records, "log", "mb_per_s", "ssh")],
        restart_section(records),
        [ENGINE_NOTE.format(cap=settings["engine_cap_s"])] * any(
            r.get("scenario") in ENGINES for r in records
        ),
        *(engine_section(records, scenario) for scenario in ENGINES),
    ]  # fmt: skip
    rows = [r for r in records if r.get("scenario") == "stacks"]
    if rows:
        table = stacks.table(rows, rows[0]["reps"])
        sections.append(["## `dtrain stacks` against py-spy by hand over ssh", "", table])
    for lines in sections:
        if lines:
            text += "\n" + "\n".join(lines).rstrip("\n") + "\n"
    doc.write_text(text)
    plot(records, image)
