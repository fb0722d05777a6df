"""Doctor's verdicts from gathered facts, and how they print: pure, from hand-made surveys."""

from __future__ import annotations

from dataclasses import replace
from typing import Any

import pytest

from dtrain.doctor.judge import (
    CHECKS,
    Connect,
    DoctorReport,
    Observed,
    Scheduler,
    Status,
    Survey,
    blocked_by_host,
    judge,
)
from dtrain.errors import Problem
from dtrain.processes.results import HostScan, JobProcess
from dtrain.render import doctor as render

PY = "/opt/py/bin/python3"


def probe(version: str = "3.11.7", executable: str = PY, **dists: str) -> dict[str, Any]:
    return {
        "interpreter": {
            "program": "python3",
            "resolved": executable,
            "interpreter": "python3",
            "executable": executable,
            "version": version,
            "distributions": dists or {"numpy": "1.23.5", "mxnet": "1.9.1"},
            "error": None,
        },
        "files": {"dir": "/w", "dir_exists": True, "sha256": "a" * 64, "size": 10},
        "env": {},
        "gpu": {"present": False},
        "hostname": {"hostname": "x", "addresses": ["198.18.0.9"]},
        "stacks": {
            "tool": "/opt/py/bin/py-spy",
            "looked_in": ["/opt/py/bin"],
            "ptrace_scope": 1,
            "is_root": True,
        },
    }


def host(name: str, **fields: Any) -> Observed:
    defaults: dict[str, Any] = {
        "connect_s": 0.1,
        "advertised": f"198.18.0.{len(name)}",
        "probe": probe(),
        "scan": HostScan(name),
        "clock_skew_s": 0.01,
    }
    defaults.update(fields)
    return Observed(name=name, **defaults)


def ok(src: str, dst: str) -> Connect:
    return Connect(src, dst, "198.18.0.1", 20000, True, elapsed_s=0.001)


def dropped(src: str, dst: str) -> Connect:
    return Connect(src, dst, "198.18.0.1", 20000, False, "timed out", 2.0)


def survey(*hosts: Observed, **fields: Any) -> Survey:
    names = [h.name for h in hosts]
    defaults: dict[str, Any] = {
        "connects": tuple(ok(a, b) for a in names for b in names if a != b),
        "scheduler": Scheduler("here", "198.18.0.1", 9091),
        "command": ("python3", "train.py"),
        "workdir": "/w",
        "kill_command": "dtrain kill -H hosts",
    }
    defaults.update(fields)
    return Survey(hosts=hosts, **defaults)


def verdict(results: tuple[Any, ...], check: str, name: str) -> Any:
    return next(r for r in results if r.check == check and r.host == name)


def test_healthy_hosts_pass_every_check() -> None:
    results = judge(survey(host("here", is_local=True, connect_s=None), host("h1"), host("h2")))
    assert len(results) == 3 * len(CHECKS)
    assert {r.status for r in results if r.host != "here"} == {Status.PASS}
    assert verdict(results, "ssh", "here").status is Status.SKIP


def test_the_odd_python_is_named_with_both_versions() -> None:
    results = judge(
        survey(
            host("here", is_local=True),
            host("h1"),
            host("h2", probe=probe("3.11.2", "/usr/bin/python3")),
        )
    )
    failed = verdict(results, "python", "h2")
    assert failed.status is Status.FAIL
    assert "/usr/bin/python3 3.11.2 on h2; 2 of 3 hosts run /opt/py/bin/python3 3.11.7" in (
        failed.detail
    )
    assert verdict(results, "python", "h1").status is Status.PASS


def test_a_missing_package_fails_with_versions_and_the_pip_line() -> None:
    results = judge(
        survey(
            host("here", is_local=True),
            host("h1"),
            host("h2", probe=probe(numpy="1.23.5")),
        )
    )
    failed = verdict(results, "packages", "h2")
    assert failed.status is Status.FAIL
    assert "mxnet missing (others: 1.9.1)" in failed.detail
    assert failed.hint == f"on h2: {PY} -m pip install mxnet==1.9.1"


def test_drop_and_reject_read_differently() -> None:
    assert "dropped" in dropped("h1", "h2").text()
    refused = Connect("h1", "h2", "198.18.0.12", 20000, False, "refused", 0.001)
    assert (
        refused.text()
        == "h1 → h2:20000: refused in 1 ms (rejected: a firewall answers with a reset)"
    )


