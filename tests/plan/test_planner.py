from __future__ import annotations

import json
import os
from dataclasses import replace
from datetime import datetime
from pathlib import Path
from typing import Any

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtrain.errors import DtrainError, UsageError
from dtrain.plan import planner
from dtrain.plan.hosts import Host, local_host, parse_hosts
from dtrain.plan.spec import Framework, JobPlan, Role

GOLDEN = Path(__file__).parent.parent / "golden"
LOCAL = local_host("launcher")


def hosts(text: str) -> tuple[Host, ...]:
    return parse_hosts(text, "hosts")


def facts_for(request: planner.JobRequest, job_id: str = "J") -> planner.Facts:
    """Deterministic facts: host hN at 198.18.0.(10+N), ports 9000+ per host."""
    known: dict[str, planner.HostFacts] = {}
    names = [h.name for h in request.hosts]
    needed = planner.ports_needed(request)
    for index, name in enumerate(names, start=1):
        known[name] = planner.HostFacts(
            address=f"198.18.0.{10 + index}",
            interfaces={"eth0": f"198.18.0.{10 + index}", "ib0": f"198.18.1.{10 + index}"},
            free_ports=tuple(9000 + i for i in range(needed.get(name, 0))),
        )
    local_address = "198.18.0.1" if names else "127.0.0.1"
    known[LOCAL.name] = planner.HostFacts(
        address=local_address,
        interfaces={"eth0": local_address, "ib0": "198.18.1.1"},
        free_ports=tuple(7000 + i for i in range(needed.get(LOCAL.name, 0))),
    )
    return planner.Facts(job_id=job_id, hosts=known)


def make(command: tuple[str, ...] = ("python", "train.py"), **fields: Any) -> planner.JobRequest:
    return planner.JobRequest(command=command, local_host=LOCAL, **fields)


def plan(**fields: Any) -> JobPlan:
    request = make(**fields)
    return planner.plan_job(request, facts_for(request))


def layout(p: JobPlan) -> list[tuple[str, str]]:
    return [(t.name, t.host.name) for t in p.tasks]


def test_job_id_is_sortable_and_readable() -> None:
    assert planner.make_job_id(datetime(2026, 11, 22, 14, 30, 5), "3fa2") == "20261122-143005-3fa2"


def test_local_job_runs_everything_here_on_loopback() -> None:
    p = plan(num_workers=2)
    assert layout(p) == [
        ("scheduler", "launcher"),
        ("server.0", "launcher"),
        ("server.1", "launcher"),
        ("worker.0", "launcher"),
        ("worker.1", "launcher"),
    ]
    assert {t.address for t in p.tasks} == {"127.0.0.1"}
    assert [t.label for t in p.tasks][:2] == ["scheduler", "server.0"]
    assert not p.is_multi_host


def test_servers_default_to_workers_as_launch_py_does() -> None:
    assert len([t for t in plan(num_workers=3).tasks if t.role is Role.SERVER]) == 3
    assert len([t for t in plan(num_workers=3, num_servers=1).tasks if t.role is Role.SERVER]) == 1
    assert len([t for t in plan(num_workers=3, num_servers=0).tasks if t.role is Role.SERVER]) == 0


def test_round_robin_over_hosts_with_scheduler_on_the_launcher() -> None:
    p = plan(num_workers=3, num_servers=2, hosts=hosts("h1\nh2\n"))
    assert layout(p) == [
        ("scheduler", "launcher"),
        ("server.0", "h1"),
        ("server.1", "h2"),
        ("worker.0", "h1"),
        ("worker.1", "h2"),
        ("worker.2", "h1"),
    ]
    assert p.task("worker.1").label == "worker.1@h2"
    assert p.task("scheduler").label == "scheduler@launcher"


def test_slots_weight_the_round_robin_interleaved() -> None:
    p = plan(num_workers=6, num_servers=0, hosts=hosts("a slots=2\nb\nc slots=3\n"))
    assert [t.host.name for t in p.tasks if t.role is Role.WORKER] == ["a", "b", "c", "a", "c", "c"]


