"""PyTorch DDP (gloo, CPU) that checkpoints and resumes: the pattern for `--max-restarts`.

    dtrain launch --framework torch -n 2 --max-restarts 3 -- \\
        python examples/torch_ddp_resume.py --steps 30 --checkpoint ckpt.pt

Rank 0 saves the model, the optimizer and the step every `--every` steps (to a temporary
file, then renamed over the last one: a rank killed mid-save leaves the last good one). When
dtrain starts the job again after a failure, every task sees DTRAIN_RESTART_COUNT (and
torchrun's TORCHELASTIC_RESTART_COUNT) above 0: every rank then loads the checkpoint and goes
on from the step after it. A first attempt never loads one (a file left by an earlier job is
not this job's). Each step's data depends only on the rank and the step, so a job that failed
and resumed ends with the same model as one that never failed; the last line of each rank,
``rank R checksum SHA SUM``, shows it. The checkpoint must be on a disk every rank reads.
"""

from __future__ import annotations

import argparse
import datetime
import gc
import hashlib
import os
import sys
import time
from pathlib import Path

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel

FEATURES = 8
BATCH = 32


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=30, help="training steps (default 30)")
    parser.add_argument("--every", type=int, default=5, help="checkpoint every N steps")
    parser.add_argument("--checkpoint", type=Path, required=True, help="the checkpoint file")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to sleep per step")
    parser.add_argument("--timeout-s", type=float, default=120.0, help="process-group timeout")
    return parser.parse_args(argv)


def restart_count() -> int:
    """Which attempt this is: 0 on the first, the same on every rank."""
    return int(
        os.environ.get("DTRAIN_RESTART_COUNT", os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    )


def batch_for(rank: int, step: int) -> tuple[torch.Tensor, torch.Tensor]:
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


def save(path: Path, model: nn.Module, optimizer: torch.optim.Optimizer, step: int) -> None:
    temporary = path.with_name(f".{path.name}.tmp")
    state = {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "step": step}
    torch.save(state, temporary)
    os.replace(temporary, path)  # atomic: the old checkpoint or the new, never half of one


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    torch.set_num_threads(1)
    dist.init_process_group(
        "gloo", init_method="env://", timeout=datetime.timedelta(seconds=args.timeout_s)
    )
    rank, world = dist.get_rank(), dist.get_world_size()
    torch.manual_seed(0)
    net = nn.Sequential(nn.Linear(FEATURES, 16), nn.ReLU(), nn.Linear(16, 1))
    optimizer = torch.optim.SGD(net.parameters(), lr=0.05)
    first = 0
    if restart_count() > 0 and args.checkpoint.exists():
        state = torch.load(args.checkpoint, weights_only=True)
        net.load_state_dict(state["model"])
        optimizer.load_state_dict(state["optimizer"])
        first = int(state["step"]) + 1
        print(f"rank {rank} resumed from step {state['step']} (restart {restart_count()})")
    print(f"rank {rank}/{world} pid {os.getpid()} starts at step {first}", flush=True)
    model = DistributedDataParallel(net)
    loss_fn = nn.MSELoss()
    for step in range(first, args.steps):
        x, y = batch_for(rank, step)
        optimizer.zero_grad()
        loss_fn(model(x), y).backward()
        optimizer.step()
        if rank == 0 and (step + 1) % args.every == 0:
            save(args.checkpoint, net, optimizer, step)
            print(f"rank 0 checkpoint at step {step}", flush=True)
        if args.sleep:
            time.sleep(args.sleep)
    digest, total = checksum(net)
    print(f"rank {rank} checksum {digest} {total:.6f}", flush=True)
    del model, optimizer
    gc.collect()
    dist.barrier()  # leave together (see torch_ddp.py: gloo aborts when a peer left first)
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
