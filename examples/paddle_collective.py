"""A tiny PaddlePaddle data-parallel job (CPU, gloo) that proves every rank trained the same model.

Run under dtrain, which sets PADDLE_TRAINER_ID, PADDLE_TRAINERS_NUM, PADDLE_TRAINER_ENDPOINTS,
PADDLE_CURRENT_ENDPOINT and, on CPU, PADDLE_DISTRI_BACKEND=gloo:

    dtrain launch --framework paddle -n 4 -- python examples/paddle_collective.py --steps 20

Without PADDLE_DISTRI_BACKEND=gloo a CPU build takes Paddle's legacy path: init_parallel_env()
returns, but the first collective fails with "The global group is not initialized".

Each rank ends by printing ``rank R checksum SHA SUM``: DataParallel averages gradients with an
all-reduce, so the checksums match across ranks. ``--fail-rank/--fail-at-step`` make one rank
exit with ``--fail-code`` mid-run, to test how a launcher handles a failed task.
"""

from __future__ import annotations

import argparse
import hashlib
import os
import sys
import time
import warnings

warnings.filterwarnings("ignore")  # paddle warns about ccache at import

import numpy as np  # noqa: E402
import paddle  # noqa: E402
import paddle.distributed as dist  # noqa: E402
from paddle import nn  # noqa: E402

FEATURES = 8
BATCH = 32


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep per step")
    parser.add_argument("--fail-rank", type=int, default=None, help="rank that fails on purpose")
    parser.add_argument("--fail-at-step", type=int, default=0, help="step at which it fails")
    parser.add_argument("--fail-code", type=int, default=3, help="exit code of the failing rank")
    return parser.parse_args(argv)


def make_model() -> nn.Layer:
    paddle.seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 1))


def batch_for(rank: int, step: int) -> tuple[paddle.Tensor, paddle.Tensor]:
    """Different data per rank and step, so matching checksums need the all-reduce."""
    rng = np.random.default_rng(1000 * rank + step)
    x = rng.standard_normal((BATCH, FEATURES)).astype("float32")
    y = x.sum(axis=1, keepdims=True) + 0.1 * rng.standard_normal((BATCH, 1)).astype("float32")
    return paddle.to_tensor(x), paddle.to_tensor(y)


def checksum(model: nn.Layer) -> tuple[str, float]:
    digest = hashlib.sha256()
    total = 0.0
    for param in model.parameters():
        data = np.ascontiguousarray(param.numpy())
        digest.update(data.tobytes())
        total += float(data.astype("float64").sum())
    return digest.hexdigest()[:16], total


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    paddle.device.set_device("cpu")
    dist.init_parallel_env()
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = os.environ.get("PADDLE_RANK_IN_NODE", "?")
    print(f"rank {rank}/{world} local_rank {local_rank} pid {os.getpid()} started", flush=True)

    model = paddle.DataParallel(make_model())
    optimizer = paddle.optimizer.SGD(learning_rate=0.05, parameters=model.parameters())
    loss_fn = nn.MSELoss()
    loss = paddle.zeros([1])
    for step in range(args.steps):
        if rank == args.fail_rank and step == args.fail_at_step:
            print(f"rank {rank} failing on purpose at step {step}", file=sys.stderr, flush=True)
            return int(args.fail_code)
        x, y = batch_for(rank, step)
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        optimizer.clear_grad()
        if args.sleep:
            time.sleep(args.sleep)

    digest, total = checksum(model)
    print(f"rank {rank} checksum {digest} {total:.6f} loss {float(loss):.4f}", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