def test_scheduler_host_moves_the_scheduler_and_the_rendezvous() -> None:
    p = plan(num_workers=2, hosts=hosts("h1\nh2\n"), scheduler_host="h2")
    scheduler = p.task("scheduler")
    assert scheduler.host.name == "h2"
    assert p.rendezvous is not None
    assert str(p.rendezvous) == "198.18.0.12:9000"
    assert scheduler.env["DMLC_PS_ROOT_URI"] == "198.18.0.12"


def test_every_dmlc_task_gets_the_variables_ps_lite_requires() -> None:
    p = plan(num_workers=2, num_servers=2, hosts=hosts("h1\nh2\n"), port=9091)
    for task in p.tasks:
        env = task.env
        assert env["DMLC_ROLE"] == task.role.value
        assert env["DMLC_PS_ROOT_URI"] == "198.18.0.1"
        assert env["DMLC_PS_ROOT_PORT"] == "9091"
        assert env["DMLC_NUM_WORKER"] == "2"
        assert env["DMLC_NUM_SERVER"] == "2"
        assert env["DMLC_NODE_HOST"] == task.address
        assert env["DTRAIN_JOB_ID"] == "J"
        assert env["DTRAIN_TASK"] == task.name
    assert p.task("server.1").env["DMLC_SERVER_ID"] == "1"
    assert p.task("worker.1").env["DMLC_WORKER_ID"] == "1"
    assert "DMLC_WORKER_ID" not in p.task("server.1").env
    assert "DMLC_SERVER_ID" not in p.task("worker.0").env


def test_node_host_is_the_address_even_when_hosts_are_aliases() -> None:
    p = plan(num_workers=2, hosts=hosts("gpu-a\ngpu-b\n"))
    assert p.task("worker.1").env["DMLC_NODE_HOST"] == "198.18.0.12"
    assert p.task("worker.1").host.name == "gpu-b"


def test_interface_picks_each_hosts_address_on_it() -> None:
    for request_fields in ({"interface": "ib0"}, {"shell_env": {"DMLC_INTERFACE": "ib0"}}):
        p = plan(num_workers=2, hosts=hosts("h1\nh2\n"), **request_fields)
        assert p.task("worker.1").env["DMLC_NODE_HOST"] == "198.18.1.12"
        assert p.task("scheduler").env["DMLC_PS_ROOT_URI"] == "198.18.1.1"


def test_missing_interface_names_the_host_and_lists_what_it_has() -> None:
    with pytest.raises(DtrainError, match="host launcher has no IPv4 address on interface eth9"):
        plan(num_workers=1, hosts=hosts("h1\n"), interface="eth9")


def test_host_ip_overrides_the_scheduler_address() -> None:
    p = plan(num_workers=1, hosts=hosts("h1\n"), host_ip="198.18.0.99")
    assert p.task("worker.0").env["DMLC_PS_ROOT_URI"] == "198.18.0.99"


def test_loopback_is_refused_when_any_task_is_remote() -> None:
    with pytest.raises(UsageError, match=r"127\.0\.0\.1 is a loopback address"):
        plan(num_workers=1, hosts=hosts("h1\n"), host_ip="127.0.0.1")
    request = make(num_workers=1, hosts=hosts("h1\n"))
    facts = facts_for(request)
    bad = dict(facts.hosts)
    bad[LOCAL.name] = planner.HostFacts(address="127.0.1.1", free_ports=(7000,))
    with pytest.raises(UsageError, match="loopback"):
        planner.plan_job(request, planner.Facts(job_id="J", hosts=bad))


def test_the_users_command_is_untouched() -> None:
    command = ("python", "train.py", "--num-workers", "7", "--sync", "-s", "3", "--", "{x}")
    p = plan(command=command, num_workers=1)
    assert {t.argv for t in p.tasks} == {command}


