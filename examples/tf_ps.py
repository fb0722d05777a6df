"""A TensorFlow 2 parameter-server job on synthetic data, one script for every task.

dtrain gives each task TF_CONFIG; the task type picks the role:

    dtrain launch --framework tf --chief -s 1 -n 2 -- python examples/tf_ps.py --steps 200

In TF2's ParameterServerStrategy only the chief runs this program's training loop: it places
the variables on the ps tasks and schedules steps on the workers. Worker and ps tasks only
serve (``tf.distribute.Server.join()``) and never exit by themselves, so the job is done when
the chief exits. The chief prints ``chief done steps N loss L w_err E`` and exits 0 when
the model learned the synthetic target.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time

# Keep TF's C++ start-up chatter out of the task logs; real errors still print.
os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf

FEATURES = 8
BATCH = 64
TRUE_BIAS = 0.5
SERVER_TIMEOUT_EXIT = 75


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=200, help="steps the chief schedules")
    parser.add_argument("--lr", type=float, default=0.1, help="SGD learning rate")
    parser.add_argument(
        "--serve-timeout-s",
        type=float,
        default=None,
        help=f"worker/ps: exit {SERVER_TIMEOUT_EXIT} after this long instead of serving forever",
    )
    return parser.parse_args(argv)


def true_weights() -> tf.Tensor:
    return tf.reshape(tf.range(1, FEATURES + 1, dtype=tf.float32) / FEATURES, [FEATURES, 1])


def dataset_fn(_: tf.distribute.InputContext | None = None) -> tf.data.Dataset:
    """Runs on each worker; stateless ops keep the synthetic data identical everywhere."""
    x = tf.random.stateless_normal([2048, FEATURES], seed=[1, 2])
    y = tf.matmul(x, true_weights()) + TRUE_BIAS
    return tf.data.Dataset.from_tensor_slices((x, y)).shuffle(2048, seed=3).repeat().batch(BATCH)


def serve(resolver: tf.distribute.cluster_resolver.ClusterResolver, timeout_s: float | None) -> int:
    """Worker and ps tasks: start the gRPC server and wait for the chief's requests."""
    server = tf.distribute.Server(
        resolver.cluster_spec(),
        job_name=resolver.task_type,
        task_index=resolver.task_id,
        protocol=resolver.rpc_layer or "grpc",
        start=True,
    )
    print(f"{resolver.task_type}.{resolver.task_id} serving at {server.target}", flush=True)
    if timeout_s is None:
        server.join()  # never returns
        return 0
    time.sleep(timeout_s)
    print(f"{resolver.task_type}.{resolver.task_id} serve timeout after {timeout_s}s", flush=True)
    return SERVER_TIMEOUT_EXIT


def train(resolver: tf.distribute.cluster_resolver.ClusterResolver, steps: int, lr: float) -> int:
    """The chief (coordinator): variables live on ps, steps run on workers."""
    strategy = tf.distribute.experimental.ParameterServerStrategy(resolver)
    coordinator = tf.distribute.coordinator.ClusterCoordinator(strategy)
    with strategy.scope():
        weights = tf.Variable(tf.zeros([FEATURES, 1]), name="w")
        bias = tf.Variable(0.0, name="b")
    iterator = iter(coordinator.create_per_worker_dataset(dataset_fn))

    @tf.function  # type: ignore[untyped-decorator]
    def train_step(batches: tf.data.Iterator) -> tf.Tensor:
        def replica_fn(x: tf.Tensor, y: tf.Tensor) -> tf.Tensor:
            with tf.GradientTape() as tape:
                loss = tf.reduce_mean(tf.square(tf.matmul(x, weights) + bias - y))
            grad_w, grad_b = tape.gradient(loss, [weights, bias])
            weights.assign_sub(lr * grad_w)
            bias.assign_sub(lr * grad_b)
            return loss

        x, y = next(batches)
        losses = strategy.run(replica_fn, args=(x, y))
        return strategy.reduce(tf.distribute.ReduceOp.SUM, losses, axis=None)

    started = time.monotonic()
    last = None
    for _ in range(steps):
        last = coordinator.schedule(train_step, args=(iterator,))
    coordinator.join()
    loss = float(last.fetch()) if last is not None else float("nan")
    w_err = float(tf.reduce_max(tf.abs(weights.read_value() - true_weights())))
    elapsed = time.monotonic() - started
    print(
        f"chief done steps {steps} loss {loss:.6f} w_err {w_err:.4f} in {elapsed:.1f}s", flush=True
    )
    return 0 if w_err < 0.05 else 1


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    if not resolver.cluster_spec().jobs or resolver.task_type is None:
        print(
            "tf_ps: TF_CONFIG is missing or has no task: "
            + json.dumps(os.environ.get("TF_CONFIG")),
            file=sys.stderr,
        )
        return 2
    if resolver.task_type in ("worker", "ps"):
        return serve(resolver, args.serve_timeout_s)
    if resolver.task_type == "chief":
        return train(resolver, args.steps, args.lr)
    print(f"tf_ps: task type {resolver.task_type!r} has no role here", file=sys.stderr)
    return 2


if __name__ == "__main__":
    sys.exit(main())
