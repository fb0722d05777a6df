"""Each framework's environment from the pure planner (the real frameworks read it elsewhere)."""

from __future__ import annotations

import json
from typing import Any

import pytest

from dtrain.errors import UsageError
from dtrain.plan import frameworks
from dtrain.plan.spec import Framework, Role
from tests.plan.test_planner import assert_golden, hosts, plan


def env_of(p: Any, name: str) -> dict[str, str]:
    return dict(p.task(name).env)


@pytest.mark.parametrize(
    ("text", "framework"),
    [
        ("dmlc", Framework.DMLC),
        ("MXNet", Framework.DMLC),
        ("byteps", Framework.DMLC),
        ("tensorflow", Framework.TF),
        ("pytorch", Framework.TORCH),
        ("paddlepaddle", Framework.PADDLE),
    ],
)
def test_framework_names_and_aliases(text: str, framework: Framework) -> None:
    assert Framework.parse(text) is framework


# ---- TensorFlow -----------------------------------------------------------------------------


def test_tf_config_lists_the_cluster_and_the_task() -> None:
    p = plan(
        framework=Framework.TF, num_workers=2, num_servers=2, chief=True, hosts=hosts("h1\nh2\n")
    )
    assert [t.name for t in p.tasks] == ["ps.0", "ps.1", "chief.0", "worker.0", "worker.1"]
    # ps round-robin from the first host; the chief leads the workers' round-robin.
    config = json.loads(env_of(p, "worker.1")["TF_CONFIG"])
    assert config == {
        "cluster": {
            "chief": ["198.18.0.11:9001"],
            "worker": ["198.18.0.12:9001", "198.18.0.11:9002"],
            "ps": ["198.18.0.11:9000", "198.18.0.12:9000"],
        },
        "task": {"type": "worker", "index": 1},
    }
    assert json.loads(env_of(p, "ps.1")["TF_CONFIG"])["task"] == {"type": "ps", "index": 1}
    assert json.loads(env_of(p, "chief.0")["TF_CONFIG"])["task"] == {"type": "chief", "index": 0}


def test_tf_ps_tasks_hide_gpus_unless_asked() -> None:
    p = plan(framework=Framework.TF, num_workers=1)
    assert env_of(p, "ps.0")["CUDA_VISIBLE_DEVICES"] == ""
    assert "CUDA_VISIBLE_DEVICES" not in env_of(p, "worker.0")
    q = plan(framework=Framework.TF, num_workers=1, ps_gpus=True)
    assert "CUDA_VISIBLE_DEVICES" not in env_of(q, "ps.0")


def test_tf_placeholders_turn_three_hand_typed_commands_into_one() -> None:
    command = (
        "python",
        "tf_old.py",
        "--ps_hosts={ps_hosts}",
        "--worker_hosts={worker_hosts}",
        "--job_name={job_name}",
        "--task_index={task_index}",
        "{unrelated}",
    )
    p = plan(
        framework=Framework.TF,
        num_workers=2,
        num_servers=1,
        command=command,
        hosts=hosts("h1\nh2\n"),
    )
    assert p.task("worker.1").argv == (
        "python",
        "tf_old.py",
        "--ps_hosts=198.18.0.11:9000",
        "--worker_hosts=198.18.0.11:9001,198.18.0.12:9000",
        "--job_name=worker",
        "--task_index=1",
        "{unrelated}",
    )
    assert p.task("ps.0").argv[4:6] == ("--job_name=ps", "--task_index=0")


def test_placeholders_are_left_alone_outside_tf_jobs() -> None:
    command = ("python", "x.py", "--ps_hosts={ps_hosts}")
    assert plan(command=command, num_workers=1).task("worker.0").argv == command


def test_tf_job_succeeds_when_the_chief_does_and_stops_the_servers() -> None:
    with_chief = plan(framework=Framework.TF, num_workers=2, chief=True)
    assert with_chief.finish_roles == {Role.CHIEF}
    assert not with_chief.others_exit_by_themselves
    assert plan(framework=Framework.TF, num_workers=2).finish_roles == {Role.WORKER}


def test_fixed_base_port_numbers_tasks_per_host() -> None:
    p = plan(
        framework=Framework.TF, num_workers=2, num_servers=1, port=6000, hosts=hosts("h1\nh2\n")
    )
    assert [str(t.endpoint) for t in p.tasks] == [
        "198.18.0.11:6000",
        "198.18.0.11:6001",
        "198.18.0.12:6000",
    ]


# ---- PyTorch --------------------------------------------------------------------------------