def test_launching_shell_tuning_variables_are_forwarded_but_never_stale_ids() -> None:
    shell = {
        "PS_VERBOSE": "1",
        "DMLC_INTERFACE": "eth0",
        "DMLC_WORKER_ID": "5",
        "DMLC_ROLE": "server",
        "PATH": "/bin",
        "BYTEPS_TRACE_ON": "1",
    }
    p = plan(num_workers=2, num_servers=1, shell_env=shell)
    server = p.task("server.0").env
    assert server["PS_VERBOSE"] == "1"
    assert server["DMLC_INTERFACE"] == "eth0"
    assert server["BYTEPS_TRACE_ON"] == "1"
    assert server["DMLC_ROLE"] == "server"
    assert "DMLC_WORKER_ID" not in server
    assert "PATH" not in server


def test_env_precedence_is_forwarded_then_computed_then_env_then_role_env() -> None:
    p = plan(
        num_workers=1,
        shell_env={"PS_VERBOSE": "1"},
        env={"PS_VERBOSE": "2", "A": "all"},
        role_env={Role.WORKER: {"A": "worker", "DMLC_NODE_HOST": "198.18.0.50"}},
        allow_env_override=True,  # DMLC_NODE_HOST is dtrain's to set
    )
    assert p.task("server.0").env["PS_VERBOSE"] == "2"
    assert p.task("server.0").env["A"] == "all"
    assert p.task("worker.0").env["A"] == "worker"
    assert p.task("worker.0").env["DMLC_NODE_HOST"] == "198.18.0.50"


def test_env_flags_take_values_or_pass_the_shells() -> None:
    shell = {"HOME": "/root"}
    assert planner.parse_env_assignments(["A=1", "B=x=y", "HOME", "E="], shell, "--env") == {
        "A": "1",
        "B": "x=y",
        "HOME": "/root",
        "E": "",
    }
    with pytest.raises(UsageError, match="--env NOPE: NOPE is not set in this shell"):
        planner.parse_env_assignments(["NOPE"], shell, "--env")
    with pytest.raises(UsageError, match='"1A" is not a variable name'):
        planner.parse_env_assignments(["1A=2"], shell, "--env")


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"command": ()}, "no command to run"),
        ({"num_workers": 0}, "-n/--num-workers must be at least 1"),
        ({"num_servers": -1}, "-s/--num-servers cannot be negative"),
        ({"framework": Framework.TORCH, "num_servers": 2}, "torch jobs have no parameter servers"),
        ({"chief": True}, "--chief is for TensorFlow jobs"),
        ({"scheduler_host": "h9"}, '--scheduler-host "h9" is not in the hosts file'),
        ({"host_ip": "node1"}, '--host-ip "node1" is not an IP address'),
        ({"nproc_per_host": 2}, "--nproc-per-host is for collective jobs"),
        ({"gpus": ("0", "0")}, "--gpus lists a GPU twice"),
        ({"ps_gpus": True}, "--ps-gpus is for TensorFlow jobs"),
        ({"gpus": ("junk",)}, '"junk" is not a GPU index or UUID'),
        ({"gpus": ("a b",)}, '"a b" is not a GPU index or UUID'),
        ({"gpus": ("", "")}, '"" is not a GPU index or UUID'),
        ({"num_workers": 10**20}, "-n/--num-workers 100000000000000000000 is more than dtrain"),
        ({"env": {"DMLC_ROLE": "x"}}, "--env DMLC_ROLE: dtrain sets DMLC_ROLE for every dmlc"),
        (
            {"framework": Framework.TORCH, "role_env": {Role.WORKER: {"RANK": "1"}}},
            "--env-worker RANK: dtrain sets RANK for every torch task itself",
        ),
        (
            {"env": {"DTRAIN_TASK": "x"}, "allow_env_override": True},
            "--env DTRAIN_TASK: DTRAIN_TASK is dtrain's tag",
        ),
        ({"sync_dst": "rel/dir"}, '--sync-dst-dir "rel/dir" is not an absolute path'),
        ({"sync_dst": ""}, '--sync-dst-dir "" is not an absolute path'),
        ({"num_servers": 10**7}, "-s/--num-servers 10000000 is more than dtrain plans"),
        (
            {"framework": Framework.TORCH, "nproc_per_host": 10**6},
            "--nproc-per-host must be at most 4096",
        ),
    ],
)
def test_impossible_requests_are_usage_errors(fields: dict[str, Any], message: str) -> None:
    command = fields.pop("command", ("python", "x.py"))
    with pytest.raises(UsageError, match=message):
        planner.place(make(command=command, **fields))


