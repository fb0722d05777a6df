#!/bin/bash
# MXNet parameter-server training in a Grid Engine job: `qsub examples/sge/mxnet_dist_sync.sh`
#
# dtrain runs the scheduler, 2 servers and 4 workers on the job's hosts ($PE_HOSTFILE), starts
# its agent on each other host with `qrsh -inherit` (no ssh between hosts: every task runs
# under the host's execd, is accounted to the job and ends with qdel), gives each task the
# DMLC_* variables ps-lite reads with its own host's address, stops the whole job at the first
# failure with that task's exit code, and leaves per-task logs in dtrain-logs/. The parallel
# environment must have `control_slaves TRUE` (`qconf -sp mpi` shows it; `qconf -spl` lists
# your site's); slots are spread over hosts as its allocation_rule says.
#
#$ -N mxnet-ps
#$ -pe mpi 6
#$ -cwd
#$ -j y
#$ -l h_rt=00:30:00
#
# The lines it replaces, written by hand (every role blind to the others: a crashed worker
# leaves the rest waiting in a barrier until the time limit):
#
#   first=$(head -n1 "$PE_HOSTFILE" | cut -d' ' -f1)
#   export DMLC_NUM_WORKER=4 DMLC_NUM_SERVER=2 DMLC_PS_ROOT_PORT=9091
#   export DMLC_PS_ROOT_URI=$(getent hosts "$first" | cut -d' ' -f1)
#   DMLC_ROLE=scheduler python train.py &
#   for h in $(cut -d' ' -f1 "$PE_HOSTFILE"); do
#     qrsh -inherit -V "$h" env DMLC_ROLE=server python train.py &   # and workers, per slot
#   done
#   wait
set -euo pipefail
DTRAIN=${DTRAIN:-dtrain}        # e.g. "python -m dtrain"
PYTHON=${PYTHON:-python3}
EXAMPLES=${EXAMPLES:-examples}

$DTRAIN launch -n 4 -s 2 -- "$PYTHON" "$EXAMPLES/mxnet_dist_sync.py" --epochs 2