def test_torch_ranks_fill_each_hosts_slots_contiguously() -> None:
    p = plan(framework=Framework.TORCH, hosts=hosts("h1 slots=2\nh2 slots=2\n"))
    assert [(t.name, t.host.name) for t in p.tasks] == [
        ("worker.0", "h1"),
        ("worker.1", "h1"),
        ("worker.2", "h2"),
        ("worker.3", "h2"),
    ]
    env = env_of(p, "worker.3")
    assert env["MASTER_ADDR"] == "198.18.0.11"
    assert env["MASTER_PORT"] == "9000"
    assert (env["RANK"], env["WORLD_SIZE"], env["LOCAL_RANK"], env["LOCAL_WORLD_SIZE"]) == (
        "3",
        "4",
        "1",
        "2",
    )
    assert (env["GROUP_RANK"], env["GROUP_WORLD_SIZE"]) == ("1", "2")


def test_torch_nproc_per_host_overrides_slots_and_n_can_leave_room() -> None:
    p = plan(
        framework=Framework.TORCH, num_workers=3, nproc_per_host=2, hosts=hosts("h1\nh2\nh3\n")
    )
    assert [t.host.name for t in p.tasks] == ["h1", "h1", "h2"]
    assert env_of(p, "worker.2")["LOCAL_WORLD_SIZE"] == "1"


def test_torch_world_larger_than_the_hosts_is_refused() -> None:
    with pytest.raises(UsageError, match=r"-n 5 ranks do not fit: the hosts provide 4 \(2 \+ 2\)"):
        plan(framework=Framework.TORCH, num_workers=5, hosts=hosts("h1 slots=2\nh2 slots=2\n"))


def test_local_torch_job_runs_n_ranks_here() -> None:
    p = plan(framework=Framework.TORCH, num_workers=4)
    assert env_of(p, "worker.3")["LOCAL_RANK"] == "3"
    assert env_of(p, "worker.0")["MASTER_ADDR"] == "127.0.0.1"
    assert env_of(p, "worker.0")["OMP_NUM_THREADS"] == "1"  # as torchrun does
    assert "GLOO_SOCKET_IFNAME" not in env_of(p, "worker.0")
    mine = plan(framework=Framework.TORCH, num_workers=2, shell_env={"OMP_NUM_THREADS": "4"})
    assert "OMP_NUM_THREADS" not in env_of(mine, "worker.0")


def test_multi_host_torch_names_the_interface_gloo_must_use() -> None:
    p = plan(framework=Framework.TORCH, hosts=hosts("h1\nh2\n"))
    assert env_of(p, "worker.1")["GLOO_SOCKET_IFNAME"] == "eth0"
    q = plan(framework=Framework.TORCH, hosts=hosts("h1\nh2\n"), interface="ib0")
    assert env_of(q, "worker.1")["GLOO_SOCKET_IFNAME"] == "ib0"


# ---- PaddlePaddle ---------------------------------------------------------------------------


def test_paddle_collective_endpoints_in_rank_order() -> None:
    p = plan(framework=Framework.PADDLE, nproc_per_host=2, hosts=hosts("h1\nh2\n"))
    env = env_of(p, "worker.2")
    assert env["PADDLE_TRAINER_ID"] == "2"
    assert env["PADDLE_TRAINERS_NUM"] == "4"
    assert env["PADDLE_TRAINER_ENDPOINTS"] == (
        "198.18.0.11:9000,198.18.0.11:9001,198.18.0.12:9000,198.18.0.12:9001"
    )
    assert env["PADDLE_CURRENT_ENDPOINT"] == "198.18.0.12:9000"
    assert env["PADDLE_LOCAL_RANK"] == env["PADDLE_RANK_IN_NODE"] == "0"
    assert env["PADDLE_MASTER"] == "198.18.0.11:9000"
    assert env["PADDLE_DISTRI_BACKEND"] == "gloo"  # CPU: Paddle's "auto" is NCCL only
    assert p.task("worker.2").log_aliases == ("workerlog.2",)
    assert "198.18.0.12:9001" in p.extra_files["endpoints.log"]


def test_paddle_with_servers_is_parameter_server_mode() -> None:
    p = plan(framework=Framework.PADDLE, num_workers=2, num_servers=1, hosts=hosts("h1\nh2\n"))
    server, trainer = env_of(p, "server.0"), env_of(p, "worker.1")
    assert server["TRAINING_ROLE"] == server["PADDLE_ROLE"] == "PSERVER"
    assert trainer["TRAINING_ROLE"] == "TRAINER" and trainer["PADDLE_TRAINER_ID"] == "1"
    assert server["PADDLE_PSERVERS_IP_PORT_LIST"] == "198.18.0.11:9000"
    assert server["PADDLE_PORT"] == "9000" and server["POD_IP"] == "198.18.0.11"
    assert trainer["PADDLE_TRAINERS_NUM"] == "2"
    assert p.task("server.0").log_aliases == ("serverlog.0",)


# ---- GPUs -----------------------------------------------------------------------------------