def test_ports_needed_before_planning() -> None:
    assert planner.ports_needed(make(num_workers=2)) == {"launcher": 1}
    assert planner.ports_needed(make(num_workers=2, port=9091)) == {}
    request = make(num_workers=2, hosts=hosts("h1\nh2\n"), scheduler_host="h2")
    assert planner.ports_needed(request) == {"h2": 1}


def test_dmlc_plan_matches_golden_file() -> None:
    p = plan(num_workers=2, num_servers=2, hosts=hosts("h1\nh2 slots=2\n"), port=9091)
    assert_golden("dmlc_2x2.json", p.to_dict())


def assert_golden(name: str, document: dict[str, Any]) -> None:
    """Compare with tests/golden/NAME; regenerate with DTRAIN_REGEN_GOLDEN=1 after checking."""
    import os

    path = GOLDEN / name
    text = json.dumps(document, indent=2, sort_keys=True) + "\n"
    if os.environ.get("DTRAIN_REGEN_GOLDEN") == "1":
        path.write_text(text)
    expected = path.read_text()
    assert text == expected, (
        f"{path} differs from the plan; if the change is intended, rerun with "
        "DTRAIN_REGEN_GOLDEN=1 and review the diff"
    )


env_values = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=40
)
env_keys = st.from_regex(r"[A-Z_][A-Z0-9_]{0,12}", fullmatch=True).filter(
    lambda k: not k.startswith(("DMLC_", "DTRAIN_"))
)
argv_items = st.text(
    alphabet=st.characters(exclude_categories=["Cs"], exclude_characters="\x00"), max_size=30
)


@settings(max_examples=200)
@given(
    env=st.dictionaries(env_keys, env_values, max_size=5),
    command=st.lists(argv_items, min_size=1, max_size=6),
)
def test_env_values_and_argv_reach_the_plan_unchanged(
    env: dict[str, str], command: list[str]
) -> None:
    p = plan(command=tuple(command), num_workers=1, env=env)
    for task in p.tasks:
        assert task.argv == tuple(command)
        for key, value in env.items():
            assert task.env[key] == value


def test_a_dry_run_address_left_as_a_name_is_shown_not_rejected() -> None:
    # A dry run cannot always resolve a host (an ssh-config-only alias): its plan shows the
    # name, and the loopback check leaves it to the launch, which learns the real address.
    request = make(num_workers=1, hosts=hosts("gpu-a\n"))
    facts = facts_for(request)
    named = dict(facts.hosts)
    named["gpu-a"] = planner.HostFacts(address="gpu-a")
    p = planner.plan_job(request, planner.Facts(job_id="J", hosts=named))
    assert p.task("worker.0").env["DMLC_NODE_HOST"] == "gpu-a"


def test_one_machine_on_two_ports_is_two_hosts_with_their_own_ports_and_labels() -> None:
    two = hosts("127.0.0.1:2201\n127.0.0.1:2202\n")
    request = make(
        framework=Framework.PADDLE, num_workers=2, num_servers=2, hosts=two, host_ip="198.18.9.1"
    )
    assert planner.ports_needed(request) == {"127.0.0.1:2201": 2, "127.0.0.1:2202": 2}
    known = {
        host.key: planner.HostFacts(
            address=f"198.18.9.{n}", free_ports=tuple(9000 + 10 * n + i for i in range(2))
        )
        for n, host in enumerate(two, start=2)
    }
    known[LOCAL.key] = planner.HostFacts(address="198.18.9.1", free_ports=(7000,))
    p = planner.plan_job(request, planner.Facts(job_id="J", hosts=known))
    assert [(t.label, str(t.endpoint)) for t in p.tasks] == [
        ("server.0@127.0.0.1:2201", "198.18.9.2:9020"),
        ("server.1@127.0.0.1:2202", "198.18.9.3:9030"),
        ("worker.0@127.0.0.1:2201", "198.18.9.2:9021"),
        ("worker.1@127.0.0.1:2202", "198.18.9.3:9031"),
    ]
    assert [h.key for h in p.hosts] == ["127.0.0.1:2201", "127.0.0.1:2202"]