def test_blocked_pairs_are_blamed_on_the_filtering_host() -> None:
    names = ["h1", "h2", "h3"]
    # h2 drops everything incoming: every probe to h2 fails.
    incoming = [dropped(a, "h2") if b == "h2" else ok(a, b) for a in names for b in names if a != b]
    assert {k: len(v) for k, v in blocked_by_host(incoming, names).items()} == {
        "h1": 0,
        "h2": 2,
        "h3": 0,
    }
    # h3 cannot get out: every probe from h3 fails, while others reach its targets.
    outgoing = [dropped(a, b) if a == "h3" else ok(a, b) for a in names for b in names if a != b]
    assert {k: len(v) for k, v in blocked_by_host(outgoing, names).items()} == {
        "h1": 0,
        "h2": 0,
        "h3": 2,
    }


def test_firewall_failure_names_each_blocked_pair() -> None:
    names = ["h1", "h2", "h3"]
    connects = tuple(
        dropped(a, "h2") if b == "h2" else ok(a, b) for a in names for b in names if a != b
    )
    tools = ({"tool": "nft", "rules": ["table inet fw: 1 drop/reject rule(s)"]},)
    results = judge(
        survey(host("h1"), host("h2", firewall_tools=tools), host("h3"), connects=connects)
    )
    failed = verdict(results, "firewall", "h2")
    assert failed.status is Status.FAIL
    assert "h1 → h2:20000: timed out after 2.0s" in failed.detail
    assert "h3 → h2:20000" in failed.detail
    assert "nft: table inet fw" in (failed.hint or "")
    assert verdict(results, "firewall", "h1").status is Status.PASS


def test_unreachable_host_fails_ssh_and_skips_the_rest_while_others_are_checked() -> None:
    problem = Problem("h2 (198.18.0.12:22): connection timed out after 1s", host="h2", hint="x")
    scheduler = Scheduler("h1", "198.18.0.11", 9091)
    results = judge(
        survey(host("h1"), Observed("h2", problem=problem), host("h3"), scheduler=scheduler)
    )
    assert verdict(results, "ssh", "h2").status is Status.FAIL
    assert "timed out" in verdict(results, "ssh", "h2").detail
    assert {r.status for r in results if r.host == "h2" and r.check != "ssh"} == {Status.SKIP}
    assert {r.status for r in results if r.host == "h3"} == {Status.PASS}


def stale_process(pid: int, job: str | None, orphaned: bool = True) -> JobProcess:
    return JobProcess(
        pid=pid,
        ppid=1,
        pgid=pid,
        uid=0,
        state="S",
        started_at=0.0,
        age_s=75.0,
        cpu_s=0.0,
        rss_bytes=0,
        argv=("sleep", "60"),
        comm="sleep",
        job_id=job,
        task="worker.0" if job else None,
        role="worker",
        orphaned=orphaned,
    )


def test_leftovers_whose_launcher_is_gone_fail_with_the_kill_line() -> None:
    leftovers = HostScan("h2", (stale_process(42, None), stale_process(43, "job-1")))
    here = HostScan("here", (stale_process(7, "job-2"),), is_local=True)
    results = judge(survey(host("here", is_local=True, scan=here), host("h2", scan=leftovers)))
    failed = verdict(results, "stale", "h2")
    assert failed.status is Status.FAIL
    assert "left behind by an earlier job (its launcher is gone)" in failed.detail
    assert "pid 42 (DMLC_ROLE=worker, age 1m15s): sleep 60" in failed.detail
    assert failed.hint == "stop them: dtrain kill -H hosts --job job-1; dtrain kill -H hosts"
    assert verdict(results, "stale", "here").status is Status.FAIL
    assert "dtrain kill --job job-2" in (verdict(results, "stale", "here").hint or "")


def test_a_job_that_is_still_supervised_is_another_running_job_and_only_warns() -> None:
    live = HostScan("h1", (stale_process(50, "job-3", orphaned=False),))
    results = judge(survey(host("here", is_local=True), host("h1", scan=live)))
    warned = verdict(results, "stale", "h1")
    assert warned.status is Status.WARN
    assert warned.detail.startswith("another job is running here (job-3): 1 job process: pid 50")
    assert "if it should not run, stop it: dtrain kill -H hosts --job job-3" in (warned.hint or "")


def test_a_job_id_and_a_command_line_with_newlines_stay_one_line() -> None:
    odd = replace(stale_process(50, "job\nforged: PASS", orphaned=False), argv=("sh", "-c", "a\nb"))
    results = judge(survey(host("here", is_local=True), host("h1", scan=HostScan("h1", (odd,)))))
    warned = verdict(results, "stale", "h1")
    assert "\n" not in warned.detail and "\n" not in (warned.hint or "")
    assert warned.detail.startswith("another job is running here (job\\nforged: PASS)")
    assert "sh -c 'a\\nb'" in warned.detail


