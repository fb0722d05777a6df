"""What `dtrain doctor` prints: hosts x checks, then each finding with its evidence. Pure."""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dtrain.doctor.judge import CheckResult, DoctorReport, Status
from dtrain.errors import group_hint, group_line
from dtrain.render import table

CELL_TEXT = {Status.PASS: "PASS", Status.WARN: "WARN", Status.FAIL: "FAIL", Status.SKIP: "-"}


def doctor_text(report: DoctorReport) -> str:
    """Hosts x checks at a glance, then each FAIL and WARN with its evidence and fix."""
    header = ("HOST", *report.checks)
    rows: list[tuple[str, ...]] = [header]
    found = {(r.check, r.host): r for r in report.results}  # one pass: thousands of hosts
    for host in report.hosts:
        cells = []
        for check in report.checks:
            result = found.get((check, host.name))
            cells.append(CELL_TEXT[result.status] if result else "-")
        rows.append((f"{host.name} (here)" if host.is_local else host.name, *cells))
    lines = table([(*row, "") for row in rows])
    findings = [*report.failures, *report.warnings]
    if findings:
        lines.append("")
    for group in _same_failures(sorted(findings, key=_finding_order(report))):
        lines += doctor_finding_lines(group[0]) if len(group) == 1 else _finding_group_lines(group)
    lines.append("")
    lines.append(doctor_summary(report))
    return "\n".join(lines) + "\n"


def _finding_order(report: DoctorReport) -> Callable[[CheckResult], tuple[int, int, int]]:
    hosts = {h.name: index for index, h in enumerate(report.hosts)}
    checks = {check: index for index, check in enumerate(report.checks)}

    def key(result: CheckResult) -> tuple[int, int, int]:
        return (
            result.status is not Status.FAIL,
            hosts.get(result.host, len(hosts)),
            checks.get(result.check, 0),
        )

    return key


def _same_failures(results: Sequence[CheckResult]) -> list[list[CheckResult]]:
    """Findings of one check failing for one reason on several hosts, together, in order."""
    groups: dict[object, list[CheckResult]] = {}
    for index, result in enumerate(results):
        problem = result.problem
        key: object = index
        if problem is not None and problem.reason is not None:
            key = (result.status, result.check, problem.code, problem.reason)
        groups.setdefault(key, []).append(result)
    return list(groups.values())


def _finding_group_lines(group: Sequence[CheckResult]) -> list[str]:
    problems = [r.problem for r in group if r.problem is not None]
    first = group[0]
    lines = [f"{CELL_TEXT[first.status]} {first.check}: {group_line(problems)}"]
    hint = group_hint(problems)
    if hint:
        lines.append(f"  hint: {hint}")
    return lines


def doctor_finding_lines(result: CheckResult) -> list[str]:
    lines = [f"{CELL_TEXT[result.status]} {result.host} {result.check}: {result.detail}"]
    if result.hint:
        lines.append(f"  hint: {result.hint}")
    return lines


def doctor_summary(report: DoctorReport) -> str:
    remote = sum(1 for h in report.hosts if not h.is_local)
    where = "this machine"
    if remote:
        where = f"{remote} host{'s' if remote != 1 else ''} and this machine"
    failed, warned = len(report.failures), len(report.warnings)
    if not failed and not warned:
        verdict = "every check passed"
    else:
        parts = [f"{failed} failed"] if failed else []
        parts += [f"{warned} warning{'s' if warned != 1 else ''}"] if warned else []
        verdict = ", ".join(parts)
    return f"doctor: {where}, {len(report.checks)} checks in {report.elapsed_s:.1f}s: {verdict}"
