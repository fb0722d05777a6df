"""Print, as one JSON line, what PaddlePaddle itself makes of this process's environment.

Tests run it under ``dtrain launch --framework paddle`` to check that the PADDLE_* variables
dtrain sets are read back by Paddle as intended. It opens no connection: ParallelEnv and the
fleet role maker only read the environment (the role maker's gloo set-up runs only in static
mode, which this probe never enters), so it is safe on a CPU-only machine with no peers.

The role maker is the collective one unless TRAINING_ROLE or PADDLE_PSERVERS_IP_PORT_LIST
says this is a parameter-server job.
"""

from __future__ import annotations

import contextlib
import json
import os
import sys
import warnings
from collections.abc import Callable
from typing import Any

warnings.filterwarnings("ignore")  # paddle warns about ccache at import

import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402
from paddle.distributed.fleet.base.role_maker import PaddleCloudRoleMaker  # noqa: E402

ENV_PREFIXES = ("PADDLE_", "FLAGS_selected", "TRAINING_ROLE", "POD_IP", "MASTER_")


def attempt(read: Callable[[], Any]) -> Any:
    """One field's value, or the error Paddle raised for it, so one bad variable shows up."""
    try:
        return read()
    except Exception as exc:  # Paddle raises ValueError, AssertionError, AttributeError...
        return {"error": f"{type(exc).__name__}: {exc}"}


def parallel_env_view() -> dict[str, Any]:
    env = dist.ParallelEnv()
    return {
        "rank": env.rank,
        "world_size": env.world_size,
        "local_rank": env.local_rank,  # an alias of rank in Paddle 3, not the rank on the node
        "device_id": attempt(lambda: env.device_id),
        "trainer_endpoints": env.trainer_endpoints,
        "current_endpoint": env.current_endpoint,
        "nrings": env.nrings,
        "pg_timeout_ms": env.pg_timeout,
    }


def role_maker_view(is_collective: bool) -> dict[str, Any]:
    maker = PaddleCloudRoleMaker(is_collective=is_collective)
    view: dict[str, Any] = {"mode": "collective" if is_collective else "ps"}
    # The PS role maker prints "fl-ps > coordinator address is null!" to stdout; keep stdout JSON.
    with contextlib.redirect_stdout(sys.stderr):
        view["generated"] = attempt(maker._generate_role)
    if isinstance(view["generated"], dict):
        return view  # the environment was rejected; the error says which variable
    del view["generated"]
    view.update(
        non_distributed=attempt(maker._is_non_distributed),
        is_worker=attempt(maker._is_worker),
        is_server=attempt(maker._is_server),
        is_first_worker=attempt(maker._is_first_worker),
        role_id=attempt(maker._role_id),
        worker_num=attempt(maker._worker_num),
        server_num=attempt(maker._server_num),
        node_num=attempt(maker._node_num),
        local_rank=attempt(maker._get_local_rank),
        trainer_endpoints=attempt(maker._get_trainer_endpoints),
        server_endpoints=attempt(maker._get_pserver_endpoints),
        current_endpoint=getattr(maker, "_cur_endpoint", None),
    )
    return view


def main() -> int:
    is_ps = "TRAINING_ROLE" in os.environ or "PADDLE_PSERVERS_IP_PORT_LIST" in os.environ
    report = {
        "paddle_version": paddle.version.full_version,
        "compiled_with_cuda": paddle.device.is_compiled_with_cuda(),
        "parallel_env": attempt(parallel_env_view),
        "get_rank": attempt(dist.get_rank),
        "get_world_size": attempt(dist.get_world_size),
        "role_maker": role_maker_view(is_collective=not is_ps),
        "env": {k: v for k, v in sorted(os.environ.items()) if k.startswith(ENV_PREFIXES)},
    }
    print(json.dumps(report, sort_keys=True), flush=True)
    failed = any(
        isinstance(value, dict) and "error" in value
        for value in (report["parallel_env"], report["role_maker"].get("generated"))
    )
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