def test_loopback_address_fails_when_the_job_spans_machines() -> None:
    results = judge(survey(host("here", is_local=True), host("h1", advertised="127.0.0.1")))
    assert verdict(results, "address", "h1").status is Status.FAIL


def test_scheduler_port_in_use_names_the_holder_and_its_kill_line() -> None:
    holder = {
        "pid": 99,
        "start": 100.0,
        "cmdline": ["python", "t.py"],
        "tags": {"DTRAIN_JOB_ID": "old-job", "DMLC_ROLE": "scheduler"},
    }
    scheduler = Scheduler(
        "here", "198.18.0.1", 9091, True, "address already in use", (holder,), 130.0
    )
    results = judge(survey(host("here", is_local=True), host("h1"), scheduler=scheduler))
    failed = verdict(results, "scheduler", "here")
    assert failed.status is Status.FAIL
    assert "pid 99, age 30s, job old-job, DMLC_ROLE=scheduler: python t.py" in failed.detail
    assert failed.hint == "stop it: dtrain kill --job old-job"


@pytest.mark.parametrize(
    ("address", "port", "error", "hint"),
    [
        (
            "127.0.0.1",
            1,
            "permission denied",
            "ports below 1024 need root: pass --port 1024 or above, or leave --port out for a "
            "free one",
        ),
        (
            "192.0.2.7",
            9091,
            "cannot assign requested address",
            "192.0.2.7 is not an address of here: pass --host-ip with one of here's addresses "
            "that every host reaches, or leave it out",
        ),
        (
            "fd00::7",
            9091,
            "cannot assign requested address",
            "fd00::7 is not an address of here: pass --host-ip with one of here's addresses "
            "that every host reaches, or leave it out",
        ),
    ],
)
def test_a_scheduler_that_cannot_listen_gets_the_hint_for_its_reason(
    address: str, port: int, error: str, hint: str
) -> None:
    scheduler = Scheduler("here", address, port, True, error)
    results = judge(survey(host("here", is_local=True), scheduler=scheduler))
    failed = verdict(results, "scheduler", "here")
    assert failed.status is Status.FAIL
    shown = f"[{address}]" if ":" in address else address
    assert failed.detail == f"the scheduler cannot listen on {shown}:{port}: {error}"
    assert failed.hint == hint


def test_report_text_is_a_table_then_the_findings_worst_first() -> None:
    problem = Problem("h2: refused", host="h2", hint="start sshd")
    hosts = (host("here", is_local=True), host("h1"), Observed("h2", problem=problem))
    results = judge(survey(*hosts))
    text = render.doctor_text(DoctorReport(hosts, results, CHECKS, 1.25))
    lines = text.splitlines()
    assert lines[0].split() == ["HOST", *CHECKS]
    assert lines[1].split()[:3] == ["here", "(here)", "-"]
    assert lines[3].split()[:3] == ["h2", "FAIL", "-"]
    assert "FAIL h2 ssh: h2: refused" in text
    assert "  hint: start sshd" in text
    assert lines[-1] == "doctor: 2 hosts and this machine, 12 checks in 1.2s: 1 failed"


def with_stacks(**facts: Any) -> dict[str, Any]:
    found = probe()
    found["stacks"] = {**found["stacks"], **facts}
    return found


def test_a_host_without_py_spy_warns_and_says_how_to_install_it_into_the_jobs_python() -> None:
    results = judge(survey(host("h1"), host("h2", probe=with_stacks(tool=None))))
    assert verdict(results, "stacks", "h1").status is Status.PASS
    missing = verdict(results, "stacks", "h2")
    assert missing.status is Status.WARN
    assert missing.detail.startswith("py-spy is not installed beside /opt/py/bin or on PATH")
    assert (
        missing.hint
        == "install it into the job's environment: /opt/py/bin/python -m pip install py-spy"
    )


def test_a_ptrace_scope_that_forbids_reading_the_users_tasks_warns() -> None:
    results = judge(survey(host("h1", probe=with_stacks(is_root=False, ptrace_scope=1))))
    found = verdict(results, "stacks", "h1")
    assert found.status is Status.WARN
    assert "kernel.yama.ptrace_scope is 1" in found.detail
    results = judge(survey(host("h1", probe=with_stacks(is_root=False, ptrace_scope=0))))
    assert verdict(results, "stacks", "h1").status is Status.PASS


def test_without_a_command_a_missing_py_spy_is_not_a_warning() -> None:
    hosts = survey(host("h1", probe=with_stacks(tool=None, looked_in=[])), command=())
    assert verdict(judge(hosts), "stacks", "h1").status is Status.SKIP