def test_gpus_start_one_process_per_gpu_on_each_host() -> None:
    p = plan(framework=Framework.PADDLE, gpus=("0", "1"), hosts=hosts("h1\nh2\n"))
    assert [(t.host.name, t.env["CUDA_VISIBLE_DEVICES"]) for t in p.tasks] == [
        ("h1", "0"),
        ("h1", "1"),
        ("h2", "0"),
        ("h2", "1"),
    ]
    assert env_of(p, "worker.3")["FLAGS_selected_gpus"] == "1"
    assert "PADDLE_DISTRI_BACKEND" not in env_of(p, "worker.3")
    assert env_of(p, "worker.3")["PADDLE_TRAINER_ID"] == "3"


def test_gpus_for_dmlc_workers_and_a_mismatched_n_is_an_error() -> None:
    p = plan(gpus=("0", "1"), num_servers=1, hosts=hosts("h1\nh2\n"))
    workers = [t for t in p.tasks if t.role is Role.WORKER]
    assert [(t.host.name, t.env["CUDA_VISIBLE_DEVICES"]) for t in workers] == [
        ("h1", "0"),
        ("h1", "1"),
        ("h2", "0"),
        ("h2", "1"),
    ]
    assert "CUDA_VISIBLE_DEVICES" not in env_of(p, "server.0")
    with pytest.raises(UsageError, match="starts 4 workers, but -n says 3"):
        plan(gpus=("0", "1"), num_workers=3, hosts=hosts("h1\nh2\n"))


def test_torch_gpus_set_local_rank_and_visible_device() -> None:
    p = plan(framework=Framework.TORCH, gpus=("2", "3"), hosts=hosts("h1\nh2\n"))
    env = env_of(p, "worker.1")
    assert (env["LOCAL_RANK"], env["CUDA_VISIBLE_DEVICES"], env["WORLD_SIZE"]) == ("1", "3", "4")


# ---- forwarding and golden plans ------------------------------------------------------------


def test_forwarding_is_framework_specific_and_narrow() -> None:
    shell = {
        "TF_CPP_MIN_LOG_LEVEL": "2",
        "TF_CLI_CONFIG_FILE": "/root/.terraformrc",
        "TF_CONFIG": "stale",
        "NCCL_DEBUG": "INFO",
        "RANK": "9",
        "FLAGS_eager_delete_tensor_gb": "0",
        "PADDLE_TRAINER_ID": "7",
    }
    assert frameworks.forwarded_env(Framework.TF, shell) == {"TF_CPP_MIN_LOG_LEVEL": "2"}
    assert frameworks.forwarded_env(Framework.TORCH, shell) == {"NCCL_DEBUG": "INFO"}
    assert frameworks.forwarded_env(Framework.PADDLE, shell) == {
        "FLAGS_eager_delete_tensor_gb": "0"
    }


@pytest.mark.parametrize(
    ("name", "fields"),
    [
        (
            "tf_chief_2x2.json",
            {"framework": Framework.TF, "num_workers": 2, "num_servers": 2, "chief": True},
        ),
        ("torch_2x2.json", {"framework": Framework.TORCH, "nproc_per_host": 2}),
        ("paddle_2x2.json", {"framework": Framework.PADDLE, "nproc_per_host": 2}),
        ("paddle_ps.json", {"framework": Framework.PADDLE, "num_workers": 2, "num_servers": 2}),
    ],
)
def test_framework_plans_match_golden_files(name: str, fields: dict[str, Any]) -> None:
    assert_golden(name, plan(hosts=hosts("h1\nh2\n"), **fields).to_dict())


# ---- scale ----------------------------------------------------------------------------------


class CountedTuple(tuple[Any, ...]):
    """A tuple that counts how often it is walked: planning must walk the job a fixed number
    of times, not once per task (8000 tasks took 11 s that way)."""

    walks = 0

    def __iter__(self) -> Any:
        CountedTuple.walks += 1
        return super().__iter__()


@pytest.mark.parametrize(
    "fields",
    [
        {"num_workers": 150, "num_servers": 150},
        {"framework": Framework.TF, "num_workers": 150, "num_servers": 150, "chief": True},
        {"framework": Framework.TORCH, "num_workers": 300},
        {"framework": Framework.PADDLE, "num_workers": 300},
        {"framework": Framework.PADDLE, "num_workers": 150, "num_servers": 150},
    ],
)
def test_planning_walks_the_tasks_and_hosts_a_fixed_number_of_times(
    fields: dict[str, Any], monkeypatch: pytest.MonkeyPatch
) -> None:
    real = frameworks.JobContext

    def counted(**kwargs: Any) -> frameworks.JobContext:
        return real(**{**kwargs, "tasks": CountedTuple(kwargs["tasks"])})

    monkeypatch.setattr(frameworks, "JobContext", counted)
    many = CountedTuple(hosts("".join(f"h{i} slots=10\n" for i in range(30))))
    CountedTuple.walks = 0
    p = plan(hosts=many, **fields)
    assert len(p.tasks) >= 300
    assert CountedTuple.walks <= 20
