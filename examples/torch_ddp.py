"""A tiny PyTorch DDP job (gloo, CPU) that proves every rank trained the same model.

Run under dtrain, which sets MASTER_ADDR, MASTER_PORT, RANK, WORLD_SIZE and LOCAL_RANK:

    dtrain launch --framework torch -n 4 -- python examples/torch_ddp.py --steps 20

Each rank ends by printing one line ``rank R checksum SHA SUM``. DDP averages gradients with
an all-reduce, so the checksums match across ranks; a mismatch means the ranks did not train
together. ``--fail-rank/--fail-at-step`` make one rank exit with ``--fail-code`` mid-run, to
test how a launcher handles a failed task.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

FEATURES = 8
BATCH = 32


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=10, help="training steps (default 10)")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep per step")
    parser.add_argument("--fail-rank", type=int, default=None, help="rank that fails on purpose")
    parser.add_argument("--fail-at-step", type=int, default=0, help="step at which it fails")
    parser.add_argument("--fail-code", type=int, default=3, help="exit code of the failing rank")
    parser.add_argument(
        "--timeout-s",
        type=float,
        default=120.0,
        help="process-group timeout; torch's default of 30 min hides a missing rank",
    )
    return parser.parse_args(argv)


def make_model() -> nn.Module:
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 1))


def batch_for(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
    """Different data per rank and step, so matching checksums need the all-reduce."""
    gen = torch.Generator().manual_seed(1000 * rank + step)
    x = torch.randn(BATCH, FEATURES, generator=gen)
    y = x.sum(dim=1, keepdim=True) + 0.1 * torch.randn(BATCH, 1, generator=gen)
    return x, y


def checksum(model: nn.Module) -> tuple[str, float]:
    digest = hashlib.sha256()
    total = 0.0
    for param in model.parameters():
        data = param.detach().contiguous()
        digest.update(data.numpy().tobytes())
        total += float(data.double().sum())
    return digest.hexdigest()[:16], total


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    # One intra-op thread: several ranks share few cores, and oversubscription is slower.
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method="env://", timeout=datetime.timedelta(seconds=args.timeout_s)
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    local_rank = os.environ.get("LOCAL_RANK", "?")
    print(f"rank {rank}/{world} local_rank {local_rank} pid {os.getpid()} started", flush=True)

    model = DistributedDataParallel(make_model())
    optimizer = torch.optim.SGD(model.parameters(), lr=0.05)
    loss_fn = nn.MSELoss()
    loss = torch.tensor(0.0)
    for step in range(args.steps):
        if rank == args.fail_rank and step == args.fail_at_step:
            print(f"rank {rank} failing on purpose at step {step}", file=sys.stderr, flush=True)
            return int(args.fail_code)
        x, y = batch_for(rank, step)
        optimizer.zero_grad()
        loss = loss_fn(model(x), y)
        loss.backward()
        optimizer.step()
        if args.sleep:
            time.sleep(args.sleep)

    digest, total = checksum(model.module)
    print(f"rank {rank} checksum {digest} {total:.6f} loss {loss.item():.4f}", flush=True)
    # Free DDP's reducer while every peer is still connected, then leave together. Without
    # this, torch 2.13's gloo aborts up to one exit in three on a busy machine ("terminate called
    # without an active exception", SIGABRT; under torchrun too) once the other rank has gone.
    del model, optimizer
    gc.collect()
    dist.barrier()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
