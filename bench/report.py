# ruff: noqa: RUF001 - the report is typeset: multiplication signs for ratios, en dashes
"""records.jsonl + meta.json -> docs/benchmarks.md and docs/benchmarks.png.

Pure formatting of what one run measured: every table is computed from the records, every
figure is shown with its ratio to pdsh (or to raw ssh for throughput) from the same run, and
each goal is judged from the numbers, not written in by hand.
"""

from __future__ import annotations

import json
import statistics
from collections.abc import Callable, Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import model, stats
from bench.launchers import AGENT, AGENT_C_ONLY, FLOOR, LABELS, SPLIT

Record = Mapping[str, Any]
PEERS = ("pdsh", "ssh", "tracker")
ORDER = ("dtrain", *PEERS)
SPLIT_HELPS = 1.10  # two launchers relay this much faster than one: the lock held it back
MODE_TEXT = {
    "as-is": "remote `~/.bashrc` as-is (pyenv init)",
    "blank": "remote `~/.bashrc` blanked",
}
# The ssh pool phase in a timeline record: bench/timeline.py's current name, then the name
# results recorded before the rename carry.
POOL_PHASES = (
    "ssh connect+auth and agents, all hosts (pool)",
    "ssh connect+auth, all hosts (pool)",
)
# The steps of a stamped launch at one host (bench/timeline.py for dtrain, bench/pyfloor.py's
# PYFLOOR_STAMPS for the floor), each by the phase whose end marks it: (row, dtrain's phase,
# the floor's phase); None where that launcher has no such step.
DIALLED = "TCP connect, dialled ahead (each host)"
STEP_ROWS = (
    ("dtrain's modules imported (click, the CLI, planning)", "import dtrain (click, dtrain.cli)",
     None),
    ("TCP connected (dialled while paramiko imports)", DIALLED, DIALLED),
    ("paramiko imported", "import paramiko (dtrain.transport.sshlib)",
     "import paramiko (dtrain.transport.sshlib)"),
    ("authenticated; the command sent (dtrain: its agent; the floor: the tasks)",
     "connect + open agent channels", "ssh handshake, auth and exec (each host)"),
    ("the agent answered its hello", "agents boot and answer hello", None),
    ("the start request answered (plan, checks, log dir, start)",
     "request 'start' on all hosts", None),
)  # fmt: skip
FIRST_STATEMENT = "Python's first statement"
LAST_TASK = "the last task running (its own start stamp)"


# ---- reading ---------------------------------------------------------------------------------


def load(folder: Path) -> tuple[list[dict[str, Any]], dict[str, Any]]:
    records = [json.loads(line) for line in (folder / "records.jsonl").read_text().splitlines()]
    meta_path = folder / "meta.json"
    meta = json.loads(meta_path.read_text()) if meta_path.exists() else {}
    return records, meta


def select(records: Iterable[Record], **want: Any) -> list[Record]:
    return [r for r in records if all(r.get(k) == v for k, v in want.items())]


def values(records: Iterable[Record], key: str) -> list[float]:
    return [float(r[key]) for r in records if isinstance(r.get(key), (int, float))]


def med(records: Iterable[Record], key: str) -> float | None:
    found = values(records, key)
    return statistics.median(found) if found else None


# ---- formatting ------------------------------------------------------------------------------


def small_reps_text(settings: Mapping[str, Any]) -> str:
    """How many more runs the trivial job had at the small host counts, if it had more."""
    small, at = settings.get("small_reps"), settings.get("small_hosts")
    if not small or not at or small <= (settings.get("reps") or 0):
        return ""
    return f" ({small} at {'1 and 2' if at == 2 else f'up to {at}'} hosts)"


def secs(value: float | None) -> str:
    if value is None:
        return "–"
    if value < 0.01:
        return f"{value * 1000:.1f} ms"
    if value < 0.1:
        return f"{value * 1000:.0f} ms"
    return f"{value:.2f} s"


def ratio(value: float | None, ref: float | None) -> str:
    if value is None or ref is None or ref <= 0:
        return ""
    return f" (×{value / ref:.2f})"


def cell(value: float | None, ref: float | None, unit: Callable[[float | None], str] = secs) -> str:
    return unit(value) + ratio(value, ref)


def mb(value: float | None) -> str:
    return "–" if value is None else f"{value:.0f} MB"


def cpu(value: float | None) -> str:
    return "–" if value is None else f"{value:.2f} s"


def whole_ms(value: float | None) -> str:
    return "–" if value is None else f"{value * 1000:.0f} ms"


def gap_ms(value: float | None, ref: float | None) -> str:
    return "–" if value is None or ref is None else f"{(value - ref) * 1000:+.0f} ms"


def shown_interval(ratios: Sequence[float]) -> tuple[float, float] | None:
    """The ratios' median interval as the doc prints it (two decimals), so that the verdict
    read from it agrees with the figures beside it (0.996 is printed, and judged, as 1.00)."""
    interval = stats.median_interval(ratios)
    return None if interval is None else (round(interval[0], 2), round(interval[1], 2))


