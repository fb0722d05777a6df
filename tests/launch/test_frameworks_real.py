"""TensorFlow, PyTorch and PaddlePaddle read back what dtrain planned: the real frameworks, locally.

TensorFlow and Paddle need numpy versions MXNet 1.9.1 cannot share, so each lives in its own
virtualenv (.venvs/tf, .venvs/paddle), made by scripts/test.sh.
"""

from __future__ import annotations

import json
import re
from pathlib import Path
from typing import Any

from tests.conftest import PYTHON, ROOT, job_document, latest_job, run_dtrain

TF_PYTHON = str(ROOT / ".venvs" / "tf" / "bin" / "python")
PADDLE_PYTHON = str(ROOT / ".venvs" / "paddle" / "bin" / "python")
EXAMPLES = ROOT / "examples"


def json_lines(stdout: str) -> dict[str, dict[str, Any]]:
    """`[task] {...}` lines, parsed, by task name."""
    found = {}
    for line in stdout.splitlines():
        match = re.match(r"\[([^\]@]+)(?:@[^\]]+)?\] (\{.*\})$", line)
        if match:
            found[match.group(1)] = json.loads(match.group(2))
    return found


def planned_env(cwd: Path) -> dict[str, dict[str, str]]:
    return {t["name"]: t["env"] for t in job_document(cwd)["plan"]["tasks"]}


def test_tf_config_is_read_back_by_tfconfigclusterresolver(workdir: Path) -> None:
    result = run_dtrain(
        [
            "launch",
            "--framework",
            "tensorflow",
            "--chief",
            "-s",
            "2",
            "-n",
            "2",
            "--",
            TF_PYTHON,
            str(EXAMPLES / "tf_config_probe.py"),
        ],
        workdir,
        timeout_s=240,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json_lines(result.stdout)
    planned = planned_env(workdir)
    assert set(seen) == {"ps.0", "ps.1", "chief.0", "worker.0", "worker.1"}
    for name, report in seen.items():
        config = json.loads(planned[name]["TF_CONFIG"])
        assert report["cluster_spec"] == config["cluster"]
        assert (report["task_type"], report["task_id"]) == (
            config["task"]["type"],
            config["task"]["index"],
        )
    assert seen["ps.1"]["cuda_visible_devices"] == ""
    assert seen["worker.0"]["cuda_visible_devices"] is None


def test_tf_flag_placeholders_replace_three_hand_typed_commands(workdir: Path) -> None:
    result = run_dtrain(
        [
            "launch",
            "--framework",
            "tf",
            "-s",
            "1",
            "-n",
            "2",
            "--",
            TF_PYTHON,
            str(EXAMPLES / "tf_flags_probe.py"),
            "--ps_hosts={ps_hosts}",
            "--worker_hosts={worker_hosts}",
            "--job_name={job_name}",
            "--task_index={task_index}",
        ],
        workdir,
        timeout_s=240,
    )
    # TF1-style ps tasks serve forever: dtrain stops them once the workers are done.
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json_lines(result.stdout)
    planned = {t["name"]: t for t in job_document(workdir)["plan"]["tasks"]}
    assert seen["worker.1"]["job_name"] == "worker" and seen["worker.1"]["task_index"] == 1
    assert seen["worker.1"]["worker_hosts"] == [
        planned["worker.0"]["endpoint"],
        planned["worker.1"]["endpoint"],
    ]
    assert seen["ps.0"]["ps_hosts"] == [planned["ps.0"]["endpoint"]]


def test_paddle_parallel_env_reports_the_planned_ranks_and_endpoints(workdir: Path) -> None:
    result = run_dtrain(
        [
            "launch",
            "--framework",
            "paddle",
            "-n",
            "3",
            "--",
            PADDLE_PYTHON,
            str(EXAMPLES / "paddle_probe.py"),
        ],
        workdir,
        timeout_s=120,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    seen = json_lines(result.stdout)
    planned = planned_env(workdir)
    for rank in range(3):
        view = seen[f"worker.{rank}"]["parallel_env"]
        env = planned[f"worker.{rank}"]
        assert view["rank"] == rank
        assert view["world_size"] == 3
        assert view["trainer_endpoints"] == env["PADDLE_TRAINER_ENDPOINTS"].split(",")
        assert view["current_endpoint"] == env["PADDLE_CURRENT_ENDPOINT"]
        assert seen[f"worker.{rank}"]["role_maker"]["worker_num"] == 3
    logs = latest_job(workdir)
    assert (logs / "workerlog.2").read_text() == (logs / "worker.2.log").read_text()
    assert planned["worker.2"]["PADDLE_CURRENT_ENDPOINT"] in (logs / "endpoints.log").read_text()


def test_paddle_parameter_server_roles_are_read_back_by_the_role_maker(workdir: Path) -> None:
    result = run_dtrain(
        [
            "launch",
            "--framework",
            "paddle",
            "-s",
            "2",
            "-n",
            "2",
            "--",
            PADDLE_PYTHON,
            str(EXAMPLES / "paddle_probe.py"),
        ],
        workdir,
        timeout_s=120,
    )
    seen = json_lines(result.stdout)
    planned = planned_env(workdir)
    servers = planned["server.0"]["PADDLE_PSERVERS_IP_PORT_LIST"].split(",")
    for name in ("server.0", "server.1"):
        maker = seen[name]["role_maker"]
        assert maker["is_server"] is True and maker["is_worker"] is False
        assert maker["server_endpoints"] == servers
    assert seen["server.1"]["role_maker"]["role_id"] == 1
    worker = seen["worker.1"]["role_maker"]
    assert worker["is_worker"] is True and worker["role_id"] == 1
    assert worker["worker_num"] == 2 and worker["server_num"] == 2
    # Servers of a parameter-server job never exit by themselves: stopped after the trainers.
    assert result.returncode == 0, result.stderr[-3000:]


def test_paddle_collective_job_trains_on_cpu_with_gloo(workdir: Path) -> None:
    result = run_dtrain(
        [
            "launch",
            "--framework",
            "paddle",
            "-n",
            "2",
            "--",
            PADDLE_PYTHON,
            str(EXAMPLES / "paddle_collective.py"),
            "--steps",
            "5",
        ],
        workdir,
        timeout_s=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sums = re.findall(r"\] rank \d checksum (\S+)", result.stdout)
    assert len(sums) == 2 and sums[0] == sums[1]


def test_torch_ddp_job_trains_locally_and_ranks_agree(workdir: Path) -> None:
    result = run_dtrain(
        [
            "launch",
            "--framework",
            "pytorch",
            "-n",
            "2",
            "--",
            PYTHON,
            str(EXAMPLES / "torch_ddp.py"),
            "--steps",
            "5",
        ],
        workdir,
        timeout_s=180,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    sums = re.findall(r"\] rank \d checksum (\S+)", result.stdout)
    assert len(sums) == 2 and sums[0] == sums[1]
