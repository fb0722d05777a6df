"""An MXNet dist_sync job in which one worker never creates the kvstore: the others wait in it.

`mxnet_skip_kvstore.py SKIPPING_TASK` (e.g. worker.1). The scheduler and servers serve inside
`import mxnet`; each worker prints `entering <task>` just before `mx.kv.create` (or its sleep).
"""

import os
import sys
import time

import mxnet as mx

task = os.environ.get("DTRAIN_TASK", "?")


def never_create_kvstore() -> None:
    time.sleep(3600)


print(f"entering {task}", flush=True)
if task == sys.argv[1]:
    never_create_kvstore()
else:
    kv = mx.kv.create("dist_sync")
    print(f"created {kv.rank}", flush=True)
