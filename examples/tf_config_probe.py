"""Print, as one JSON line, what TensorFlow itself makes of this process's TF_CONFIG.

Tests run it under ``dtrain launch --framework tf`` to check that the TF_CONFIG dtrain wrote is
read back by TFConfigClusterResolver as intended (a hand-made JSON parse would not prove that).
"""

from __future__ import annotations

import json
import os
import sys

os.environ.setdefault("TF_CPP_MIN_LOG_LEVEL", "2")

import tensorflow as tf


def main() -> int:
    resolver = tf.distribute.cluster_resolver.TFConfigClusterResolver()
    spec = resolver.cluster_spec()
    task_type, task_id = resolver.task_type, resolver.task_id
    address = None
    if task_type is not None and task_id is not None and task_type in spec.jobs:
        address = spec.task_address(task_type, task_id)
    report = {
        "cluster_spec": spec.as_dict(),
        "task_type": task_type,
        "task_id": task_id,
        "task_address": address,
        "rpc_layer": resolver.rpc_layer,
        "cuda_visible_devices": os.environ.get("CUDA_VISIBLE_DEVICES"),
        "tf_version": tf.__version__,
    }
    print(json.dumps(report, sort_keys=True), flush=True)
    return 0 if spec.jobs and task_type is not None else 1


if __name__ == "__main__":
    sys.exit(main())