@pytest.mark.parametrize("text", ["localhost\n", "127.0.0.1\n", "[::ffff:127.0.0.1]\n"])
def test_hosts_that_are_all_this_machine_plan_a_job_on_loopback(text: str) -> None:
    request = make(num_workers=2, hosts=hosts(text))
    facts = facts_for(request)
    here = {key: replace(f, address="127.0.0.1") for key, f in facts.hosts.items()}
    p = planner.plan_job(request, planner.Facts(job_id="J", hosts=here))
    assert {t.address for t in p.tasks} == {"127.0.0.1"}


@pytest.mark.parametrize(
    ("fields", "cores", "noted"),
    [
        ({"num_workers": 4, "num_servers": 3}, 2, False),  # 8 tasks on 2 cores: fine
        ({"num_workers": 8, "num_servers": 8}, 2, True),  # 17 > 4 per core
        ({"num_workers": 8, "num_servers": 8}, None, False),  # cores unknown
        ({"framework": Framework.TORCH, "num_workers": 9}, 2, True),
        ({"framework": Framework.TORCH, "num_workers": 8}, 2, False),
        ({"num_workers": 40, "num_servers": 0, "hosts": hosts("a\nb\n")}, 1, False),  # remote
    ],
)
def test_many_more_local_tasks_than_cores_is_a_note_not_a_refusal(
    fields: dict[str, Any], cores: int | None, noted: bool
) -> None:
    p = plan(local_cores=cores, **fields)
    notes = [n for n in p.notes if "CPU core" in n]
    assert bool(notes) is noted
    if noted:
        count = sum(1 for t in p.tasks if t.host.is_local)
        assert notes[0].startswith(f"{count} tasks share this machine's {cores} CPU cores")


def test_a_dry_run_of_many_local_tasks_notes_the_cores_and_plans_them_all(tmp_path: Path) -> None:
    from tests.conftest import run_dtrain

    cores = len(os.sched_getaffinity(0))
    n = 4 * cores + 1
    result = run_dtrain(["launch", "--dry-run", "-n", str(n), "-s", "0", "--", "x"], tmp_path)
    assert result.returncode == 0, result.stderr
    assert f"note: {n + 1} tasks share this machine's {cores} CPU core" in result.stdout
    assert f"worker.{n - 1} " in result.stdout


def test_a_plan_whose_environment_linux_would_refuse_is_a_usage_error() -> None:
    many = "".join(f"h{n} slots=100\n" for n in range(1, 81))
    with pytest.raises(UsageError, match=r"PADDLE_TRAINER_ENDPOINTS would be \d+ bytes; Linux"):
        plan(framework=Framework.PADDLE, num_workers=8000, hosts=hosts(many))
    assert len(plan(framework=Framework.PADDLE, num_workers=100, hosts=hosts(many)).tasks) == 100


def test_allow_env_override_lets_env_replace_what_dtrain_computes() -> None:
    p = plan(framework=Framework.TORCH, num_workers=2, env={"RANK": "7"}, allow_env_override=True)
    assert [t.env["RANK"] for t in p.tasks] == ["7", "7"]


def test_notes_for_a_dmlc_job_without_servers_and_a_sync_with_no_remote_host() -> None:
    p = plan(num_workers=2, num_servers=0, sync_dst="/tmp/job")
    assert any(n.startswith("no parameter servers (-s 0)") for n in p.notes)
    assert "--sync-dst-dir: no task runs on another host, so nothing is copied" in p.notes
    assert not any("-s 0" in n for n in plan(num_workers=2, num_servers=1).notes)
