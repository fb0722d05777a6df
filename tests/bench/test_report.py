"""The benchmark's page from one run's records: tables and the guard rails' verdicts."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

from bench import report


def records(launch_8: float, relay: float) -> list[dict[str, Any]]:
    """Six repetitions of everything; dtrain's launch at 8 hosts and its relay rate as given."""
    out: list[dict[str, Any]] = []
    for rep in range(6):
        for name, at_1, at_8, rate in (
            ("dtrain", 0.40, launch_8, relay),
            ("before", 0.40, 0.90, 100.0),
            ("pdsh", 0.30, 1.00, 0.0),
            ("ssh", 0.35, 3.00, 100.0),
        ):
            base = {"launcher": name, "rep": rep, "ok": True, "per_host": 4, "tasks": 32}
            out.append({**base, "scenario": "trivial", "hosts": 1, "launch_s": at_1})
            out.append({**base, "scenario": "trivial", "hosts": 8, "launch_s": at_8})
            if rate:
                out.append({**base, "scenario": "log", "hosts": 8, "mb_per_s": rate})
            if name in ("dtrain", "before"):
                out.append({**base, "scenario": "teardown", "hosts": 8, "teardown_s": 0.07,
                            "exit_code": 7})  # fmt: skip
    for name in ("dtrain", "before"):
        for scenario, code in (("sigint", 130), ("sigkill", -9)):
            out.append({"scenario": scenario, "launcher": name, "hosts": 48, "per_host": 4,
                        "tasks": 192, "tasks_left": 0, "left_on_hosts": 0, "exit_code": code,
                        "gone_s": 0.3, "ok": True})  # fmt: skip
    return out


def page(tmp_path: Path, found: list[dict[str, Any]]) -> str:
    (tmp_path / "records.jsonl").write_text("".join(json.dumps(r) + "\n" for r in found))
    meta = {"argv": ["--before", "T"], "runtime_s": 600}
    meta["settings"] = {"engine_cap_s": 10, "log_mb_per_host": 40.0}
    meta["versions"] = {"commit": "abc", "openssh": "ssh", "pdsh": "pdsh", "python": "3.11"}
    (tmp_path / "meta.json").write_text(json.dumps(meta))
    report.write(tmp_path, tmp_path / "doc.md")
    return (tmp_path / "doc.md").read_text()


def rail(text: str, starts: str) -> str:
    return next(line for line in text.splitlines() if line.startswith(f"| {starts}"))


def test_rails_hold_for_both_trees_within_their_bounds(tmp_path: Path) -> None:
    text = page(tmp_path, records(launch_8=0.95, relay=60.0))
    for title in ("launch", "log relay", "teardown"):
        assert rail(text, title).count("held:") == 2, rail(text, title)
    assert "1x4 x1.33, 8x4 x0.95" in rail(text, "launch")  # 1.5 allowed below 8 hosts
    assert "| 8x4 | 6 | 950 ms | 900 ms | 1.00 s | 3.00 s | x0.95" in text


def test_a_launch_behind_pdsh_from_8_hosts_and_a_slow_relay_are_missed(tmp_path: Path) -> None:
    text = page(tmp_path, records(launch_8=1.10, relay=40.0))
    assert "**missed**: 1x4 x1.33, 8x4 x1.10 (missed)" in rail(text, "launch")
    assert "**missed**: 8x4 x0.40 (missed)" in rail(text, "log relay")
    assert rail(text, "launch").count("held:") == 1  # before still holds


def test_a_leftover_after_a_signal_misses_the_clean_rail(tmp_path: Path) -> None:
    found = records(launch_8=0.95, relay=60.0)
    next(r for r in found if r["scenario"] == "sigkill")["left_on_hosts"] = 1
    text = page(tmp_path, found)
    assert "**missed**" in rail(text, "teardown")
    assert "SIGKILL at 48x4: 0 tasks and 1 processes left" in rail(text, "teardown")


def test_an_engine_peer_that_never_stops_and_a_restart_are_tabled(tmp_path: Path) -> None:
    found = records(launch_8=0.95, relay=60.0)
    for rep in range(6):
        base = {"scenario": "slurm", "rep": rep, "hosts": 4, "per_host": 4, "ok": True}
        for name, launch, wall in (("dtrain", 0.5, 0.6), ("srun", 0.25, 0.4)):
            found.append({**base, "launcher": name, "mode": "stamp", "exit": 0,
                          "launch_s": launch, "wall_s": wall})  # fmt: skip
        for name, code, teardown, alive in (("dtrain", 7, 0.1, 0), ("srun", None, None, 15)):
            found.append({**base, "launcher": name, "mode": "fail", "exit": code,
                          "teardown_s": teardown, "alive_at_exit": alive})  # fmt: skip
        for way, gap in (("restart", 0.1), ("by hand", 1.2)):
            found.append({"scenario": "restart", "launcher": way, "rep": rep, "hosts": 8,
                          "per_host": 1, "ok": True, "gap_s": gap})  # fmt: skip
    text = page(tmp_path, found)
    assert "| dtrain | 6 | 500 ms | 600 ms | 100 ms | 7 | 0 |" in text
    assert "| srun | 6 | 250 ms | 400 ms | never | none | 15 |" in text
    assert "dtrain ÷ srun, last task started: x2.00 (x2.00-x2.00)" in text
    assert "| 8 | 6 | 100 ms | 1.20 s | x12.00 (x12.00-x12.00) |" in text
    assert (tmp_path / "doc.png").stat().st_size > 0  # the plot beside the page
