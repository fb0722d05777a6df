"""A PyTorch (gloo) job in which one rank never calls `all_reduce`: the others wait in it.

`torch_skip_allreduce.py SKIPPING_RANK`. Each rank prints `entering <rank>` just before its
collective (or the skipping rank before its sleep), so tests know every rank got there.
"""

import datetime
import os
import sys
import time

import torch
import torch.distributed as dist


def skip_the_collective() -> None:
    time.sleep(3600)


def main() -> None:
    rank = int(os.environ["RANK"])
    dist.init_process_group("gloo", timeout=datetime.timedelta(seconds=600))
    tensor = torch.ones(4)
    print(f"entering {rank}", flush=True)
    if rank == int(sys.argv[1]):
        skip_the_collective()
    else:
        dist.all_reduce(tensor)


main()