def table(header: Sequence[str], rows: Iterable[Sequence[str]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    lines += ["| " + " | ".join(row) + " |" for row in rows]
    return [*lines, ""]


def exit_text(code: Any) -> str:
    if code is None:
        return "–"
    if isinstance(code, int) and code < 0:
        return f"killed (signal {-code})"
    return str(code)


def mode_of(items: Sequence[Any]) -> Any:
    return statistics.mode(items) if items else None


FIELDS_AT_SCALE = ("launch_s", "cpu_s", "rss_mb", "remote_cpu_s")


# ---- the document ----------------------------------------------------------------------------


class Report:
    def __init__(self, records: list[dict[str, Any]], meta: dict[str, Any]) -> None:
        # The scale runs (a larger cluster, fewer launchers) have their own section and feed the
        # model's fits; every other table is over the main sizes only.
        self.scale_records = select(records, group="scale")
        self.records = [r for r in records if r.get("group") != "scale"]
        self.meta = meta
        settings = meta.get("settings", {})
        self.host_counts: list[int] = sorted({r["hosts"] for r in self.trivial()})
        self.per_host: list[int] = sorted({r["per_host"] for r in self.trivial()})
        self.modes = [m for m in ("as-is", "blank") if select(records, bashrc=m)]
        self.bound_s = settings.get("teardown_bound_s", 5.0)
        self.window_s = settings.get("orphan_window_s", 5.0)
        self.head = (max(self.host_counts, default=1), max(self.per_host, default=1))

    def trivial(self, **want: Any) -> list[Record]:
        return [r for r in select(self.records, scenario="trivial", **want) if r.get("ok")]

    def launch(self, launcher: str, mode: str, hosts: int, per_host: int, key: str) -> float | None:
        found = self.trivial(launcher=launcher, bashrc=mode, hosts=hosts, per_host=per_host)
        return med(found, key)

    # ---- sections ---------------------------------------------------------------------------

    def render(self) -> str:
        out: list[str] = []
        out += self.intro()
        out += self.headline()
        out += self.goals()
        out += self.analysis()
        out += ["![launch latency and teardown against host count](benchmarks.png)", ""]
        out += self.launch_tables()
        out += self.job_tables()
        out += self.teardown_tables()
        out += self.orphan_tables()
        out += self.log_tables()
        out += self.resource_tables()
        out += self.doctor_section()
        out += self.bashrc_section()
        out += self.where_time_goes()
        out += self.extra_figures()
        out += self.scale_measured()
        out += self.scale_section()
        out += self.method()
        return "\n".join(out).rstrip() + "\n"

    def intro(self) -> list[str]:
        m = self.meta.get("machine", {})
        s = self.meta.get("settings", {})
        load_start, load_end = self.meta.get("load_start", []), self.meta.get("load_end", [])
        cores = m.get("cores") or 1
        busy = max([*load_start, *load_end, 0.0]) > 0.5 * cores
        busy_text = (
            f" A shared {cores}-core machine: absolute times are noisy; the ratios come from "
            "runs interleaved on the same hosts in the same minutes."
            if busy
            else ""
        )
        runtime = self.meta.get("runtime_s")
        kind = "`--quick`" if self.meta.get("quick") else "full"
        return [
            "# Benchmarks: dtrain against pdsh, one ssh per task, and the dmlc tracker",
            "",
            f"One {kind} run of `python -m bench`"
            + (f" ({runtime / 60:.1f} min)" if runtime else "")
            + ". Every launcher started the same tiny task on the same namespaced sshd hosts "
            "(tests/cluster/netcluster.py), in the same run, interleaved: the launcher order "
            "rotates with every repetition. Times are medians of "
            f"{s.get('reps', '?')} repetitions{small_reps_text(s)} (teardown "
            f"{s.get('teardown_reps', '?')}, log {s.get('log_reps', '?')}, doctor "
            f"{s.get('doctor_reps', '?')}); a figure in parentheses is its ratio to pdsh from "
            "the same run (to raw `ssh host cmd >file` for log throughput).",
            "",
            f"**Machine:** {m.get('cpu', '?')}, {cores} cores, {m.get('memory_gb', '?')} GB, "
            f"{m.get('os', '?')}, kernel {m.get('kernel', '?')}; load average "
            f"{'/'.join(map(str, load_start))} at the start and {'/'.join(map(str, load_end))} "
            f"at the end.{busy_text}",
            "",
            f"**Versions:** dtrain {m.get('dtrain', '?')}, paramiko {m.get('paramiko', '?')}, "
            f"{m.get('openssh', '?')}, {m.get('pdsh', '?')}, dmlc tracker from the mxnet "
            f"{m.get('mxnet', '?')} wheel (run unmodified; `Thread.isAlive` aliased at run "
            f"time), launcher Python {m.get('python', '?')}, task Python "
            f"{m.get('task_python', '?')}; open-file limit {m.get('ulimit_nofile', '?')}."
            + self.install_text(),
            "",
            "## Reproduce",
            "",
            "```sh",
            "sudo apt-get install -y openssh-server openssh-client iproute2 nftables pdsh",
            ".venv/bin/pip install -e '.[dev,bench]' --config-settings editable_mode=compat \\",
            "    'mxnet==1.9.1' 'numpy<1.24' py-spy",
            "sudo .venv/bin/python -m bench            # the full run (this page), minutes",
            "sudo .venv/bin/python -m bench --quick    # a smoke run of about a minute",
            ".venv/bin/python -m bench --report bench/results/<stamp>  # rewrite from records",
            "```",
            "",
            "It needs root (it builds the sshd cluster in network namespaces on "
            "198.18.0.0/24 and tears it down), writes its raw records to "
            "`bench/results/<stamp>/`, and this page plus `docs/benchmarks.png`. "
            "`numpy<1.24` keeps MXNet 1.9.1 importable (matplotlib ≥ 3.10 would pull "
            "numpy ≥ 1.25).",
            "",
        ]

    def install_text(self) -> str:
        """How the launcher's Python found dtrain: a start-up cost of dtrain's own, or of the
        checkout's install."""
        finder = self.meta.get("dtrain_finder")
        if finder is None:
            return ""
        if finder:
            return (
                " dtrain was imported through setuptools' editable finder, which every "
                "interpreter start imports (~15 ms here) and an installed dtrain does not: its "
                "launch and start-up figures include that."
            )
        return (
            " dtrain was installed as a plain path (editable_mode=compat), so its start-up "
            "costs what an installed dtrain's does."
        )

    def headline(self) -> list[str]:
        h, k = self.head
        rows = []

        def row(name: str, get: Callable[[str], float | None], unit: Any = secs) -> None:
            ref = get("pdsh")
            rows.append([name, *(cell(get(x), ref, unit) for x in ORDER)])

        def launch_in(mode: str) -> Callable[[str], float | None]:
            return lambda x: self.launch(x, mode, h, k, "launch_s")

        for mode in self.modes:
            row(f"launch: start → all {h * k} tasks running, bashrc {mode}", launch_in(mode))
        mode = self.modes[0] if self.modes else "as-is"
        row(
            f"trivial job end to end, bashrc {mode}",
            lambda x: self.launch(x, mode, h, k, "e2e_s"),
        )
        teardown = []
        for x in ORDER:
            found = select(self.records, scenario="teardown", launcher=x, hosts=h, per_host=k)
            teardown.append(self.teardown_text(found))
        rows.append(["one task exits 7, others sleep: time until the rest are gone", *teardown])
        codes = []
        for x in ORDER:
            found = select(self.records, scenario="teardown", launcher=x, hosts=h, per_host=k)
            codes.append(self.exit_codes(found))
        rows.append(["launcher exit code when one task exits 7", *codes])
        for scenario, text in (("sigint", "Ctrl-C"), ("sigkill", "SIGKILL")):
            cells = []
            for x in ORDER:
                found = select(self.records, scenario=scenario, launcher=x, group="all")
                cells.append(self.orphan_text(found))
            rows.append([f"tasks alive {self.window_s:g} s after {text} to the launcher", *cells])
        lh, lk = max(
            {(r["hosts"], r["per_host"]) for r in select(self.records, scenario="log")},
            default=(h, k),
        )
        rows.append([f"log throughput, {lh}×{lk} tasks (× raw ssh)", *self.log_cells(mode, lh, lk)])
        row(f"launcher CPU time ({mode})", lambda x: self.launch(x, mode, h, k, "cpu_s"), cpu)
        row(f"launcher peak RSS ({mode})", lambda x: self.launch(x, mode, h, k, "rss_mb"), mb)
        row(
            f"CPU on the hosts ({mode})",
            lambda x: self.launch(x, mode, h, k, "remote_cpu_s"),
            cpu,
        )
        return [
            f"## Headline: {h} hosts × {k} tasks",
            "",
            *table([f"{h} hosts × {k} tasks", *(LABELS[x] for x in ORDER)], rows),
            "Launcher CPU is wait4()'s figure for the launcher and every child it reaped "
            "(pdsh's and the tracker's ssh clients count for them; the dmlc tracker's remote "
            "ssh clients are orphaned when it exits, so part of its cost escapes); peak RSS is "
            "the launcher process's own (VmHWM). "
            "The dmlc tracker also runs its scheduler here, which is not counted as a task.",
            "",
        ]

    def teardown_text(self, found: Sequence[Record]) -> str:
        if not found:
            return "–"
        times = [r.get("teardown_s") for r in found if "teardown_s" in r]
        if not times:
            return "–"
        if any(t is None for t in times):
            bound = max(r.get("teardown_bound_s", self.bound_s) for r in found)
            return f"never (> {bound:g} s)"
        return secs(statistics.median([float(t) for t in times if t is not None]))

    def exit_codes(self, found: Sequence[Record]) -> str:
        codes = [r.get("exit_code") for r in found if "exit_code" in r]
        if not codes:
            return "–"
        code = mode_of(codes)
        stopped = any(r.get("exit_after_harness_stop") for r in found)
        return exit_text(code) + (" (only once the rest end)" if stopped else "")

    def orphan_text(self, found: Sequence[Record]) -> str:
        if not found:
            return "–"
        r = found[0]
        text = f"{r.get('orphans', '?')}/{r.get('tasks', '?')}"
        if r.get("local_orphans"):
            text += " + scheduler"
        return text

    def relay_ratios(self, modes: Sequence[str]) -> list[tuple[float, str, int, int]]:
        """dtrain's log throughput against raw ssh at every log shape run, in `modes`:
        (ratio, mode, hosts, per_host)."""
        shapes = sorted({(r["hosts"], r["per_host"]) for r in select(self.records, scenario="log")})
        ratios = []
        for mode in modes:
            for hosts, per_host in shapes:
                d = self.stream_rate(mode, hosts, per_host, "dtrain")
                s = self.stream_rate(mode, hosts, per_host, "ssh")
                if d and s:
                    ratios.append((d / s, mode, hosts, per_host))
        return ratios

    def stream_rate(self, mode: str, hosts: int, per_host: int, launcher: str) -> float | None:
        """MB/s the tasks' output reached the launcher's stdout: bytes the tasks wrote over the
        time from the first task's start to the end (launch latency left out)."""
        found = select(self.records, scenario="log", bashrc=mode, hosts=hosts, per_host=per_host)
        rates = [
            r["bytes_written"] / (r["e2e_s"] - r["first_task_s"]) / 1e6
            for r in select(found, launcher=launcher)
            if r.get("ok") and r.get("first_task_s") is not None and r["e2e_s"] > r["first_task_s"]
        ]
        return statistics.median(rates) if rates else None

    def split_rates(self, mode: str) -> list[tuple[int, int, float, float]]:
        """(hosts, per_host, MB/s in one dtrain, MB/s in two dtrain launchers of half the
        hosts each) at every shape that ran both ways."""
        shapes = sorted(
            {(r["hosts"], r["per_host"]) for r in select(self.records, scenario="log",
                                                         launcher=SPLIT)}
        )  # fmt: skip
        found = []
        for hosts, per_host in shapes:
            one = self.stream_rate(mode, hosts, per_host, "dtrain")
            two = self.stream_rate(mode, hosts, per_host, SPLIT)
            if one and two:
                found.append((hosts, per_host, one, two))
        return found

    def split_text(self, mode: str) -> str:
        """What relaying in two processes did, shape by shape: where it helps, one
        interpreter's lock holds the relay back; where it does not, something else does."""
        split = self.split_rates(mode)
        if not split:
            return ""
        each = ", ".join(f"×{two / one:.2f} at {h}×{k}" for h, k, one, two in split)
        held = [f"{h}×{k}" for h, k, one, two in split if two / one >= SPLIT_HELPS]
        free = [f"{h}×{k}" for h, k, one, two in split if two / one < SPLIT_HELPS]
        text = (
            f" Relayed by two dtrain launchers at once, each with half the hosts (section 5), "
            f"the same streams ran at {each} of one launcher's rate (bashrc {mode})"
        )
        if held:
            text += f": one interpreter's lock holds {', '.join(held)} back"
        if free:
            text += (
                f"{'; at ' if held else ': at '}{', '.join(free)} a second interpreter does "
                "not help, so the lock is not what holds it on this machine (its two cores, "
                "which the hosts' sshd, agents and tasks share, are)"
            )
        return text + "."

    def log_cells(self, mode: str, hosts: int, per_host: int) -> list[str]:
        raw = self.stream_rate(mode, hosts, per_host, "ssh")
        cells = []
        for x in ORDER:
            rate = self.stream_rate(mode, hosts, per_host, x)
            if rate is None:
                cells.append("–")
                continue
            rel = f" (×{rate / raw:.2f})" if raw else ""
            cells.append(f"{rate:.0f} MB/s{rel}")
        return cells

    # ---- goals ------------------------------------------------------------------------------

    def goals(self) -> list[str]:
        h, k = self.head
        rows = []
        for mode in self.modes:
            d = self.launch("dtrain", mode, h, k, "launch_s")
            p = self.launch("pdsh", mode, h, k, "launch_s")
            s = self.launch("ssh", mode, h, k, "launch_s")
            if d and p:
                rows.append(
                    self.goal(
                        f"launch {h}×{k} ≤ pdsh ({mode})",
                        "≤ ×1.00",
                        f"×{d / p:.2f} ({secs(d)} vs {secs(p)})",
                        d <= p,
                    )
                )
            if d and s:
                rows.append(
                    self.goal(
                        f"launch {h}×{k} ≤ 0.5× ssh per task ({mode})",
                        "≤ ×0.50",
                        f"×{d / s:.2f} ({secs(d)} vs {secs(s)})",
                        d <= 0.5 * s,
                    )
                )
        rows += self.every_size_goals()
        at_max = [
            r
            for r in select(self.records, scenario="teardown", launcher="dtrain", hosts=h)
            if "teardown_s" in r
        ]
        if at_max:
            teardowns = [r["teardown_s"] for r in at_max]
            never = any(t is None for t in teardowns)
            top = None if never else max(teardowns)
            rows.append(
                self.goal(
                    f"teardown after a failure at {h} hosts",
                    "≤ 1 s",
                    "never" if never else f"max {secs(top)} over {len(teardowns)} runs",
                    not never and top is not None and top <= 1.0,
                )
            )
        for scenario, text in (("sigint", "SIGINT"), ("sigkill", "SIGKILL")):
            found = select(self.records, scenario=scenario, launcher="dtrain")
            if found:
                orphans = sum(int(r.get("orphans", 0) or 0) for r in found)
                rows.append(
                    self.goal(
                        f"orphans after {text}",
                        "0",
                        f"{orphans} in {len(found)} runs",
                        orphans == 0,
                    )
                )
        ratios = [(r, f"{h}×{k}, {m}") for r, m, h, k in self.relay_ratios(self.modes)]
        if ratios:
            worst, where = min(ratios)
            best, _ = max(ratios)
            rows.append(
                self.goal(
                    "log throughput against raw ssh (streaming, every size)",
                    "≥ ×0.80",
                    f"×{worst:.2f} to ×{best:.2f} (lowest: {where})",
                    worst >= 0.8,
                )
            )
        rss = [
            v
            for m in self.modes
            for v in values(
                self.trivial(launcher="dtrain", bashrc=m, hosts=h, per_host=k), "rss_mb"
            )
        ]
        if rss and h * k >= 32:
            rows.append(
                self.goal(
                    f"launcher peak RSS at {h * k} tasks",
                    "< 100 MB",
                    f"max {max(rss):.0f} MB",
                    max(rss) < 100,
                )
            )
        rows += self.doctor_goal()
        return [
            "## Goals",
            "",
            "Benchmark goals the numbers are held against (not pass/fail tests).",
            "",
            *table(["goal", "target", "measured", "met"], rows),
        ]

    def every_size_goals(self) -> list[list[str]]:
        """Launch against pdsh at every size this run measured (the scale sizes too)."""
        rows = []
        everything = self.every_size()
        for mode in self.modes:
            ratios = []
            sizes = {(r["hosts"], r["per_host"]) for r in everything if r["bashrc"] == mode}
            for hosts, per_host in sorted(sizes):
                at = select(everything, bashrc=mode, hosts=hosts, per_host=per_host)
                d = med(select(at, launcher="dtrain"), "launch_s")
                p = med(select(at, launcher="pdsh"), "launch_s")
                if d and p:
                    ratios.append((d / p, f"{hosts}×{per_host}", (hosts, per_host)))
            if len(ratios) > 1:
                worst, where, _ = max(ratios)
                met = [w for r, w, _ in ratios if r <= 1.0]
                floors = [f / p for _, _, p, f, _ in self.floor_rows(mode)]
                floor = f"; Python floor ×{min(floors):.2f} to ×{max(floors):.2f}" if floors else ""
                rows.append(
                    self.goal(
                        f"launch ≤ pdsh at every size ({mode})",
                        "≤ ×1.00",
                        f"×{min(ratios)[0]:.2f} to ×{worst:.2f} (highest: {where}); "
                        f"met at {len(met)} of {len(ratios)} sizes{floor}"
                        + self.sides_text(mode, [size for r, _, size in ratios if r > 1.0]),
                        worst <= 1.0,
                    )
                )
        return rows

    def every_size(self) -> list[Record]:
        """The trivial jobs that ran, at the main sizes and at the scale sizes."""
        return [*self.trivial(), *self.scale_trivial()]

    def scale_trivial(self) -> list[Record]:
        return [r for r in select(self.scale_records, scenario="trivial") if r.get("ok")]

    def run_by_run(self, mode: str, hosts: int, per_host: int) -> list[float]:
        """dtrain's launch over pdsh's, repetition by repetition, at one size: the trivial jobs'
        and the scale runs', each paired within its own runs (both number theirs from 0)."""
        ratios = []
        for found in (self.trivial(), self.scale_trivial()):
            at = select(found, bashrc=mode, hosts=hosts, per_host=per_host)
            ratios += stats.paired_ratios(at, "dtrain", "pdsh", "launch_s")
        return ratios

    def sides_text(self, mode: str, unmet: Sequence[tuple[int, int]]) -> str:
        """What the run-by-run intervals say of the sizes the medians miss."""
        if not unmet:
            return ""
        told: dict[str, list[str]] = {}
        for hosts, per_host in unmet:
            interval = shown_interval(self.run_by_run(mode, hosts, per_host))
            told.setdefault(stats.verdict(interval), []).append(f"{hosts}×{per_host}")
        parts = []
        if "either" in told:
            parts.append(
                f"at {', '.join(told['either'])} the {stats.CONFIDENCE:.0%} interval of "
                "dtrain ÷ pdsh run by run spans ×1.00: this run cannot tell them apart there"
            )
        if "unknown" in told:
            parts.append(f"too few runs for that interval at {', '.join(told['unknown'])}")
        slower = ", ".join(told.get("above", [])) or "none of them"
        parts.append(f"dtrain slower beyond that interval at {slower}")
        return "; " + "; ".join(parts)

    def run_by_run_table(self) -> list[str]:
        """dtrain ÷ pdsh at every size, repetition by repetition, with its interval."""
        told = {
            "below": "dtrain faster",
            "above": "dtrain slower",
            "either": "cannot tell",
            "unknown": "too few runs",
        }
        sizes = sorted(
            {(r["hosts"], r["per_host"]) for r in self.every_size()}, key=lambda s: s[::-1]
        )
        rows = []
        for hosts, per_host in sizes:
            row = [f"{hosts}×{per_host}"]
            for mode in self.modes:
                ratios = self.run_by_run(mode, hosts, per_host)
                interval = shown_interval(ratios)
                if not ratios:
                    row += ["–", "–"]
                    continue
                spread = f" (×{interval[0]:.2f}–×{interval[1]:.2f})" if interval else ""
                row += [
                    f"×{statistics.median(ratios):.2f}{spread}, {len(ratios)} "
                    + ("run" if len(ratios) == 1 else "runs"),
                    told[stats.verdict(interval)],
                ]
            rows.append(row)
        if not rows:
            return []
        header = ["hosts×tasks"]
        for mode in self.modes:
            header += [f"{mode}: median ({stats.CONFIDENCE:.0%} interval)", f"{mode}: this run"]
        return [
            "### dtrain ÷ pdsh, run by run",
            "",
            "Each repetition runs dtrain and pdsh one after the other (the order rotating), so "
            "their ratio within a repetition carries less of the machine's drift than a ratio "
            "of two medians does. The median of those ratios, and the interval that holds the "
            f"median with {stats.CONFIDENCE:.0%} confidence by the sign test (between two of "
            "the ratios, nothing assumed of their spread; it needs 6 runs or more, "
            "`bench/stats.py`): where the interval spans ×1.00, this run cannot tell dtrain "
            "from pdsh at that size, and the goal's verdict there is the spread's, not "
            "dtrain's.",
            "",
            *table(header, rows),
        ]

    def doctor_goal(self) -> list[list[str]]:
        rows = []
        for mode in self.modes:
            found = [r for r in select(self.records, scenario="doctor", bashrc=mode)
                     if r.get("available")]  # fmt: skip
            one = med(select(found, hosts=1), "wall_s")
            most = max((r["hosts"] for r in found), default=None)
            top = med(select(found, hosts=most), "wall_s") if most else None
            if one and top and most and most > 1:
                rows.append(
                    self.goal(
                        f"`dtrain doctor` at {most} hosts ≤ ×1.5 of 1 host ({mode})",
                        "≤ ×1.50",
                        f"×{top / one:.2f} ({secs(top)} vs {secs(one)})"
                        + self.bare_cell(mode, most),
                        top <= 1.5 * one,
                    )
                )
        return rows

    def analysis(self) -> list[str]:
        """Where dtrain misses a goal: the evidence from this run and the change it points to."""
        h, k = self.head
        out = ["## Where dtrain misses, why, and what to change", ""]
        for mode in self.modes:
            d = self.launch("dtrain", mode, h, k, "launch_s")
            p = self.launch("pdsh", mode, h, k, "launch_s")
            timeline = next(iter(select(self.records, scenario="timeline", bashrc=mode)), None)
            if d is None or p is None or d <= p or not timeline:
                continue
            parts = self.timeline_parts(timeline)
            text = ", ".join(f"{name} {secs(value)}" for name, value in parts)
            out += [
                f"**Launch at {h}×{k}, {MODE_TEXT[mode]}: dtrain {secs(d)} against pdsh's "
                f"{secs(p)}.** One traced launch (below) splits as: {text}.",
                "",
            ]
            prof = self.launch_profile(mode)
            remote_d = self.launch("dtrain", mode, h, k, "remote_cpu_s")
            remote_p = self.launch("pdsh", mode, h, k, "remote_cpu_s")
            cores = self.meta.get("machine", {}).get("cores") or 2
            if prof and "profile" in prof and remote_d is not None and remote_p is not None:
                extra = remote_d - remote_p
                shim = (
                    ", under /usr/bin/python3, after the login shell's pyenv init"
                    if (mode == "as-is")
                    else ", under /usr/bin/python3"
                )
                out += [
                    "The launcher itself is not what is slow: in a profiled run (py-spy, all "
                    f"threads) it was on CPU for {prof['profile']['active_s']:.2f} s of that "
                    f"run's {secs(prof.get('e2e_s'))}, start to exit, much of it importing "
                    "modules. The rest of the time it waits for the hosts, and the hosts are "
                    f"this machine's {cores} cores: the launch cost them {cpu(remote_d)} of CPU "
                    f"under dtrain against {cpu(remote_p)} under pdsh, {cpu(extra)} more "
                    f"({extra / h * 1000:.0f} ms per host: dtrain's agent is one more Python "
                    f"interpreter per host{shim}). On a real cluster that work runs on each "
                    "host, in parallel, not on the launcher's cores (see *Scale*).",
                    "",
                ]
        cal = {
            m: next(iter(select(self.records, scenario="calibration", bashrc=m)), None)
            for m in self.modes
        }
        items = []
        a = cal.get("as-is")
        if a and a.get("agent_tuned_s") is not None:
            items.append(
                "- **Which python runs the agent matters.** Through the login PATH, `python3` "
                "is pyenv's shim here (a bash script that runs `pyenv exec`, i.e. several more "
                f"bash processes): alone, the agent's boot and first answer take "
                f"{secs(a['agent_s'])} under it and {secs(a['agent_tuned_s'])} under "
                "`/usr/bin/python3`. dtrain's default `--remote-python auto` therefore tries "
                "`/usr/bin/python3` and `/usr/local/bin/python3` before the login PATH "
                "(`dtrain/transport/bootstrap.py`, `remote_command()`); the agent needs only a "
                "standard-library Python >= 3.6, and tasks keep the user's own python. What "
                "is left is one Python interpreter per host that pdsh does not start: it starts "
                "with `-S` (no site-packages) and runs its compiled code from the host's cache "
                "(`~/.cache/dtrain`, keyed by the agent's content and the interpreter's bytecode "
                "version, private to the user) instead of compiling its source at every launch, "
                "and imports only C modules beyond the interpreter's own: it speaks JSON "
                "through json's C half, uses `_signal`, `_socket` and epoll, and starts "
                "processes by posix_spawn and threads by `_thread` (`dtrain/remote/spawn.py`), "
                "where `json`, `subprocess`, `signal`, `socket`, `selectors` and `threading` "
                "brought `enum`, `re`, `locale` and `collections`; `ctypes` loads once it "
                "relays a stream, `hashlib` where the doctor hashes files "
                "(`tests/remote/test_agent.py` holds a launch to that). Measured by hand on "
                "this machine: the agent from its start to its exit took 19.5 ms of CPU instead "
                "of 36 (60 runs, twice) and answered its hello 18 ms after it was spawned "
                "instead of 33-35 (40 runs, twice); an A/B of 12 launches a shape, bashrc "
                "blank: 8×1 0.76 s to 0.64 s, 8×4 1.03 s to 0.93 s, 2×4 0.47 to 0.43, "
                "1×1 0.360 to 0.353, with 22-28 ms less CPU on each host. Its tasks start "
                "through "
                "`setpriv --pdeathsig KILL` where the host's util-linux has it (2.33 or later), "
                "so each is spawned by vfork, not by a fork that runs Python in the child to set "
                "the parent-death signal (16 tasks from one agent, measured by hand: the start "
                "answered in 26 ms instead of 58, 98 ms of CPU instead of 121). Whether the "
                "host's setpriv takes that option is checked by running it once, started when "
                "the tasks are staged and taken at the first spawn, so the start request does "
                "not wait for it (stage, 2 ms, start on a local agent, 30 runs twice, measured "
                "by hand: the start answered in 2-3 ms instead of 5)."
            )
        local = select(self.records, scenario="local-overhead")
        cli = med(select(local, launcher="import dtrain.cli"), "wall_s")
        paramiko = med(select(local, launcher="import paramiko"), "wall_s")
        python = med(select(local, launcher="venv python"), "wall_s")
        if cli is not None and python is not None:
            where = "all of it what `launch` needs (click, the launcher, planning, its printing)"
            unneeded = self.unneeded_imports()
            if unneeded:
                where = (
                    "some of it modules `launch` does not need: by `python -X importtime` the "
                    f"largest are {', '.join(unneeded)}, imported at module level; import them "
                    "inside the functions that use them"
                )
            items.append(
                f"- **Imports before the first connection.** `import dtrain.cli` takes "
                f"{secs(cli - python)} beyond the interpreter's own start, {where}. paramiko, "
                "imported as dtrain imports it, then adds "
                + (f"{secs(paramiko - python)}" if paramiko is not None else "its own import")
                + " on the critical path (`paramiko/__init__` imports every module; dtrain holds "
                "back `invoke`, which `paramiko.config` imports only for `Match exec`, until a "
                "config needs it, and `importlib.metadata`, which `paramiko/__init__` imports "
                "only to read its own version: `dtrain/transport/sshlib.py`). What only the steps "
                "after the agents' hello need (the requests, the preflight's doctor modules, the "
                "stage's script check, the launcher's record, the supervisor and the job's "
                "results: 12-15 ms) loads in a thread while the hosts boot their "
                "agents (`modules_after_hello`, `dtrain/launch/lifecycle.py`; two A/Bs of 12 runs "
                "each, bashrc blank, measured by hand: 1×1 −22 and −8 ms, 1×4 −10 and −35, 2×1 "
                "−23 and +2, 2×4 −24 and −11); the "
                "stack taker, which only a hung job needs, loads when one does "
                "(`StacksOnDemand`); ps, kill, stacks and doctor render from their own modules "
                "(`dtrain/render/`); what a launch records of its launcher lives apart from the "
                "sweep's results (`dtrain/processes/launcher.py`), `ctypes` loads only where "
                "a ProxyCommand starts, and host names go to getaddrinfo as bytes, where a str "
                "has it load the idna codec (~2 ms: `lookup_name`, `dtrain/transport/machine.py`). "
                "Creating dtrain's records was the largest part that is "
                "dtrain's own: dataclasses compiles each record's methods from source text at "
                "every start, which no .pyc keeps (a launch's ~47 records, 273 compiles: 45-55 ms "
                "of its CPU, 31-40 ms of it before the first connection, timed by wrapping "
                "`exec` in `dataclasses`); the `dtrain` program now takes their compiled code from "
                "the user's cache folder, ~4 ms a start (`dtrain/codecache.py`; an A/B of 12 "
                "launches a shape, bashrc blank, measured by hand: 1×1 0.347 s to 0.300 s, pdsh "
                "0.295 s; 1×4 0.349 to 0.314, pdsh 0.305; 8×1 0.621 to 0.562; 8×4 0.919 to "
                "0.900; 37-52 ms less CPU in the launcher at every shape). Starting "
                "paramiko's import in a thread as the first thing `dtrain launch` does would "
                "hide only the little work that precedes the first connect. Each host's TCP "
                "connection is opened while paramiko imports, once every host's `ssh -G` answer "
                "is in and none could stop the launch before it connects (a refused setting, a "
                "proxy chain, a host listed twice: `dtrain/transport/dial.py`): sshd takes "
                "~11 ms here to start the process that serves a connection and send its banner, "
                "which the handshake now finds waiting instead of waiting 10-14 ms for it "
                "(stamped by hand, 8 launches each). Three A/Bs, bashrc blank, measured by "
                "hand, of 14, 30 and 20 launches a shape (the first two on a version that "
                "dialled each host as its own answer came): 1×1 0, −26 and −14 ms; 1×4 −10, "
                "−21, −9; 2×1 −6, 0, −4; 2×4 −10, +3, −8; 8×1 +9, −18; 8×4 −19, +10. The "
                "doctor, 12 runs each, interleaved: 1 host 0.54 s to 0.52 s, 8 hosts 0.86 s to "
                "0.84 s."
            )
        b = cal.get("blank") or a
        if b and b.get("channel_tuned_s") is not None and b["channel_s"] < 0.01:
            items.append(
                f"- **The first channel on each fresh connection takes {secs(b['channel_s'])}** "
                f"(a second one {secs(b['channel_again_s'])}): dtrain ACKs sshd's post-auth "
                "`hostkeys-00` message at once (TCP_QUICKACK, `TunedTransport` in "
                "`dtrain/transport/sshlib.py`). Without that, sshd's Nagle held its channel reply "
                "behind that unACKed message and Linux's delayed ACK cost 43 ms per launch."
            )
        elif b and b.get("channel_tuned_s") is not None:
            items.append(
                f"- **The first channel on each fresh connection takes {secs(b['channel_s'])}**; "
                f"a second one {secs(b['channel_again_s'])}, and the first one only "
                f"{secs(b['channel_tuned_s'])} after the connection sat idle for 0.1 s. That is "
                "the signature of sshd's Nagle holding its reply behind a post-auth message our "
                "side has not ACKed yet (Linux delays ACKs up to 40 ms): paid once per launch "
                "(hosts open in parallel), so a measurement to keep, not a fix to make blind."
            )
        items += self.small_job_analysis()
        if any(not row[-1].startswith("yes") for row in self.doctor_goal()):
            items.append(
                "- **`dtrain doctor` grows with the hosts' own work, not its rounds.** The "
                "listen, connect, unlisten and scan rounds take a few ms each at 8 hosts "
                "(`--debug` prints them); what grows is the probe, where every host runs "
                "`python3` to list its installed packages (read from the metadata directories "
                "on sys.path, without importing `importlib.metadata`, and written out without "
                "importing `json`: 16 ms of CPU under /usr/bin/python3, 25 ms with `json`, 84 ms "
                "with `importlib.metadata`) and, with the bashrc as-is, through pyenv's "
                "shim (75 ms more on this machine): on a "
                "real cluster each host does that in parallel on its own cores, here all of "
                "them share this machine's. That listing starts with each host's hello, in a "
                "thread of its agent, and runs while the network rounds do (`probe.Ahead`, "
                "`dtrain/remote/probe.py`; measured by hand, 14 runs each, bashrc blank: 1 host "
                "0.50 s to 0.45 s, 8 hosts 0.87 s to 0.82 s, the probe round at 8 hosts 0.29 s "
                "to 0.14 s) — the ratio barely moves because the one-host doctor, whose probe "
                "of this machine's pyenv `python3` takes 0.15 s, gains as much. "
                "Where that CPU goes, by program (`perf record -a -F 2000` over three 8-host "
                "doctors, bashrc blank, measured by hand): on each host the agent 27-30 ms, "
                "the probe's `python3` listing packages 18-24 ms, sshd ~28 ms in its two "
                "processes, the login shell and `sh` ~5 ms; the launcher 0.39-0.41 s in all, "
                "with this machine's own agent (40 ms) and its probe of the pyenv `python3` "
                "(~85 ms and pyenv's bash scripts). Each is a process start or a key exchange, "
                "none a round dtrain could merge. The agent took 11-12 ms more on each host "
                "until its host-name lookup passed the name to getaddrinfo as bytes: given a "
                "str, getaddrinfo encodes it by the idna codec, whose import brought `re`, "
                "`enum`, `functools` and `collections` into the agent (`probe._as_host`; "
                "`tests/remote/test_agent.py` holds a doctor's requests to the agent's C-only "
                "imports too); with the rounds sent from one thread (below), measured by hand "
                "(14 runs each, interleaved, bashrc blank): 8 hosts 0.81 s to 0.75 s, 1 host "
                "0.48 s to 0.47 s. The leaner agent (above) took 20-25 ms of CPU off each host "
                "(measured by hand, 10 runs each, interleaved, bashrc blank: 8 hosts 1.01 s to "
                "0.99 s, 1 host 0.58 s both): both doctors end when this machine's probe of "
                "its pyenv `python3` does (the probe round, 0.13-0.16 s at 1 and at 8 hosts in "
                "`--debug`), started at the hello." + self.doctor_floor()
            )
        items += self.throughput_analysis()
        items.append(
            "- **Steps that wait for the slowest host** (`dtrain/launch/lifecycle.py`): each "
            "host's agent starts in the connect pool job as soon as that host is connected "
            "(`SshTransport.try_connect_all(then=...)`), but the hello that gathers addresses "
            "and ports, the task check and the start request are each one round trip that "
            "waits for every host: the plan needs every host's address before any task can "
            "be given its environment, and nothing may start anywhere until every host has "
            "accepted its tasks. At 8 hosts that is three round trips of a few ms each. A round "
            "sends every host its request from the launcher's thread, then awaits each reply "
            "(`request_each`, `dtrain/agents/group.py`): it used a thread per host per round, "
            "~3 ms of a 4 ms round at 8 hosts on local agents (0.8 ms now; 0.7 to 0.24 ms at 1 "
            "host); an A/B of 16 launches a shape, bashrc blank, measured by hand: 8×1 0.666 s "
            "to 0.633 s, 8×4 0.949 to 0.912, 19-29 ms less launcher CPU; 1 and 2 hosts within "
            "noise (±10 ms)."
        )
        return [*out, *items, ""]

    def bare_scaling(self, mode: str, most: int) -> list[tuple[str, float]]:
        """The trivial job's launch at `most` hosts against one host (x1 task each), for the
        Python floor and pdsh in this run: what reaching each host and running a bare command
        costs as hosts are added, on this machine's shared cores."""
        ratios = []
        for launcher in (FLOOR, "pdsh"):
            one = self.launch(launcher, mode, 1, 1, "launch_s")
            top = self.launch(launcher, mode, most, 1, "launch_s")
            if one and top:
                ratios.append((LABELS[launcher], top / one))
        return ratios

    def bare_cell(self, mode: str, most: int) -> str:
        found = self.bare_scaling(mode, most)
        ratios = ", ".join(f"{name} ×{r:.2f}" for name, r in found)
        return f"; a bare command, {most} hosts vs 1: {ratios}" if found else ""

    def doctor_floor(self) -> str:
        """The wall time this machine's cores need for doctor's CPU at the most hosts, against
        the 1.5x budget: above it, fewer rounds cannot meet the goal here, only less CPU.

        Until the launcher starts its first connection no host can work: that part (its
        interpreter, imports and config, stamped in a run of its own) is serial; only the CPU
        after it can spread over the cores."""
        cores = self.meta.get("machine", {}).get("cores") or 2
        parts = []
        for mode in self.modes:
            found = [r for r in select(self.records, scenario="doctor", bashrc=mode)
                     if r.get("available")]  # fmt: skip
            most = max((r["hosts"] for r in found), default=None)
            one = med(select(found, hosts=1), "wall_s")
            if not most or most == 1 or one is None:
                continue
            top = select(found, hosts=most)
            here, hosts = med(top, "cpu_s"), med(top, "remote_cpu_s")
            if here is None or hosts is None:
                continue
            serial = [r for r in select(self.records, scenario="doctor_serial", bashrc=mode,
                                        hosts=most) if r.get("ok")]  # fmt: skip
            serial_s, serial_cpu = med(serial, "serial_s"), med(serial, "serial_cpu_s")
            if serial_s is not None and serial_cpu is not None:
                rest = max(0.0, here + hosts - serial_cpu)
                floor = serial_s + rest / cores
                how = (
                    f"at least {secs(floor)} of wall ({secs(serial_s)} of the launcher's "
                    "interpreter, imports and config before its first connection, when no "
                    f"host can start, then {secs(rest)} of CPU on {cores} cores)"
                )
            else:
                floor = (here + hosts) / cores
                how = f"at least {secs(floor)} of wall on {cores} cores"
            verdict = "above" if floor > 1.5 * one else "below"
            parts.append(
                f"{mode}: at {most} hosts doctor cost {secs(hosts)} of CPU on the hosts and "
                f"{secs(here)} in the launcher: {how}, {verdict} the ×1.5 budget of "
                f"{secs(1.5 * one)} (1.5 × the 1-host doctor's {secs(one)})"
            )
        if not parts:
            return ""
        most = max((r["hosts"] for r in select(self.records, scenario="doctor")), default=1)
        bare = {m: self.bare_scaling(m, most) for m in self.modes}
        if not all(bare.values()):
            return " Measured in this run (section 7) — " + "; ".join(parts) + "."
        ratios = "; ".join(
            f"{m}: " + ", ".join(f"{name} ×{r:.2f}" for name, r in found)
            for m, found in bare.items()
        )
        above = all(r > 1.5 for found in bare.values() for _, r in found)
        return (
            " Measured in this run (section 7) — "
            + "; ".join(parts)
            + f". Reaching each host and running a bare command, {most} hosts against 1 "
            f"(the trivial job, {most}×1 against 1×1, section 1): {ratios}"
            + (
                ". Every host's sshd, login shell and command run on this machine's cores, "
                f"so here neither stays within ×1.5 from 1 host to {most}; on a cluster each "
                "host does that work on its own."
                if above
                else "."
            )
        )

    def small_job_analysis(self) -> list[str]:
        """Where dtrain is behind pdsh at a size below the headline's host count: its fixed
        start-up cost, at the smallest such size (the bashrc blanked first, then as-is)."""
        small = sorted(
            ((h, k) for k in self.per_host for h in self.host_counts if h < self.head[0]),
            key=lambda size: (size[0] * size[1], size[0]),
        )
        behind = [
            (m, h, k)
            for h, k in small
            for m in sorted(self.modes, key=lambda m: m != "blank")
            if (self.launch("dtrain", m, h, k, "launch_s") or 0)
            > (self.launch("pdsh", m, h, k, "launch_s") or float("inf"))
        ]
        if not behind:
            return []
        mode, h, k = behind[0]
        d = self.launch("dtrain", mode, h, k, "launch_s")
        p = self.launch("pdsh", mode, h, k, "launch_s")
        local = select(self.records, scenario="local-overhead")
        version = med(select(local, launcher="dtrain --version"), "wall_s")
        bare = med(select(local, launcher="bare"), "wall_s")
        if d is None or p is None or d <= p or version is None:
            return []
        f = self.launch(FLOOR, mode, h, k, "launch_s")
        if f is None:
            verdict = (
                "That gap is fixed, so it shrinks in ratio as jobs grow, and dtrain passes pdsh "
                "where the hosts' work dominates (see *Measured at scale*)."
            )
        elif (steps := self.steps(mode)) is not None and (
            split := self.steps_text(steps["dtrain"], steps[FLOOR], steps["pdsh"])
        ):
            lead = "The language is not what holds it there" if f <= p else "Part of it is"
            verdict = (
                f"{lead}: the Python floor (section 1), paramiko tuned as dtrain's, starts it "
                f"in {secs(f)} (×{f / p:.2f} of pdsh). The other {secs(d - f)} is dtrain's "
                "own. The stamped launches at 1×1 (section 1, *One host, step by step*: "
                "launches of their own, so their total differs from this one by the runs' "
                f"spread) place it: {split[0]} The agent answers ~20 ms after its start "
                "(33 ms before it "
                f"did without the standard modules named next: {self.agent_cost()}); the "
                "requests after its hello are the preflight's listen, unlisten and scan, the "
                "task check and the start, 1-2.5 ms each with `--debug`, with the plan (<1 ms) "
                "and the job's log directory and job.json (~2 ms). The imports before the "
                "first connection, each over what paramiko loads anyway (measured by hand, "
                "medians of 21 starts of each set): click ~19 ms, dtrain's own modules ~45 ms "
                "(the command line, planning, the launcher, their records' methods from the "
                "compiled-code cache); `ssh -G` costs nothing after a config's first run "
                "(its answers are kept: `dtrain/transport/sshcache.py`). That is the price of "
                "what dtrain does that pdsh does not (an agent on every host that supervises "
                "the tasks and leaves nothing behind; a plan that needs every host's address "
                "and ports before any task starts; a preflight that finds what would hang the "
                "job); the gap is fixed, so it shrinks in ratio as jobs grow (see *Measured "
                "at scale*)."
            )
        else:
            lead = "The language is not what holds it there" if f <= p else "Part of it is"
            verdict = (
                f"{lead}: the Python floor (section 1), paramiko tuned as dtrain's, starts it "
                f"in {secs(f)} (×{f / p:.2f} of pdsh). "
                f"The other {secs(d - f)} is dtrain's own. Measured by hand at 1×1 (bashrc "
                "blank, 14 launches each, interleaved, medians, twice; a timer on the first "
                "TCP connect and the task's own start stamp), the floor connects 160-185 ms "
                "after it is started and its task runs 37-43 ms later; dtrain connects 42-49 ms "
                "after the floor does (click, the CLI, planning and the launcher: their imports, "
                "their records' methods from the compiled-code cache, and ~7 ms from the flags "
                "to a request, click's parsing 3-4 ms of it; `ssh -G` costs nothing after a "
                "config's first run, its "
                "answers are kept: `dtrain/transport/sshcache.py`) and its task runs 38-48 ms "
                "later than the floor's does after the connect (measured before either "
                "dialled its hosts while paramiko imports, which takes the 10-14 ms wait for "
                "sshd's banner off that part): the agent's boot on the host, "
                "~20 ms from its start to its first answer (33 ms before it did without the "
                f"standard modules named next: {self.agent_cost()}); five round trips after "
                "the hello, 1-2.5 ms each with `--debug` (the preflight's listen, unlisten and "
                "scan, the task check, the start); the plan (<1 ms), the job's log directory "
                "and job.json (~2 ms). That is "
                "the price of what dtrain does that pdsh does not (an agent on every host that "
                "supervises the tasks and leaves nothing behind; a plan that needs every host's "
                "address and ports before any task starts; a preflight that finds what would "
                "hang the job); the gap is fixed, so it shrinks in ratio as jobs grow "
                "(see *Measured at scale*)."
            )
        return [
            f"- **Small jobs pay the launcher's own start.** At {h}×{k} ({MODE_TEXT[mode]}) "
            f"dtrain starts the task in {secs(d)} against pdsh's {secs(p)}; `dtrain --version` "
            f"alone takes {secs(version)} here (a bare `python3 -S -c pass` {secs(bare)}): "
            "the Python interpreter and the imports a launch needs (click, planning, paramiko) "
            "come before the first connection, where pdsh, in C, is already connecting (at the "
            "end, dtrain leaves without the interpreter's teardown, which took 40-65 ms: "
            f"`run` in `dtrain/cli.py`). {verdict}{self.told_apart_text(mode, h, k)}"
        ]

    def told_apart_text(self, mode: str, hosts: int, per_host: int) -> str:
        """Whether this run can tell dtrain from pdsh at this size, run by run."""
        ratios = self.run_by_run(mode, hosts, per_host)
        interval = shown_interval(ratios)
        if interval is None:
            return ""
        low, high = interval
        side = stats.verdict(interval)
        what = {
            "below": "dtrain is faster there beyond the runs' spread",
            "above": "dtrain is slower there beyond the runs' spread",
            "either": "this run cannot tell dtrain from pdsh there",
        }[side]
        return (
            f" Run by run ({len(ratios)} repetitions, each with both launchers), dtrain ÷ pdsh "
            f"at {hosts}×{per_host} is ×{statistics.median(ratios):.2f}, its "
            f"{stats.CONFIDENCE:.0%} interval ×{low:.2f} to ×{high:.2f}: {what} (section 1, "
            "*dtrain ÷ pdsh, run by run*)."
        )

    def agent_cost(self) -> str:
        """What the agent's start costs in CPU, measured in this run against a bare
        interpreter and one importing the same C modules: what is left is its own code."""
        local = select(self.records, scenario="local-overhead")
        agent = med(select(local, launcher=AGENT), "cpu_s")
        c_only = med(select(local, launcher=AGENT_C_ONLY), "cpu_s")
        bare = med(select(local, launcher="bare"), "cpu_s")
        if agent is None or c_only is None or bare is None:
            return "a second interpreter after the login shell"
        return (
            "a second interpreter after the login shell; in this run, with its `sh -c` "
            f"command, from its start to its exit, {secs(agent)} of CPU against {secs(bare)} "
            "for a bare `python3 -S` and "
            f"{secs(c_only)} for one importing the C modules the agent imports (`_json`, "
            "`_socket`, `_signal`, `select`, ...: it does without `json`, `subprocess`, "
            "`signal`, `socket`, `selectors` and `threading`, which brought `enum`, `re`, "
            "`locale` and `collections` and nearly doubled its CPU, `dtrain/remote/spawn.py`); "
            f"the other {secs(agent - c_only)} is its own code, from the host's cache (table "
            "in *Other figures*)"
        )

    def unneeded_imports(self) -> list[str]:
        """The biggest modules `import dtrain.cli` loads that `click, dtrain.launch.lifecycle,
        dtrain.render` do not, as text: each direct import with the costliest module it pulls
        in."""
        record = next(iter(select(self.records, scenario="imports")), None)
        if record is None or not record.get("complete"):
            return []  # older runs kept only imports of 5 ms or more: no complete set to compare
        needed = {name for name, _, _ in record["launch"]}
        chosen: list[tuple[float, str]] = []
        children: list[tuple[float, str]] = []  # importtime lists children before parents
        for name, depth, seconds in record["cli"]:
            if depth >= 2 and name not in needed:
                children.append((seconds, name))
                continue
            if depth == 1 and name not in needed and seconds >= 0.01:
                via = max(children, default=None)
                through = f", through `{via[1]}`" if via else ""
                chosen.append((seconds, f"`{name}` ({secs(seconds)}{through})"))
            if depth == 1:
                children = []
        return [text for _, text in sorted(chosen, reverse=True)[:3]]

    def throughput_analysis(self) -> list[str]:
        """If the relay misses 0.8 of raw ssh's rate at any shape: the CPU and profile why, from one
        host's stream (the shape the launcher's cost per MB is measured at)."""
        mode = "blank" if "blank" in self.modes else (self.modes[0] if self.modes else "as-is")
        d = self.stream_rate(mode, 1, 1, "dtrain")
        s = self.stream_rate(mode, 1, 1, "ssh")
        if d is None or s is None or all(r >= 0.8 for r, *_ in self.relay_ratios(self.modes)):
            return []
        megabytes = self.meta.get("settings", {}).get("log_mb_per_host", 40.0)

        def cpu_per_mb(launcher: str) -> float | None:
            log = med(
                select(
                    self.records,
                    scenario="log",
                    bashrc=mode,
                    hosts=1,
                    per_host=1,
                    launcher=launcher,
                ),
                "cpu_s",
            )
            base = self.launch(launcher, mode, 1, 1, "cpu_s")
            return None if log is None or base is None else (log - base) / megabytes

        cd, cs = cpu_per_mb("dtrain"), cpu_per_mb("ssh")
        h, k = self.head
        at_head = []
        for m in self.modes:
            dd, ss = self.stream_rate(m, h, k, "dtrain"), self.stream_rate(m, h, k, "ssh")
            if dd and ss:
                at_head.append(f"×{dd / ss:.2f} with the bashrc {m}")
        head_text = f" (at {h}×{k}: {', '.join(at_head)})" if at_head else ""
        cost = ""
        if cd is not None and cs is not None and cd > 0:
            cost = (
                f" The launcher spends {cd * 1000:.1f} ms of CPU per MB relayed against "
                f"{cs * 1000:.1f} ms for the OpenSSH client, and every host's stream runs "
                "through the same Python process, so on a launcher machine with cores to spare "
                "one core (the GIL) would cap the whole job's log rate near "
                f"{1 / cd:.0f} MB/s, whatever the host count{head_text}."
            )
        prof = next(
            (r for r in select(self.records, scenario="profile") if r.get("profiled") == "log"),
            None,
        )
        threads = ""
        if prof and "profile" in prof:
            p = prof["profile"]
            split = ", ".join(f"{name} {value:.2f} s" for name, value in p.get("threads", []))
            top = ", ".join(f"`{f}` {v:.2f} s" for f, v in p["self"][:6])
            threads = (
                f" py-spy over one host streaming {prof['bytes_written'] / 1e6:.0f} MB: "
                f"{p['active_s']:.2f} s on CPU in the launcher — {split}; most self time in "
                f"{top}."
            )
        machine = ""
        ratios = self.relay_ratios([mode])
        if ratios:
            worst, _, wh, wk = min(ratios)
            parts = {x: self.cpu_per_mb_parts(mode, wh, wk, x) for x in ("dtrain", "ssh")}
            (dl, dh), (sl, sh) = parts["dtrain"], parts["ssh"]
            if dl is not None and dh is not None and sl is not None and sh is not None:
                clients = "the OpenSSH client" if wh * wk == 1 else "the OpenSSH clients"
                machine = (
                    f" At {wh}×{wk}, the lowest ratio with the bashrc {mode} (×{worst:.2f}), "
                    "the whole machine (launcher, sshd, agents and tasks) spent "
                    f"{(dl + dh) * 1000:.1f} ms of CPU per MB under dtrain against "
                    f"{(sl + sh) * 1000:.1f} ms under raw ssh: the launcher {dl * 1000:.1f} ms "
                    f"against {sl * 1000:.1f} ms for {clients}, the hosts (sshd, agents, tasks) "
                    f"{dh * 1000:.1f} ms against {sh * 1000:.1f} ms. Under dtrain the bytes pass "
                    "through one more process on each host, its agent, and the launcher also "
                    "writes each task's log; hosts and launcher share this machine's two cores, "
                    "so that CPU is where the rest of the gap is."
                )
        return [
            f"- **One host's log stream: {d:.0f} MB/s under dtrain, {s:.0f} MB/s through raw "
            f"ssh** ({d / s:.2f}×)."
            f"{cost}{threads} Each chunk of output crosses two threads of the launcher: "
            "paramiko's transport thread (AES-GCM, preferred by dtrain), which decrypts each "
            "packet (sshd sends at most 32 KB a packet) and queues it as it is in the agent "
            "channel's buffer (`ByteQueue`), and the host's reader thread "
            "(`AgentSession._read_loop`), which joins one frame (one copy), writes it to the "
            "task's log and, prefixed in one `replace`, to the console with `writev`. While "
            "the launcher is behind, the agent grows a task's waiting frame to 256 KB, so "
            "the per-frame costs (a log write, a console write, a wake-up) come per 256 KB, "
            "not per pipe read. The agent reads a streaming task's pipe (grown to 256 KB) "
            "after a rest of 1 ms, so one read takes many of its 4-8 KB writes; it writes "
            "the frames into a pipe to sshd grown to 1 MB once it fills (at Linux's 64 KB "
            "each frame took several wake-ups and writes, and sshd sent smaller packets); "
            "and the launcher gives sshd its window back at half used, as OpenSSH does, not at "
            "a tenth (each adjust is a packet built in Python). Once output streams, the "
            "launcher and the agents fix glibc malloc's thresholds (`dtrain/remote/heap.py`): "
            "left to adjust themselves, they handed the 64-256 KB buffers a relay allocates "
            "for every chunk back to the kernel, which faulted them in and zeroed them again "
            "(4 tasks on one host streaming 100 MB from `yes`: 65,000 page faults and 0.34 s "
            "of system time in the launcher, now 7,000 and 0.15 s; this benchmark's task, "
            "which writes 100-byte lines from Python in smaller frames, churned less: 9,000 "
            "to 20,000 faults per 40 MB, now 7,000 to 8,000). What is left is paramiko's "
            "Python per packet in the launcher and, on each host, the agent the bytes pass "
            "through."
            f"{machine}{self.split_text(mode)} On a launcher machine with cores to spare, "
            "the one process's cap above is what would remain; one relay "
            "process per group of hosts, each writing its own tasks' logs and console lines, "
            "would lift it (a relay of OpenSSH clients' pipes in one Python process, tried by "
            "hand, was no faster than this one: the cost is per Python operation, not the "
            "cipher)."
        ]

    def cpu_per_mb_parts(
        self, mode: str, hosts: int, per_host: int, launcher: str
    ) -> tuple[float | None, float | None]:
        """(launcher, hosts) CPU seconds per MB of log, each less what the trivial job of the
        same shape costs it, medians over the runs."""
        found = select(self.records, scenario="log", bashrc=mode, hosts=hosts,
                       per_host=per_host, launcher=launcher)  # fmt: skip
        found = [r for r in found if r.get("ok") and r.get("bytes_written")]
        parts: list[float | None] = []
        for key in ("cpu_s", "remote_cpu_s"):
            start = self.launch(launcher, mode, hosts, per_host, key) or 0.0
            values = [
                (r[key] - start) / (r["bytes_written"] / 1e6)
                for r in found
                if r.get(key) is not None
            ]
            parts.append(statistics.median(values) if values else None)
        return parts[0], parts[1]

    def launch_profile(self, mode: str) -> Record | None:
        found = select(self.records, scenario="profile", bashrc=mode)
        return next((r for r in found if r.get("profiled", "trivial") == "trivial"), None)

    def timeline_parts(self, timeline: Record) -> list[tuple[str, float]]:
        """Named slices of one traced launch, from the launcher's start to the last task."""
        phases = {e["phase"]: e for e in timeline.get("phases", [])}
        started = float(timeline.get("python_started_s", 0.0))

        def at(name: str, edge: str) -> float | None:
            e = phases.get(name)
            return None if e is None else started + float(e[edge])

        pool = next((n for n in POOL_PHASES if n in phases), POOL_PHASES[0])
        marks = [
            ("interpreter and imports", 0.0, at(pool, "start_s")),
            (
                "connect and open channels",
                at("connect + open agent channels", "start_s"),
                at("connect + open agent channels", "end_s"),
            ),
            (
                "agents boot and answer",
                at("agents boot and answer hello", "start_s"),
                at("agents boot and answer hello", "end_s"),
            ),
            (
                "plan, check and start the tasks",
                at("agents boot and answer hello", "end_s"),
                at("request 'start' on all hosts", "end_s"),
            ),
            (
                "the tasks' own start",
                at("request 'start' on all hosts", "end_s"),
                timeline.get("launch_s"),
            ),
        ]
        return [(name, b - a) for name, a, b in marks if a is not None and b is not None]

    @staticmethod
    def goal(name: str, target: str, measured: str, met: bool) -> list[str]:
        return [name, target, measured, "yes" if met else "**no**"]

    # ---- per-metric tables ------------------------------------------------------------------

    def by_config(self, mode: str, key: str, unit: Any = secs) -> list[list[str]]:
        rows = []
        for k in self.per_host:
            for h in self.host_counts:
                ref = self.launch("pdsh", mode, h, k, key)
                ssh = self.launch("ssh", mode, h, k, key)
                d = self.launch("dtrain", mode, h, k, key)
                cells = [cell(self.launch(x, mode, h, k, key), ref, unit) for x in ORDER]
                vs_ssh = f"×{d / ssh:.2f}" if d and ssh else "–"
                rows.append([f"{h}×{k}", *cells, vs_ssh])
        return rows

    def floor_rows(self, mode: str) -> list[tuple[int, int, float, float, float]]:
        """(hosts, tasks per host, pdsh, Python floor, dtrain) launch medians where all three
        ran in this run's trivial jobs."""
        rows = []
        for k in self.per_host:
            for h in self.host_counts:
                p, f, d = (
                    self.launch(x, mode, h, k, "launch_s") for x in ("pdsh", FLOOR, "dtrain")
                )
                if p and f and d:
                    rows.append((h, k, p, f, d))
        return rows

    def floor_table(self) -> list[str]:
        if not any(self.floor_rows(mode) for mode in self.modes):
            return []
        out = [
            "### What any Python launcher pays: the Python floor",
            "",
            "`bench/pyfloor.py`, interleaved with the launchers above: one paramiko connection "
            "per host, tuned as dtrain tunes its own, one exec channel on each running what "
            "pdsh runs there (the tasks, started by the login shell), every exit status waited "
            "for, out without the interpreter's teardown; no `ssh -G`, no agent, "
            "plan, logs, teardown or signal handling. What it takes is what a launcher written "
            "in Python pays on this machine; dtrain's distance above it is dtrain's own. "
            "pdsh − floor is the room a Python launcher has for its own work (an agent on "
            "each host, a plan) before it is slower than pdsh at that size: where it is "
            "smaller than what the agent alone costs (a second interpreter after the login "
            "shell, its hello and five short rounds after it: the step table below), no "
            "launcher with an agent on each host can be ≤ pdsh there on this machine; where "
            "it is larger, the rest of dtrain's own cost (its imports: the step table) is "
            "what stands between.",
            "",
        ]
        for mode in self.modes:
            rows = [
                [
                    f"{h}×{k}",
                    secs(p),
                    cell(f, p),
                    cell(d, p),
                    f"{(p - f) * 1000:.0f} ms",
                    f"{(d - f) * 1000:+.0f} ms",
                ]
                for h, k, p, f, d in self.floor_rows(mode)
            ]
            header = [
                "hosts×tasks",
                "pdsh",
                LABELS[FLOOR],
                "dtrain",
                "room: pdsh − floor",
                "dtrain − floor",
            ]
            out += [f"{MODE_TEXT[mode]}:", "", *table(header, rows)]
        return out

    def step_marks(self, record: Record) -> dict[str, float]:
        """When one stamped launch reached each step, in seconds since it was spawned."""
        started = record.get("python_started_s")
        phases = record.get("phases") or []
        marks: dict[str, float] = {}
        if record.get("launch_s") is not None:
            marks[LAST_TASK] = float(record["launch_s"])
        if started is None or not phases:
            return marks
        marks[FIRST_STATEMENT] = float(started)
        column = 1 if record.get("launcher") == "dtrain" else 2
        for row in STEP_ROWS:
            ends = [float(e["end_s"]) for e in phases if e["phase"] == row[column]]
            if row[column] and ends:
                marks[row[0]] = float(started) + max(ends)
        return marks

    def steps(self, mode: str) -> dict[str, dict[str, float]] | None:
        """Each launcher's median time to each step at one host (None without such runs)."""
        found = select(self.records, scenario="steps", bashrc=mode, ok=True)
        out: dict[str, dict[str, float]] = {}
        for launcher in ("dtrain", FLOOR, "pdsh"):
            runs = [self.step_marks(r) for r in found if r["launcher"] == launcher]
            names = {name for marks in runs for name in marks}
            out[launcher] = {
                name: statistics.median(m[name] for m in runs if name in m) for name in names
            }
        if not out["dtrain"].get(LAST_TASK) or not out[FLOOR].get(LAST_TASK):
            return None
        return out

    def steps_table(self) -> list[str]:
        found = {m: steps for m in self.modes if (steps := self.steps(m)) is not None}
        if not found:
            return []
        first = next(iter(found))
        reps = len(select(self.records, scenario="steps", bashrc=first, launcher="dtrain"))
        out = [
            "### One host, step by step: dtrain against the Python floor",
            "",
            f"{reps} launches each of dtrain, the Python floor and pdsh at 1×1, interleaved, "
            "every step stamped (dtrain through bench/timeline.py, which wraps its steps "
            "without changing them; the floor by its own stamps): the median time, from "
            "the launcher's spawn, at which each reached each step. Medians are taken "
            "step by step, so a row's difference is where dtrain stands by then, not the sum "
            "of the rows above.",
            "",
        ]
        for mode, steps in found.items():
            d, f, p = steps["dtrain"], steps[FLOOR], steps["pdsh"]
            names = [FIRST_STATEMENT, *(row[0] for row in STEP_ROWS), LAST_TASK]
            rows = [
                [
                    name,
                    whole_ms(f.get(name)),
                    whole_ms(d.get(name)),
                    gap_ms(d.get(name), f.get(name)),
                ]
                for name in names
            ]
            rows.append(["pdsh: the last task running", whole_ms(p.get(LAST_TASK)), "", ""])
            out += [f"{MODE_TEXT[mode]}:", "", *table(["step", LABELS[FLOOR], "dtrain",
                                                         "dtrain − floor"], rows)]  # fmt: skip
            out += self.steps_text(d, f, p)
        return out

    @staticmethod
    def steps_text(
        d: Mapping[str, float], f: Mapping[str, float], p: Mapping[str, float]
    ) -> list[str]:
        """What the step table says, in numbers: where dtrain's distance from the floor
        arises, against the room pdsh leaves."""
        connected, imported, sent = (row[0] for row in STEP_ROWS[1:4])
        hello, started = STEP_ROWS[4][0], STEP_ROWS[5][0]
        need = (connected, imported, sent, hello, started, LAST_TASK)
        if any(d.get(n) is None for n in need) or any(f.get(n) is None for n in need[:3]):
            return []

        def lag(name: str) -> float:
            return (d[name] - f[name]) * 1000

        total = lag(LAST_TASK)
        parts = [
            f"{lag(connected):+.0f} ms by its first connection (the imports before it)",
            f"{lag(imported) - lag(connected):+.0f} ms over paramiko's import (dtrain has "
            "loaded much of what paramiko needs by then)",
            f"{lag(sent) - lag(imported):+.0f} ms over the handshake, to the command",
            f"{total - lag(sent):+.0f} ms from there to the last task: the login shell, "
            f"the agent's boot and its hello {(d[hello] - d[sent]) * 1000:.0f} ms, the "
            "requests after it up to "
            f"the start {(d[started] - d[hello]) * 1000:.0f} ms, then the tasks' own start, "
            "where the floor's login shell starts its tasks",
        ]
        room = (p[LAST_TASK] - f[LAST_TASK]) * 1000 if p.get(LAST_TASK) else None
        verdict = "" if room is None else (
            f" pdsh's last task ran {room:.0f} ms after the floor's: the room dtrain has "
            f"here, against its {total:.0f} ms."
        )  # fmt: skip
        return [
            f"dtrain's last task ran {total:.0f} ms after the floor's: {'; '.join(parts)}."
            + verdict,
            "",
        ]

    def launch_tables(self) -> list[str]:
        out = ["## 1. Launch latency: launcher start → every task running", ""]
        out += [
            "From just before the launcher is spawned to the last task's own start stamp "
            "(each task writes `time.time()` as its first statement into a shared directory; "
            "hosts share this machine's clock, so nothing is polled while launchers start).",
            "",
        ]
        for mode in self.modes:
            out += [f"### {MODE_TEXT[mode]}", ""]
            header = ["hosts×tasks", *(LABELS[x] for x in ORDER), "dtrain ÷ ssh per task"]
            out += table(header, self.by_config(mode, "launch_s"))
        out += self.run_by_run_table()
        out += self.floor_table()
        out += self.steps_table()
        rows = []
        for mode in self.modes:
            found = [
                r for r in select(self.records, scenario="variant", bashrc=mode) if r.get("ok")
            ]
            ref = med(select(found, launcher="pdsh"), "launch_s")
            if found:
                rows.append(
                    [
                        mode,
                        *(
                            cell(med(select(found, launcher=x), "launch_s"), ref)
                            for x in ("dtrain", "dtrain-pathpy", "pdsh")
                        ),
                    ]
                )
        if rows:
            h, k = self.head
            out += [
                f"### The agent's python, measured ({h}×{k})",
                "",
                "The same launch with the default `--remote-python auto` (the hosts' system "
                "python3) and with `--remote-python python3` (whatever the login PATH finds "
                "first: pyenv's shim here), alternating with pdsh.",
                "",
                *table(["bashrc", "dtrain (default: auto)", LABELS["dtrain-pathpy"], "pdsh"], rows),
            ]
        return out

    def job_tables(self) -> list[str]:
        out = ["## 2. A trivial job end to end (every task exits 0 at once)", ""]
        out += [
            "Until the launcher and every process it started locally have exited (the dmlc "
            "tracker exits when its scheduler does; its remote ssh clients are waited for too).",
            "",
        ]
        for mode in self.modes:
            out += [f"### {MODE_TEXT[mode]}", ""]
            header = ["hosts×tasks", *(LABELS[x] for x in ORDER), "dtrain ÷ ssh per task"]
            out += table(header, self.by_config(mode, "e2e_s"))
        return out

    def teardown_tables(self) -> list[str]:
        out = [
            "## 3. Teardown: one task fails, time until every other task is gone",
            "",
            "The first task to start waits until all have started, records the time and exits 7; "
            "the others sleep silently. The harness then watches the others' pids (found by tag "
            f"through /proc, polled every 10 ms) for up to {self.bound_s:g} s. The exit code is "
            "the launcher's own; for a launcher that never stops the rest it is the one it "
            "reports once the harness makes the rest exit 0.",
            "",
        ]
        for mode in self.modes:
            rows = []
            for k in self.per_host:
                for h in self.host_counts:
                    cells = []
                    for x in ORDER:
                        found = select(
                            self.records,
                            scenario="teardown",
                            launcher=x,
                            bashrc=mode,
                            hosts=h,
                            per_host=k,
                        )
                        if not found:
                            cells.append("–")
                            continue
                        cells.append(f"{self.teardown_text(found)}, exit {self.exit_codes(found)}")
                    rows.append([f"{h}×{k}", *cells])
            out += [f"### {MODE_TEXT[mode]}", ""]
            out += table(["hosts×tasks", *(LABELS[x] for x in ORDER)], rows)
        return out

    def orphan_tables(self) -> list[str]:
        out = [
            "## 4. Orphans: task processes alive after the launcher is interrupted or killed",
            "",
            f"All {self.head[0] * self.head[1]} tasks sleep silently (a training step on a GPU "
            "writes nothing for minutes). SIGINT goes to the launcher's process group, as a "
            "terminal's Ctrl-C does; SIGKILL to the launcher alone, as `kill -9 PID` does. "
            f"Counted {self.window_s:g} s later. Leftovers are the launcher's own processes "
            'still running here then (ssh clients, shells, the launcher itself); "kept '
            "running\" means the launcher outlived the window (pdsh's first Ctrl-C only prints "
            "its status; bash keeps waiting for children that ignore SIGINT) and exited only "
            "once the harness stopped the tasks.",
            "",
        ]
        for mode in self.modes:
            rows = []
            for x in ORDER:
                cells = []
                for scenario in ("sigint", "sigkill"):
                    found = select(
                        self.records, scenario=scenario, launcher=x, bashrc=mode, group="all"
                    )
                    if not found:
                        cells += ["–", "–", "–"]
                        continue
                    r = found[0]
                    cells.append(self.orphan_text(found))
                    cells.append(str(r.get("local_leftovers", "–")))
                    if "launcher_exit_after_signal_s" in r:
                        cells.append(exit_text(r.get("exit_code")))
                    else:  # it outlived the window; it exited once the harness stopped the tasks
                        cells.append(f"kept running (then {exit_text(r.get('exit_code'))})")
                rows.append([LABELS[x], *cells])
            header = [
                "launcher",
                "SIGINT: alive",
                "leftovers",
                "exit",
                "SIGKILL: alive",
                "leftovers",
                "exit",
            ]
            out += [f"### {MODE_TEXT[mode]}", ""]
            out += table(header, rows)
        rows = []
        for k in self.per_host:
            for h in self.host_counts:
                cells = []
                for mode in self.modes:
                    for scenario in ("sigint", "sigkill"):
                        found = select(
                            self.records,
                            scenario=scenario,
                            launcher="dtrain",
                            bashrc=mode,
                            hosts=h,
                            per_host=k,
                            group="alone",
                        )
                        gone = [r.get("gone_s") for r in found]
                        if not found:
                            cells.append("–")
                        elif any(g is None for g in gone):
                            cells.append(f"never (> {self.window_s:g} s)")
                        else:
                            cells.append(
                                secs(statistics.median([float(g) for g in gone if g is not None]))
                            )
                rows.append([f"{h}×{k}", *cells])
        header = ["hosts×tasks"] + [f"{s} ({m})" for m in self.modes for s in ("SIGINT", "SIGKILL")]
        out += [
            "### dtrain alone: from the signal to no task left on any host",
            "",
            *table(header, rows),
        ]
        return out

    def log_tables(self) -> list[str]:
        s = self.meta.get("settings", {})
        out = [
            "## 5. Log throughput",
            "",
            f"Each host's tasks write {s.get('log_mb_per_host', '?')} MB of 100-byte lines to "
            "stdout between them (all of it on 1 task per host, a quarter each on 4), more than "
            "the relays buffer, so the stream is what is timed; each launcher's stdout is a "
            "file here. Wall time runs from the launcher's start until "
            "it and its children are gone, so it includes launch latency; throughput counts "
            "the bytes the tasks wrote over the time from the first task's start to the end "
            "(the goal is judged on it). The reference is the "
            "one-ssh-per-task launcher: `ssh host cmd >file`, one per task, in parallel. "
            "pdsh and dtrain add a prefix to every line (pdsh `host: `, dtrain `[task@host] `). "
            "After each run the harness deletes its stdout file and dtrain's task logs, so no "
            "run pays for the kernel writing an earlier run's hundreds of MB back to disk.",
            "",
        ]
        for mode in self.modes:
            rows = []
            configs = sorted(
                {
                    (r["hosts"], r["per_host"])
                    for r in select(self.records, scenario="log", bashrc=mode)
                }
            )
            for h, k in configs:
                ok = [
                    r
                    for r in select(self.records, scenario="log", bashrc=mode, hosts=h, per_host=k)
                    if r.get("ok")
                ]
                raw = med(select(ok, launcher="ssh"), "e2e_s")
                cells = [cell(med(select(ok, launcher=x), "e2e_s"), raw) for x in ORDER]
                rows.append([f"{h}×{k}", *cells, " / ".join(self.log_cells(mode, h, k))])
            if rows:
                out += [f"### {MODE_TEXT[mode]} (wall time, × raw ssh)", ""]
                header = ["hosts×tasks", *(LABELS[x] for x in ORDER), "throughput (× raw ssh)"]
                out += table(header, rows)
        split = [
            [MODE_TEXT[mode], f"{h}×{k}", f"{one:.0f} MB/s", f"{two:.0f} MB/s", f"×{two / one:.2f}"]
            for mode in self.modes
            for h, k, one, two in self.split_rates(mode)
        ]
        if split:
            out += [
                "### The same streams through two dtrain launchers",
                "",
                "Every shape with more than one host also ran as two dtrain launchers started "
                "together, each with half the hosts (`split_log`, `bench/scenarios.py`): two "
                "interpreters relay what one relays otherwise, and the rate is counted the same "
                "way, from the first task's start to the last launcher's end. Where one "
                "interpreter's lock holds the relay back, two relay faster.",
                "",
            ]
            out += table(["remote bashrc", "hosts×tasks", "one launcher", "two launchers",
                          "two / one"], split)  # fmt: skip
        return out

    def resource_tables(self) -> list[str]:
        out = [
            "## 6. Launcher CPU time and peak RSS (trivial job)",
            "",
            "CPU is user+system of the launcher and every child it reaped; RSS the launcher "
            "process's own peak (VmHWM); the footprint table below adds its helpers. "
            '"Hosts" is the CPU the run cost the hosts (sshd, login shells, agents, tasks: the '
            "growth of each host's PID 1 child CPU).",
            "",
        ]
        rows = []
        for mode in self.modes[:1]:
            for x in ORDER:
                found = select(
                    self.records, scenario="sigint", launcher=x, bashrc=mode, group="all"
                )
                fp = found[0].get("footprint") if found else None
                if fp:
                    rows.append(
                        [
                            LABELS[x],
                            f"{fp['processes']:.0f}",
                            f"{fp['threads']:.0f}",
                            f"{fp['fds']:.0f}",
                            mb(fp["rss_mb"]),
                        ]
                    )
        if rows:
            h, k = self.head
            out += [
                f"### Footprint here while {h}×{k} tasks run (the launcher and its helpers)",
                "",
                *table(["launcher", "processes", "threads", "open fds", "RSS (sum)"], rows),
            ]
        for mode in self.modes:
            out += [f"### {MODE_TEXT[mode]}", ""]
            rows = []
            for k in self.per_host:
                for h in self.host_counts:
                    ref_cpu = self.launch("pdsh", mode, h, k, "cpu_s")
                    ref_rss = self.launch("pdsh", mode, h, k, "rss_mb")
                    ref_remote = self.launch("pdsh", mode, h, k, "remote_cpu_s")
                    cells = []
                    for x in ORDER:
                        remote = self.launch(x, mode, h, k, "remote_cpu_s")
                        cells.append(
                            f"{cell(self.launch(x, mode, h, k, 'cpu_s'), ref_cpu, cpu)}; "
                            f"{cell(self.launch(x, mode, h, k, 'rss_mb'), ref_rss, mb)}; "
                            f"hosts {cell(remote, ref_remote, cpu)}"
                        )
                    rows.append([f"{h}×{k}", *cells])
            header = ["hosts×tasks", *(f"{LABELS[x]}: CPU; RSS; hosts" for x in ORDER)]
            out += table(header, rows)
        return out

    def doctor_section(self) -> list[str]:
        found = select(self.records, scenario="doctor")
        out = ["## 7. `dtrain doctor` wall time against host count", ""]
        if not found:
            return [*out, "Not measured in this run (`--phases` left it out).", ""]
        if not any(r.get("available") for r in found):
            return [
                *out,
                "Not measured: `dtrain doctor --help` did not work when this run started. "
                "The hook is `phase_doctor` in bench/run.py; it measures "
                "`dtrain doctor -H HOSTS --ssh-config CONFIG` as soon as the command exists.",
                "",
            ]
        rows = []
        for mode in self.modes:
            for h in self.host_counts:
                rs = select(found, bashrc=mode, hosts=h, available=True)
                if rs:
                    codes = sorted({r.get("exit_code") for r in rs}, key=str)
                    fails = [  # doctor's findings, not a table row that holds a FAIL
                        line.strip()
                        for r in rs
                        for line in (r.get("stderr_tail") or "").splitlines()
                        if line.strip().startswith("FAIL ")
                    ]
                    why = f"`{fails[0][:120]}`" if fails else ""
                    cpu_here, cpu_hosts = med(rs, "cpu_s"), med(rs, "remote_cpu_s")
                    rows.append(
                        [
                            mode,
                            str(h),
                            secs(med(rs, "wall_s")),
                            secs(cpu_here) if cpu_here is not None else "-",
                            secs(cpu_hosts) if cpu_hosts is not None else "-",
                            ", ".join(map(str, codes)),
                            why,
                        ]
                    )
        header = ["bashrc", "hosts", "wall", "launcher CPU", "CPU on the hosts", "exit code"]
        return [
            *out,
            "`dtrain doctor -H HOSTS --ssh-config CONFIG` with no command (it checks python3), "
            "from start to exit. It checks TCP between every pair of hosts, so part of its work "
            "grows with the square of the host count. Launcher CPU is doctor's own and its "
            "children's; CPU on the hosts is every host's sshd tree (the login shells, the "
            "agents, the probes), all of it on this machine's cores.",
            "",
            *table([*header, "first FAIL line"], rows),
        ]

    def bashrc_section(self) -> list[str]:
        if len(self.modes) < 2:
            return []
        out = [
            "## What the remote `~/.bashrc` costs",
            "",
            "Debian's bash reads `~/.bashrc` even for `ssh host cmd`; this one runs "
            "`pyenv init` and `pyenv virtualenv-init`. Every remote login shell pays it: pdsh "
            "one per host, one-ssh-per-task and the dmlc tracker one per task, dtrain one per "
            "host (its agent's shell); dtrain's agent then runs under the system python3, not "
            "the pyenv shim the login PATH finds first.",
            "",
        ]
        cal = {
            m: next(iter(select(self.records, scenario="calibration", bashrc=m)), None)
            for m in self.modes
        }
        if all(cal.values()):
            a, b = cal["as-is"], cal["blank"]
            assert a is not None and b is not None
            out += table(
                ["one remote command, measured alone", "bashrc as-is", "blanked", "cost"],
                [
                    [
                        "`true` on an open connection (login shell only)",
                        secs(a["exec_true_s"]),
                        secs(b["exec_true_s"]),
                        secs(a["exec_true_s"] - b["exec_true_s"]),
                    ],
                    [
                        "dtrain's agent: boot and first answer",
                        secs(a["agent_s"]),
                        secs(b["agent_s"]),
                        secs(a["agent_s"] - b["agent_s"]),
                    ],
                    [
                        "OpenSSH `ssh host true`, fresh connection",
                        secs(a["openssh_true_s"]),
                        secs(b["openssh_true_s"]),
                        secs(a["openssh_true_s"] - b["openssh_true_s"]),
                    ],
                ],
            )
        h, k = self.head
        rows = []
        for x in ORDER:
            da = self.launch(x, "as-is", h, k, "launch_s")
            db = self.launch(x, "blank", h, k, "launch_s")
            ra = self.launch(x, "as-is", h, k, "remote_cpu_s")
            rb = self.launch(x, "blank", h, k, "remote_cpu_s")
            rows.append(
                [
                    LABELS[x],
                    secs(da),
                    secs(db),
                    secs(da - db) if da is not None and db is not None else "–",
                    cpu(ra - rb) if ra is not None and rb is not None else "–",
                ]
            )
        out += table(
            [f"launch at {h}×{k}", "as-is", "blanked", "bashrc adds", "host CPU it adds"], rows
        )
        return out

    def where_time_goes(self) -> list[str]:
        out = ["## Where dtrain's launch time goes", ""]
        for mode in self.modes:
            timeline = next(iter(select(self.records, scenario="timeline", bashrc=mode)), None)
            if not timeline or "phases" not in timeline:
                continue
            started = timeline.get("python_started_s", 0.0)
            rows = [
                ["interpreter start (before the first Python statement)", secs(0.0), secs(started)]
            ]
            spans: dict[str, tuple[float, float]] = {}  # a step run once per host: one row
            for e in timeline["phases"]:
                begin, end = spans.get(e["phase"], (e["start_s"], e["end_s"]))
                spans[e["phase"]] = (min(begin, e["start_s"]), max(end, e["end_s"]))
            for name, (begin, end) in sorted(spans.items(), key=lambda item: item[1][0]):
                rows.append([name, secs(started + begin), secs(end - begin)])
            rows.append(["last task's start stamp", secs(timeline.get("launch_s")), ""])
            out += [
                f"### Timeline of one launch at {timeline['hosts']}×{timeline['per_host']}, "
                f"{MODE_TEXT[mode]}",
                "",
                "bench/timeline.py runs the ordinary `dtrain launch` with each step wrapped by a "
                "timer (nested steps overlap: the requests run inside the steps that send them).",
                "",
                *table(["step", "starts at", "takes"], rows),
            ]
        for mode in self.modes:
            prof = self.launch_profile(mode)
            if not prof or "profile" not in prof:
                continue
            p = prof["profile"]
            keep = [
                (f, s)
                for f, s in p["inclusive"]
                if "importlib" not in f and not f.startswith(("Thread.", "<module> (dtrain)"))
            ][:12]
            out += [
                f"### py-spy, one launch at {prof['hosts']}×{prof['per_host']}, {MODE_TEXT[mode]}",
                "",
                f"{p['active_s']:.2f} s of active thread time sampled at {p['rate']} Hz over all "
                "threads (idle waits excluded). Inclusive time per function:",
                "",
                *table(["function", "active s"], [[f"`{f}`", f"{s:.3f}"] for f, s in keep]),
                "Most time on the launcher's own CPU, by the function it was in (self time):",
                "",
                *table(
                    ["function", "active s"], [[f"`{f}`", f"{s:.3f}"] for f, s in p["self"][:10]]
                ),
            ]
        return out

    def extra_figures(self) -> list[str]:
        out = ["## Other figures", ""]
        local = select(self.records, scenario="local-overhead")
        if local:
            bare = med(select(local, launcher="bare"), "wall_s")
            rows = []
            shown = {
                "bare": "`/usr/bin/python3 -S -c pass` (the bare command)",
                "venv python": "the venv's `python -c pass` (interpreter and site)",
                "import dtrain.cli": "`python -c 'import dtrain.cli'` (what `dtrain` imports)",
                "import dtrain.launch.lifecycle": (
                    "`python -c 'import click, dtrain.launch.lifecycle'` (what launch needs)"
                ),
                "import paramiko": "`python -c 'import paramiko'` (remote jobs only)",
                "dtrain --version": "`dtrain --version`",
                "dtrain launch": "`dtrain launch -n 1 -s 0 --framework torch -- <bare command>`",
                AGENT: (
                    "dtrain's agent as a host starts it (its `sh -c` command, its code on stdin "
                    "and compiled from the cache), out at the end of its stream"
                ),
                AGENT_C_ONLY: (
                    "`/usr/bin/python3 -S` importing the modules the agent imports (`_json`, "
                    "`_signal`, `_socket`, `select`, ...), without the agent's own code"
                ),
            }
            for name, text in shown.items():
                rs = select(local, launcher=name)
                if rs:
                    rows.append(
                        [
                            text,
                            secs(med(rs, "wall_s")),
                            cpu(med(rs, "cpu_s")),
                            mb(med(rs, "rss_mb")),
                        ]
                    )
            launch = med(select(local, launcher="dtrain launch"), "wall_s")
            overhead = launch - bare if launch is not None and bare is not None else None
            out += [
                "### dtrain's own overhead on a trivial local job",
                "",
                "`dtrain launch -n 1 -s 0 --framework torch -- /usr/bin/python3 -S -c pass` "
                f"against the same command run bare: dtrain adds **{secs(overhead)}** "
                "(interpreter, imports, one local agent, its supervision).",
                "",
                *table(["command", "wall", "CPU", "peak RSS"], rows),
            ]
        rows = []
        for k in (2, 4):
            rs = select(self.records, scenario="teardown", launcher="dtrain-local", per_host=k)
            if rs:
                rows.append(
                    [f"this machine, {k} tasks", self.teardown_text(rs), self.exit_codes(rs)]
                )
        for mode in self.modes:
            for k in self.per_host:
                for h in self.host_counts:
                    rs = select(
                        self.records,
                        scenario="teardown",
                        launcher="dtrain",
                        bashrc=mode,
                        hosts=h,
                        per_host=k,
                    )
                    if rs:
                        rows.append(
                            [
                                f"cluster {h}×{k} ({mode})",
                                self.teardown_text(rs),
                                self.exit_codes(rs),
                            ]
                        )
        if rows:
            out += [
                "### From a task's failure to every task gone",
                "",
                *table(["where", "median", "dtrain exit code"], rows),
            ]
        return out

    def scale_measured(self) -> list[str]:
        """dtrain, pdsh and ssh per task at the scale sizes, side by side."""
        found = self.scale_records
        if not found:
            return []
        out = [
            "## 8. Measured at scale: up to "
            f"{max(r['hosts'] for r in found)} hosts × {max(r['per_host'] for r in found)} tasks",
            "",
            "The trivial job, teardown after one failure and orphans 5 s after SIGKILL to the "
            "launcher, on a cluster of that many namespaced sshd hosts (all on this machine's "
            "cores). pdsh runs with `-f` at least the host count, so it does not window. "
            "Launch and CPU are medians; ratios are to pdsh in the same run.",
            "",
        ]
        launchers = [x for x in ("dtrain", "pdsh", "ssh") if select(found, launcher=x)]
        for mode in [m for m in ("as-is", "blank") if select(found, bashrc=m)]:
            rows = []
            for h, k in sorted({(r["hosts"], r["per_host"]) for r in found}):
                at = select(found, bashrc=mode, hosts=h, per_host=k)
                ok = [r for r in select(at, scenario="trivial") if r.get("ok")]
                ref = {key: med(select(ok, launcher="pdsh"), key) for key in FIELDS_AT_SCALE}
                for x in launchers:
                    mine = select(ok, launcher=x)
                    launch, host_cpu = med(mine, "launch_s"), med(mine, "remote_cpu_s")
                    cpu_s, rss = med(mine, "cpu_s"), med(mine, "rss_mb")
                    kill = select(at, scenario="sigkill", launcher=x)
                    rows.append(
                        [
                            f"{h}×{k}",
                            LABELS[x],
                            cell(launch, ref["launch_s"]),
                            self.teardown_text(select(at, scenario="teardown", launcher=x)),
                            self.orphan_text(kill),
                            cell(cpu_s, ref["cpu_s"], cpu),
                            "–" if cpu_s is None else f"{cpu_s / h * 1000:.1f} ms",
                            cell(rss, ref["rss_mb"], mb),
                            cell(host_cpu, ref["remote_cpu_s"], cpu),
                        ]
                    )
            out += [f"### {MODE_TEXT[mode]}", ""]
            out += table(
                [
                    "hosts×tasks",
                    "launcher",
                    "launch",
                    "teardown after a failure",
                    "alive after SIGKILL",
                    "launcher CPU",
                    "launcher CPU per host",
                    "launcher peak RSS",
                    "CPU on the hosts",
                ],
                rows,
            )
        return out

    def scale_section(self) -> list[str]:
        out = ["## Scale past this machine", ""]
        mode = "blank" if "blank" in self.modes else (self.modes[0] if self.modes else "as-is")
        fitted = model.calibrate(self.records + self.scale_records, mode)
        if fitted is None:
            return [*out, "Not modelled: this run has no calibration or trivial-job records.", ""]
        c: model.Costs = fitted["costs"]
        cal = fitted["calibration"]
        out += [
            "How dtrain fans out (dtrain/transport/ssh.py, dtrain/launch/lifecycle.py, "
            "dtrain/agents/session.py): one "
            "paramiko connection per host, opened by a pool of `MAX_PARALLEL_CONNECTS` = "
            f"{model.DTRAIN_POOL_WIDTH} threads, each of which opens that host's agent channel "
            "and sends the agent as soon as its connection is up; every request (hello, launch, "
            "start) goes to all hosts "
            "at once from one thread per host, and waits for all of them. While the job runs, "
            "each host holds one TCP socket, one paramiko transport thread and one reader "
            "thread in the launcher, and each task one open log file. On the hosts, dtrain "
            "needs one connection and one session each: far below sshd's `MaxStartups` "
            "(10:30:100, unauthenticated connections per server) and `MaxSessions` (10 channels "
            "per connection), which one-ssh-per-task launchers hit at about 10 tasks per host.",
            "",
            f"### Per-connection costs (calibration, {MODE_TEXT[mode]}), dtrain's own code path",
            "",
        ]
        rows = []
        names = [
            ("connect", "connect + auth (TCP_NODELAY socket)"),
            ("channel", "first channel on a fresh connection"),
            ("channel_again", "a second channel"),
            ("exec_true", "exec `true` (remote login shell)"),
            ("agent", "agent: exec channel, payload, boot, first answer"),
        ]
        for key, text in names:
            if f"{key}_s" in cal:
                tuned = cal.get(f"{key}_tuned_s")
                rows.append(
                    [
                        text,
                        secs(cal[f"{key}_s"]),
                        f"{cal[f'{key}_cpu_s'] * 1000:.1f} ms",
                        secs(tuned) if tuned is not None else "–",
                    ]
                )
        rows.append(
            [
                "OpenSSH `ssh host true`, fresh (for reference)",
                secs(cal.get("openssh_true_s")),
                "–",
                "–",
            ]
        )
        out += table(
            ["step", "wall", "launcher CPU", "channel after 0.1 s idle; agent under /usr/bin"],
            rows,
        )
        par = cal.get("parallel_connect", {})
        if par:
            out += table(
                ["hosts connected at once (pool of 32)", "wall", "launcher CPU"],
                [
                    [n, secs(v["wall_s"]), cpu(v["cpu_s"])]
                    for n, v in sorted(par.items(), key=lambda kv: int(kv[0]))
                ],
            )
        b = fitted["cpu_fits"]
        rows = []
        for x in ORDER:
            f = b[x]
            rows.append(
                [
                    LABELS[x],
                    f"{f[0]:.3f} s",
                    f"{f[1] * 1000:.1f} ms",
                    f"{f[2] * 1000:.1f} ms",
                    cpu(model.predict(f, 256, 1024)),
                    cpu(model.predict(f, 1024, 4096)),
                ]
            )
        out += [
            "### Launcher CPU per host and per task (least-squares fit over the trivial runs)",
            "",
            *table(["launcher", "fixed", "per host", "per task", "at 256×4", "at 1024×4"], rows),
            "On a real cluster the hosts' work runs on the hosts; what a launcher machine pays "
            "grows with these slopes. pdsh's and ssh-per-task's cost is mostly the OpenSSH "
            "client's key exchange, once per host for pdsh and once per task for the others.",
            "",
        ]
        sim_rows = []
        for key, value in fitted["measured"].items():
            h, k = (int(x) for x in key.split("x"))
            sim_rows.append([f"{h}×{k}", secs(value), secs(model.simulate(h, k, c))])
        out += [
            "### The simulation against what this machine measured",
            "",
            "Calibrated as described in bench/model.py: the launcher as one CPU (the GIL), each "
            f"host's own work in parallel. Here all {self.head[0]} hosts share this machine's "
            "cores with the launcher, so the measured times grow faster than the model's.",
            "",
            *table(["dtrain hosts×tasks", "measured here", "simulated"], sim_rows),
        ]
        rows = []
        for h in (8, 16, 32, 48, 64, 128, 256, 1024):
            for k in (4, 8):
                rows.append(
                    [
                        f"{h}×{k}",
                        secs(model.simulate(h, k, c)),
                        secs(model.simulate(h, k, c, width=max(h, 1))),
                        str(model.waves(h)),
                        f"{model.predict(fitted['thread_fit'], h, h * k):.0f}",
                        f"{model.predict(fitted['fd_fit'], h, h * k):.0f}",
                        mb(model.predict(fitted["rss_fit"], h, h * k)),
                    ]
                )
        out += [
            "### dtrain at 256 and 1024 hosts",
            "",
            *table(
                [
                    "hosts×tasks",
                    "launch (pool 32)",
                    "launch (pool = hosts)",
                    "connect waves",
                    "threads",
                    "open fds",
                    "RSS",
                ],
                rows,
            ),
            self.scale_text(fitted),
            "",
            *self.peers_at_scale(fitted),
        ]
        return out

    def peers_at_scale(self, fitted: dict[str, Any]) -> list[str]:
        """What the peers would do at 256 hosts, from this run's fits and footprints."""
        fits = fitted["cpu_fits"]
        per_client = None
        found = select(self.records, scenario="sigint", launcher="ssh", group="all")
        fp = found[0].get("footprint") if found else None
        if fp and fp["processes"] > 1:
            per_client = fp["rss_mb"] / fp["processes"]
        cores = self.meta.get("machine", {}).get("cores") or 2
        pdsh_cpu = model.predict(fits["pdsh"], 256, 1024)
        ssh_cpu = model.predict(fits["ssh"], 256, 1024)
        memory = f"≈ {per_client * 1024 / 1024:.1f} GB" if per_client else "several GB"
        return [
            "### The peers at 256 hosts",
            "",
            f"- **pdsh** runs one OpenSSH client per host: ≈ {pdsh_cpu:.0f} s of client CPU "
            f"at 256 hosts by this run's fit (≈ {pdsh_cpu / cores:.0f} s on {cores} cores), "
            "mostly key exchange. Its default fan-out `-f 32` is a trap for training jobs: it "
            "keeps 32 commands running at a time, and a training command does not return, so "
            "hosts 33 and up never start (DeepSpeed passes `-f 1024`; this harness passes "
            "`-f max(32, hosts)`).",
            f"- **One ssh per task** at 256×4 is 1024 OpenSSH clients here ({memory} of RSS, "
            f"≈ {ssh_cpu:.0f} s of CPU by the fit) and 4 simultaneous unauthenticated "
            "connections per host; at about 10 tasks per host (8 GPUs plus servers) it crosses "
            "sshd's default `MaxStartups 10:30:100`, and sshd starts dropping connections "
            '("Connection reset by peer" / banner errors) unless the launcher retries.',
            "- **The dmlc tracker** does the same with a Python thread and a shell per task, "
            "plus its local scheduler.",
            "",
        ]

    def scale_text(self, fitted: dict[str, Any]) -> str:
        fd = fitted["fd_fit"]
        c: model.Costs = fitted["costs"]
        fds_256 = model.predict(fd, 256, 1024)
        threads_256 = model.predict(fitted["thread_fit"], 256, 1024)
        per_host_cpu = c.connect.cpu_s + c.channel.cpu_s + c.agent.cpu_s + c.start.cpu_s
        pooled = model.simulate(256, 4, c)
        unbounded = model.simulate(256, 4, c, width=256)
        pool_text = (
            "and the pool's width hardly matters: the launcher's CPU is the bottleneck"
            if pooled - unbounded < 0.1 * pooled
            else f"and the pool's {model.waves(256)} waves cost {secs(pooled - unbounded)}"
        )
        return (
            f"What grows: launcher CPU ≈ {per_host_cpu * 1000:.0f} ms per host and "
            f"{c.task_cpu_s * 1000:.1f} ms per task, serialized on one core by the GIL, so "
            f"256 hosts cost ≈ {256 * per_host_cpu + 1024 * c.task_cpu_s:.1f} s of it "
            f"({pool_text}). "
            f"Threads ≈ {threads_256:.0f} (two per host for the whole job: paramiko's "
            "transport and the agent session's reader; a round's requests all go from one "
            "thread) and open files ≈ "
            f"{fds_256:.0f} at 256×4 (one socket per host, one log file per task): above the "
            "common default soft limit of 1024 (`ulimit -n`), so dtrain raises its soft limit "
            "to the hard limit at start (`dtrain/transport/bootstrap.py`, `raise_open_file_limit`)."
        )

    def method(self) -> list[str]:
        s = self.meta.get("settings", {})
        return [
            "## Method",
            "",
            "- Cluster: `tests/cluster/netcluster.py`, one sshd per host as PID 1 of its own "
            "namespaces on 198.18.0.0/24, on this machine; started and stopped by the harness in "
            "short sessions (released in between so other users of the cluster lock get in).",
            "- Task: `/usr/bin/python3 -S bench/task.py` for every launcher (absolute path, so "
            "no launcher pays a pyenv shim for the task itself). It records its start time, "
            "then exits, sleeps, fails or writes its log lines.",
            "- dtrain: `dtrain launch --framework torch -n N --nproc-per-host K -H HOSTS "
            "--ssh-config CONFIG -- TASK` (collective mode: K ranks per host, nothing local).",
            '- pdsh: `pdsh -S -R ssh -f max(32,hosts) -w h1,...` with `PDSH_SSH_ARGS="-F CONFIG '
            '-x -a -l%u %h"`; for K > 1 one remote bash starts the K tasks and waits for them.',
            "- One ssh per task: a bash script with one `ssh -F CONFIG -n host TASK &` per task "
            "(placed round robin), then `wait` for each; its exit code is the first non-zero one.",
            "- dmlc tracker: the mxnet wheel's `tools/launch.py -n N-1 -s 1 --launcher ssh -H "
            "HOSTS TASK` run by bench/tracker_shim.py, which only adds `Thread.isAlive`; its bare "
            '`ssh` is an `exec ssh -F CONFIG "$@"` wrapper first in PATH. It places servers '
            "then workers round robin (K per host) and runs a scheduler here, which waits for "
            "the remote tasks to finish, as ps-lite's does.",
            f"- Repetitions: trivial job {s.get('reps')}{small_reps_text(s)}, teardown "
            f"{s.get('teardown_reps')} (peers once per host count: they never stop anything), "
            f"doctor {s.get('doctor_reps')}, log {s.get('log_reps')}, signals once for every "
            "launcher together at the headline size plus "
            f"{s.get('signal_reps')} for dtrain alone at every size.",
            "- Every run ends with a verified clean slate: leftover tasks found by tag and "
            "stopped, the launcher's process group killed, and the hosts checked for nothing but "
            "their sshd before the next run.",
            "",
        ]


# ---- the plot --------------------------------------------------------------------------------


def plot(report: Report, path: Path) -> None:
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    colors = {"dtrain": "#d62728", "pdsh": "#1f77b4", "ssh": "#2ca02c", "tracker": "#9467bd"}
    fig, (left, right) = plt.subplots(1, 2, figsize=(12, 4.8))
    k = max(report.per_host)
    hosts = report.host_counts
    for mode, style in (("as-is", "-"), ("blank", "--")):
        if mode not in report.modes:
            continue
        for x in ORDER:
            ys = [report.launch(x, mode, h, k, "launch_s") for h in hosts]
            pts = [(h, y) for h, y in zip(hosts, ys, strict=True) if y is not None]
            if pts:
                left.plot(
                    [p[0] for p in pts],
                    [p[1] for p in pts],
                    style,
                    marker="o",
                    color=colors[x],
                    label=f"{LABELS[x]} ({mode})",
                )
    left.set_title(
        f"Launch latency, {k} tasks per host\n(solid: remote bashrc as-is; dashed: blanked)"
    )
    left.set_xlabel("hosts")
    left.set_ylabel("start → every task running (s)")
    left.set_xscale("log", base=2)
    left.set_xticks(hosts, [str(h) for h in hosts])
    left.grid(alpha=0.3)
    left.legend(fontsize=7, ncol=2)
    bound = report.bound_s
    for kk, marker in zip(report.per_host, ("o", "s"), strict=False):
        pts = []
        for h in hosts:
            rs = [
                r
                for r in select(
                    report.records, scenario="teardown", launcher="dtrain", hosts=h, per_host=kk
                )
                if r.get("teardown_s") is not None
            ]
            if rs:
                pts.append((h, statistics.median(r["teardown_s"] for r in rs)))
        if pts:
            right.plot(
                [p[0] for p in pts],
                [p[1] for p in pts],
                "-",
                marker=marker,
                color=colors["dtrain"],
                label=f"dtrain, {kk} task{'s' if kk > 1 else ''}/host",
            )
    for offset, x in enumerate(PEERS):
        never = [
            h
            for h in hosts
            if any(
                r.get("teardown_s", 0) is None
                for r in select(report.records, scenario="teardown", launcher=x, hosts=h)
            )
        ]
        if never:
            shifted = [h * (1 + 0.04 * (offset - 1)) for h in never]
            right.scatter(
                shifted,
                [bound] * len(never),
                marker="^",
                color=colors[x],
                label=f"{LABELS[x]}: never (> {bound:g} s)",
            )
    right.axhline(1.0, color="grey", linestyle=":", linewidth=1)
    right.text(hosts[0], 1.08, "goal: 1 s", fontsize=7, color="grey")
    right.set_yscale("log")
    right.set_ylim(0.005, bound * 2)
    right.set_title("Teardown: one task fails → every other task gone")
    right.set_xlabel("hosts")
    right.set_ylabel("seconds (log scale)")
    right.set_xscale("log", base=2)
    right.set_xticks(hosts, [str(h) for h in hosts])
    right.grid(alpha=0.3, which="both")
    right.legend(fontsize=7, loc="center right")
    fig.tight_layout()
    fig.savefig(path, dpi=110)
    plt.close(fig)


def write(folder: Path, doc: Path) -> None:
    records, meta = load(folder)
    report = Report(records, meta)
    doc.parent.mkdir(parents=True, exist_ok=True)
    doc.write_text(report.render())
    plot(report, doc.with_suffix(".png"))
