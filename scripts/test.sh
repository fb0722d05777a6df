#!/usr/bin/env bash
# Install everything the test suite needs, then run it: lint, types, and every test.
#
#   bash scripts/test.sh            # the whole suite (about 10 minutes on 2 cores)
#   bash scripts/test.sh -k ssh     # extra arguments go to pytest
#
# Needs root (sudo from another account): the suite builds its own ssh cluster (network
# namespaces, one sshd per host) and a Slurm cluster on it (slurmctld, one slurmd per host).
set -euo pipefail
cd "$(dirname "$0")/.."

if [ "$(id -u)" -ne 0 ]; then
    echo "scripts/test.sh: run as root (sudo): the suite creates network namespaces and sshd hosts" >&2
    exit 2
fi

step() { printf '\n== %s\n' "$*"; }

step "system packages: sshd, rsync, nftables, iptables, iproute2, pdsh, Slurm, Open MPI, MPICH, Grid Engine, podman, docker"
export DEBIAN_FRONTEND=noninteractive
if ! command -v sshd >/dev/null || ! command -v nft >/dev/null || ! command -v pdsh >/dev/null || ! command -v nc >/dev/null \
    || ! command -v slurmctld >/dev/null || ! command -v slurmd >/dev/null || ! command -v srun >/dev/null \
    || ! command -v mpirun.openmpi >/dev/null || ! command -v mpiexec.hydra >/dev/null \
    || ! [ -x /usr/lib/gridengine/sge_qmaster ] || ! [ -x /usr/lib/gridengine/sge_execd ] || ! command -v qrsh >/dev/null \
    || ! command -v podman >/dev/null || ! command -v runc >/dev/null || ! command -v dockerd >/dev/null; then
    apt-get update -qq
fi
# The tests start every daemon themselves (sshd per host; slurmctld and one slurmd per host, see
# tests/cluster/slurmcluster.py), never the system's: the image's /usr/sbin/policy-rc.d (exit
# 101) keeps the packages from starting sshd, slurmctld, slurmd or munge (pulled in by slurmd,
# unused: the test cluster runs auth/none) on install.
# Grid Engine: preseeded so its postinst asks nothing and configures no cell (the tests write
# their own, tests/cluster/sgecluster.py); it only creates the sgeadmin user.
for pkg in common master exec client; do
    echo "gridengine-$pkg shared/gridengineconfig boolean false"
done | debconf-set-selections
apt-get install -y -qq --no-install-recommends \
    openssh-server openssh-client rsync nftables iptables iproute2 pdsh procps util-linux \
    netcat-openbsd podman runc catatonit docker.io \
    slurmctld slurmd slurm-client \
    openmpi-bin mpich \
    gridengine-master gridengine-exec gridengine-client \
    >/dev/null

PYTHON=${PYTHON:-python3}
step "main virtualenv (.venv): dtrain, its dev tools, MXNet 1.9.1, PyTorch 2.13.0 (CPU)"
[ -x .venv/bin/python ] || "$PYTHON" -m venv .venv
# editable_mode=compat: a plain path to the checkout, not setuptools' editable finder, whose
# import at every interpreter start (~15 ms) would be timed in every dtrain start the
# benchmark measures and that an installed dtrain does not pay.
.venv/bin/pip install -q -e '.[dev,bench]' --config-settings editable_mode=compat \
    'mxnet==1.9.1' 'numpy<1.24' 'torch==2.13.0'

# TensorFlow and Paddle need a newer numpy than MXNet 1.9.1: each gets its own virtualenv.
step "TensorFlow virtualenv (.venvs/tf)"
[ -x .venvs/tf/bin/python ] || "$PYTHON" -m venv .venvs/tf
.venvs/tf/bin/pip install -q 'tensorflow-cpu==2.21.0'

step "PaddlePaddle virtualenv (.venvs/paddle)"
[ -x .venvs/paddle/bin/python ] || "$PYTHON" -m venv .venvs/paddle
.venvs/paddle/bin/pip install -q 'paddlepaddle==3.3.1'

# The transport tests also run on the oldest paramiko pyproject.toml allows (sshlib.py overrides
# one private method of paramiko's transport: a paramiko that changes it fails them).
step "paramiko floor virtualenv (.venvs/paramiko-floor): dtrain with paramiko 3.5.0"
[ -x .venvs/paramiko-floor/bin/python ] || "$PYTHON" -m venv .venvs/paramiko-floor
.venvs/paramiko-floor/bin/pip install -q -e . --config-settings editable_mode=compat \
    'paramiko==3.5.0' 'pytest>=8'

step "lint and types"
.venv/bin/ruff check dtrain tests examples bench
.venv/bin/ruff format --check dtrain tests examples bench
.venv/bin/mypy

step "transport tests on paramiko 3.5.0"
.venvs/paramiko-floor/bin/python -m pytest -q tests/transport

step "tests"
exec .venv/bin/python -m pytest tests "$@"
