"""Data-parallel training of a tiny MLP through MXNet's `dist_sync` kvstore.

Run the same command in every role; dtrain sets the DMLC_* variables:

    dtrain launch -n 2 -s 2 -- python examples/mxnet_dist_sync.py --epochs 3

With DMLC_ROLE=scheduler or server, `import mxnet` does not return: it serves until every
worker has finished and then exits the process. Workers train on their own shard of a
synthetic data set. Each worker pushes its gradients, the servers sum them and apply SGD,
and each worker pulls back the new weights. At the end every worker prints
`worker rank R checksum SHA`, and the checksums must match.

`--fail-worker/--fail-at-epoch` crash one worker on purpose, to test the launcher. Keep in
mind that ps-lite never turns a failure into an exit: see `--fail-mode`.
"""

from __future__ import annotations

import argparse
import hashlib
import ipaddress
import os
import sys
import time
from collections.abc import Mapping, Sequence
from typing import Any

PROG = "mxnet_dist_sync"
HINT = "start this script with `dtrain launch`, which sets every DMLC_* variable"


def parse_args(argv: Sequence[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(prog=PROG, description=__doc__.splitlines()[0])
    parser.add_argument("--epochs", type=int, default=3, help="passes over the data (default 3)")
    parser.add_argument("--batches", type=int, default=10, help="batches per epoch (default 10)")
    parser.add_argument("--batch-size", type=int, default=32, help="per-worker batch (default 32)")
    parser.add_argument("--lr", type=float, default=0.5, help="SGD learning rate (default 0.5)")
    parser.add_argument("--seed", type=int, default=42, help="data and init seed (default 42)")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds to pause per batch")
    parser.add_argument("--fail-worker", type=int, help="kvstore rank that fails on purpose")
    parser.add_argument("--fail-at-epoch", type=int, help="epoch (1-based) whose start it fails at")
    parser.add_argument(
        "--fail-mode",
        choices=("exit", "raise"),
        default="exit",
        help="exit: leave at once with code 3; raise: unhandled exception, after which "
        "MXNet leaves the process hanging at shutdown (default exit)",
    )
    args = parser.parse_args(argv)
    if min(args.epochs, args.batches, args.batch_size) < 1 or args.sleep < 0:
        parser.error("--epochs, --batches and --batch-size must be >= 1, --sleep >= 0")
    if (args.fail_worker is None) != (args.fail_at_epoch is None):
        parser.error("--fail-worker and --fail-at-epoch go together")
    if args.fail_at_epoch is not None and not 1 <= args.fail_at_epoch <= args.epochs:
        parser.error(f"--fail-at-epoch must be 1-{args.epochs}")
    return args


def check_env(environ: Mapping[str, str]) -> str:
    """Catch what ps-lite reports badly or not at all before `import mxnet` runs it.

    For example, a missing port makes ps-lite segfault, and a hostname where an IP is
    expected makes ZMQ fail to bind.
    """
    role = environ.get("DMLC_ROLE", "")
    if role not in ("scheduler", "server", "worker"):
        raise ValueError(f"DMLC_ROLE={role!r} is not scheduler, server or worker; {HINT}")
    for name in ("DMLC_NUM_WORKER", "DMLC_NUM_SERVER", "DMLC_PS_ROOT_PORT"):
        text = environ.get(name, "")
        if not text.isdigit() or int(text) < 1:
            raise ValueError(f"{name}={text!r} is not a positive integer; {HINT}")
    if int(environ["DMLC_PS_ROOT_PORT"]) > 65535:
        raise ValueError(f"DMLC_PS_ROOT_PORT={environ['DMLC_PS_ROOT_PORT']} is not a port")
    for name in ("DMLC_PS_ROOT_URI", "DMLC_NODE_HOST"):
        if name == "DMLC_NODE_HOST" and name not in environ:
            continue  # ps-lite then picks an interface itself
        text = environ.get(name, "")
        try:
            ipaddress.ip_address(text)
        except ValueError:
            raise ValueError(f"{name}={text!r} is not an IP address; ps-lite needs one") from None
    return role


def say(who: str, text: str) -> None:
    print(f"{who}: {text}", flush=True)


def make_data(args: argparse.Namespace, rank: int, num_workers: int) -> tuple[Any, Any]:
    """The same synthetic 2-class problem on every worker; each keeps every num_workers-th row."""
    import numpy as np

    rng = np.random.RandomState(args.seed)
    total = args.batches * args.batch_size * num_workers
    x = rng.normal(size=(total, 10)).astype("float32")
    w1, w2 = rng.normal(size=10), rng.normal(size=10)
    y = ((x @ w1 + 2.0 * np.sin(x @ w2)) > 0).astype("float32")
    return x[rank::num_workers], y[rank::num_workers]


def train(args: argparse.Namespace) -> None:
    """Worker: push gradients, pull SGD-updated weights, every batch, in lockstep."""
    import mxnet as mx
    from mxnet import autograd, gluon

    kv = mx.kv.create("dist_sync")
    rank, num_workers = kv.rank, kv.num_workers
    who = f"worker rank {rank}"
    worker_id = os.environ.get("DMLC_WORKER_ID", "?")
    say(who, f"joined dist_sync kvstore as {rank}/{num_workers} (DMLC_WORKER_ID={worker_id})")
    x, y = make_data(args, rank, num_workers)

    mx.random.seed(args.seed)
    net = gluon.nn.HybridSequential()
    net.add(gluon.nn.Dense(16, activation="relu"), gluon.nn.Dense(2))
    net.initialize(mx.init.Xavier())
    net(mx.nd.zeros((1, 10)))  # materialise parameter shapes
    params = list(net.collect_params().values())
    loss_fn = gluon.loss.SoftmaxCrossEntropyLoss()

    # Servers apply SGD to the sum of all workers' gradients: rescale to the global mean.
    global_batch = args.batch_size * num_workers
    kv.set_optimizer(mx.optimizer.SGD(learning_rate=args.lr, rescale_grad=1.0 / global_batch))
    for key, param in enumerate(params):
        kv.init(key, param.data())  # rank 0's values win; init ends with a barrier
        kv.pull(key, out=param.data())

    for epoch in range(1, args.epochs + 1):
        if rank == args.fail_worker and epoch == args.fail_at_epoch:
            inject_failure(who, args.fail_mode, epoch)
        total = 0.0
        for batch in range(args.batches):
            rows = slice(batch * args.batch_size, (batch + 1) * args.batch_size)
            data, label = mx.nd.array(x[rows]), mx.nd.array(y[rows])
            with autograd.record():
                loss = loss_fn(net(data), label)
            loss.backward()
            for key, param in enumerate(params):
                kv.push(key, param.grad(), priority=-key)
                kv.pull(key, out=param.data(), priority=-key)
            total += float(loss.mean().asscalar())
            if args.sleep:
                time.sleep(args.sleep)
        say(who, f"epoch {epoch}/{args.epochs} mean loss {total / args.batches:.4f}")

    digest = hashlib.sha256()
    for param in params:
        digest.update(param.data().asnumpy().tobytes())
    print(f"worker rank {rank} checksum {digest.hexdigest()[:16]}", flush=True)


def inject_failure(who: str, mode: str, epoch: int) -> None:
    """Crash on purpose so tests can watch the launcher handle a dying worker."""
    say(who, f"injecting a failure at the start of epoch {epoch} (--fail-mode {mode})")
    if mode == "raise":
        raise RuntimeError(f"injected failure in {who} at epoch {epoch}")
    # os._exit, not sys.exit: a normal interpreter shutdown would wait forever in the
    # kvstore's finalize barrier for workers that are themselves waiting on us.
    sys.stderr.flush()
    os._exit(3)


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        role = check_env(os.environ)
    except ValueError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    if role != "worker":
        server_id = os.environ.get("DMLC_SERVER_ID")
        who = f"server {server_id}" if role == "server" and server_id else role
        say(who, "serving inside `import mxnet`; it exits when every worker has finished")
        import mxnet  # noqa: F401  (serves, then calls sys.exit)

        print(f"{PROG}: error: `import mxnet` returned in role {role}", file=sys.stderr)
        return 1
    train(args)
    return 0


if __name__ == "__main__":
    sys.exit(main())
