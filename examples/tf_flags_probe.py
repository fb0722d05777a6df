"""Print, as one JSON line, the cluster an old flag-style TensorFlow script would build.

Before TF_CONFIG, scripts took ``--ps_hosts --worker_hosts --job_name --task_index``; dtrain
fills them from the placeholders ``{ps_hosts}``, ``{worker_hosts}``, ``{job_name}`` and
``{task_index}``. Building a real ``tf.train.ClusterSpec`` shows the values are usable, not
just present.
"""

from __future__ import annotations

import argparse
import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf


def host_list(text: str) -> list[str]:
    return [item for item in text.split(",") if item]


def parse_args(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--ps_hosts", type=host_list, default=[], help="h:p,h:p of the ps tasks")
    parser.add_argument("--worker_hosts", type=host_list, required=True, help="h:p,... of workers")
    parser.add_argument("--job_name", choices=("ps", "worker"), required=True)
    parser.add_argument("--task_index", type=int, required=True)
    return parser.parse_args(argv)


def main(argv: list[str] | None = None) -> int:
    args = parse_args(argv)
    jobs = {"ps": args.ps_hosts, "worker": args.worker_hosts}
    spec = tf.train.ClusterSpec({name: hosts for name, hosts in jobs.items() if hosts})
    report = {
        "ps_hosts": args.ps_hosts,
        "worker_hosts": args.worker_hosts,
        "job_name": args.job_name,
        "task_index": args.task_index,
        "cluster_spec": spec.as_dict(),
        "task_address": spec.task_address(args.job_name, args.task_index),
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
    }
    print(json.dumps(report, sort_keys=True), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
