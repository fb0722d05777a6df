"""dtrain through each engine against that engine used by hand (phases of `python -m bench`).

Each phase builds its own real cluster from the suite's (tests/cluster/), runs the ways
interleaved, repetition after repetition, and returns plain records:

- slurm: inside one allocation of every node, `dtrain launch` against `srun --overlap`
  (and, after a failure, `srun -K`, which stops the step);
- mpi: `dtrain --launcher mpi` against Open MPI's `mpirun --map-by ppr:T:node`, both through
  the same ssh wrapper and kept to the cluster's subnet;
- sge: from a shell of one PE job holding every slot, `dtrain launch` against one
  `qrsh -inherit` per slot and a `wait`;
- containers: `dtrain --image` / `--container` against `ssh host podman run --rm` /
  `ssh host podman exec` on every host at once.

Mode "stamp": every task (bench/task.py) stamps its start and exits 0. Mode "fail": the first
task to start exits 7 once all have, the rest sleep; recorded are the time from that exit to
the command's and the tasks still alive then. A command still running at the cap is killed and
recorded as never ending. Everything is stopped at the end whatever happens; traffic stays on
the suite's bridge.
"""

from __future__ import annotations

import os
import shlex
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Mapping, Sequence
from pathlib import Path
from typing import Any

from bench import procs
from bench.launchers import task_argv
from bench.scenarios import rotated
from tests.cluster.netcluster import SUBNET, Cluster, assert_routes_to_bridge

PYTHON = sys.executable
LIFE_S = 60.0  # every task ends by itself within this
STAMP_CAP_S = 60.0
MPIRUN = "mpirun.openmpi"
Start = Callable[[Sequence[str]], "subprocess.Popen[bytes]"]
Record = dict[str, Any]


def quiet(argv: Sequence[str], env: Mapping[str, str], cwd: Path) -> subprocess.Popen[bytes]:
    """A command started in its own session, its output thrown away."""
    null = subprocess.DEVNULL
    return subprocess.Popen(
        argv, env=env, cwd=cwd, stdin=null, stdout=null, stderr=null, start_new_session=True
    )


def time_one(
    start: Start, base: Record, mode: str, tasks: int, scratch: Path, cap_s: float
) -> Record:
    """One run of the command `start` makes for the task: its wall time, when its last task
    started, and after a failure the teardown and the tasks alive at its exit."""
    stamps = Path(tempfile.mkdtemp(prefix=f"{mode}-", dir=scratch))
    began = time.time()
    popen = start(task_argv(stamps, mode, tasks, LIFE_S))
    try:
        code: int | None = popen.wait(cap_s)
    except subprocess.TimeoutExpired:
        code = None
    ended = time.time()
    starts = [float(p.read_text()) for p in stamps.glob("*.start")]
    record = {**base, "mode": mode, "exit": code, "wall_s": ended - began}
    record["launch_s"] = max(starts) - began if len(starts) == tasks else None
    if mode == "fail":
        failed = stamps / "failed"
        ends = code is not None and failed.exists()
        record["teardown_s"] = ended - float(failed.read_text()) if ends else None
        left = procs.tasks(str(stamps))
        record["alive_at_exit"] = len(left)
        procs.kill(left, signal.SIGUSR1)  # the task's own clean exit (bench/task.py)
        procs.wait_gone(left, 10.0)
    if popen.poll() is None:
        procs.killpg(popen.pid)
        popen.wait()
    return record


def interleave(
    scenario: str,
    ways: Mapping[str, Start],
    modes: Mapping[str, Sequence[str]],
    shape: tuple[int, int],
    reps: int,
    scratch: Path,
    cap_s: float,
) -> list[Record]:
    """Every way of every mode once per repetition, the order rotating."""
    hosts, per_host = shape
    records = []
    for rep in range(reps):
        for mode, names in modes.items():
            for name in rotated(names, rep):
                base = {"scenario": scenario, "launcher": name, "rep": rep, "hosts": hosts}
                base["per_host"] = per_host
                cap = cap_s if mode == "fail" else STAMP_CAP_S
                records.append(time_one(ways[name], base, mode, hosts * per_host, scratch, cap))
    return records


def dtrain_argv(tasks: int, logs: Path, *flags: str) -> list[str]:
    """`dtrain launch` of `tasks` ranks; the task's argv goes after it."""
    argv = [PYTHON, "-m", "dtrain", "launch", "--framework", "torch", "--log-dir", str(logs)]
    return [*argv, *flags, "-n", str(tasks), "--"]


def slurm(shape: tuple[int, int], reps: int, cap_s: float) -> list[Record]:
    from tests.cluster.slurmcluster import SlurmCluster

    nodes, per_host = shape
    with (
        tempfile.TemporaryDirectory(prefix="bench-slurm-") as tmp,
        Cluster(nodes) as cluster,
        SlurmCluster(cluster, cpus_per_node=per_host) as cluster_slurm,
    ):
        assert_routes_to_bridge(cluster)
        scratch = Path(tmp)
        allocate = ["salloc", f"-N{nodes}", f"--ntasks-per-node={per_host}", "--no-shell"]
        cluster_slurm.spawn(allocate).popen.wait(30)
        job_id = cluster_slurm.squeue("-h", "-o", "%i", check=True).stdout.split()[0]
        env = {**cluster_slurm.client_env(), "SLURM_JOB_ID": job_id}  # a shell inside it
        env |= {"SLURM_JOB_NODELIST": f"h[1-{nodes}]"}
        env |= {"SLURM_TASKS_PER_NODE": f"{per_host}(x{nodes})"}
        dtrain = dtrain_argv(nodes * per_host, scratch / "logs")
        srun = ["srun", "--overlap", f"-N{nodes}", f"--ntasks-per-node={per_host}"]
        ways: dict[str, Start] = {
            "dtrain": lambda task: quiet([*dtrain, *task], env, scratch),
            "srun": lambda task: quiet([*srun, *task], env, scratch),
            "srun -K": lambda task: quiet([*srun, "--kill-on-bad-exit=1", *task], env, scratch),
        }
        modes = {"stamp": ("dtrain", "srun"), "fail": ("dtrain", "srun -K", "srun")}
        try:
            return interleave("slurm", ways, modes, shape, reps, scratch, cap_s)
        finally:
            cluster_slurm.scancel(job_id)


def mpi(shape: tuple[int, int], reps: int, cap_s: float) -> list[Record]:
    hosts, per_host = shape
    with tempfile.TemporaryDirectory(prefix="bench-mpi-") as tmp, Cluster(hosts) as cluster:
        assert_routes_to_bridge(cluster)
        scratch = Path(tmp)
        wrapper = scratch / "ssh"
        wrapper.write_text(f'#!/bin/sh\nexec ssh -F {cluster.ssh_config} -o BatchMode=yes "$@"\n')
        wrapper.chmod(0o700)
        tasks = hosts * per_host
        subnet = ["--mca", "oob_tcp_if_include", SUBNET]
        placed = ",".join(f"{h.name}:{per_host}" for h in cluster.hosts)
        mpirun = [MPIRUN, "--allow-run-as-root", "-n", str(tasks), "-H", placed]
        mpirun += ["--map-by", f"ppr:{per_host}:node", "--mca", "plm_rsh_agent", str(wrapper)]
        dtrain = dtrain_argv(
            tasks, scratch / "logs", "--launcher", "mpi", "--mpirun", MPIRUN,
            "-H", str(cluster.hosts_file(slots=per_host)), "--ssh-config", str(cluster.ssh_config),
            *(f"--mpi-arg={arg}" for arg in subnet),
        )  # fmt: skip
        env = dict(os.environ)
        ways: dict[str, Start] = {
            "dtrain --launcher mpi": lambda task: quiet([*dtrain, *task], env, scratch),
            "mpirun": lambda task: quiet([*mpirun, *subnet, *task], env, scratch),
        }
        modes = {"stamp": tuple(ways), "fail": tuple(ways)}
        return interleave("mpi", ways, modes, shape, reps, scratch, cap_s)


def sge(shape: tuple[int, int], reps: int, cap_s: float) -> list[Record]:
    from tests.cluster.sgecluster import SgeCluster

    hosts, per_host = shape
    with (
        tempfile.TemporaryDirectory(prefix="bench-sge-") as tmp,
        Cluster(hosts) as cluster,
        SgeCluster(cluster, slots_per_host=per_host) as grid,
    ):
        assert_routes_to_bridge(cluster)
        scratch = Path(tmp)
        scratch.chmod(0o755)
        job, first, env = _hold_job(grid, hosts * per_host, scratch)
        slots = [line.split()[0] for line in Path(env["PE_HOSTFILE"]).read_text().splitlines()]
        dtrain = dtrain_argv(hosts * per_host, scratch / "logs")

        def by_hand(task: Sequence[str]) -> str:
            one = shlex.quote(shlex.join(task))
            starts = [
                f"qrsh -inherit -nostdin -V {h} {one} &" for h in slots for _ in range(per_host)
            ]
            return "\n".join([*starts, "wait"])

        def inside(script: str) -> subprocess.Popen[bytes]:
            """From a shell of the job, on its first host."""
            return grid.spawn(["sh", "-c", script], first, env=env).popen

        ways: dict[str, Start] = {
            "dtrain": lambda task: inside(shlex.join([*dtrain, *task])),
            "qrsh -inherit": lambda task: inside(by_hand(task)),
        }
        try:
            return interleave("sge", ways, {"stamp": tuple(ways)}, shape, reps, scratch, cap_s)
        finally:
            grid.qdel(job)


def _hold_job(grid: Any, slots: int, scratch: Path) -> tuple[str, str, dict[str, str]]:
    """A PE job of every slot that sleeps; its id, first host and environment."""
    env_file = scratch / "job.env"
    body = f"hostname > {scratch}/master; env -0 > {env_file}.tmp; mv {env_file}.tmp {env_file}"
    job: str = grid.submit(f"{body}\nsleep {LIFE_S * 20:g}", slots, cwd=scratch)
    deadline = time.monotonic() + 60
    while not env_file.exists():
        if time.monotonic() > deadline:
            raise RuntimeError(f"Grid Engine job {job} did not start within 60 s")
        time.sleep(0.1)
    pairs = (i.split("=", 1) for i in env_file.read_text().split("\0") if "=" in i)
    return job, (scratch / "master").read_text().strip(), dict(pairs)


def containers(hosts: int, reps: int) -> list[Record]:
    """Whole commands only (`python3 -S -c pass` in the container): with `--image`, until the
    command has exited and its container is gone from every host."""
    from tests.cluster.podmancluster import IMAGE, PodmanHosts, build_rootfs

    task = ["python3", "-S", "-c", "pass"]
    with tempfile.TemporaryDirectory(prefix="bench-containers-") as tmp:
        cwd = Path(tmp)
        rootfs = build_rootfs(cwd / "rootfs.tar")
        with Cluster(hosts) as cluster:
            podman = PodmanHosts(cluster, rootfs)
            env = dict(os.environ)

            def by_hand(*podman_args: str) -> list[subprocess.Popen[bytes]]:
                remote = shlex.join(["podman", *podman_args, *task])
                return [quiet([*cluster.ssh_argv(h), remote], env, cwd) for h in cluster.hosts]

            def dtrain(*flags: str) -> list[subprocess.Popen[bytes]]:
                argv = [PYTHON, "-m", "dtrain", "launch", "-H", str(cluster.hosts_file())]
                argv += ["--ssh-config", str(cluster.ssh_config), "-n", str(hosts)]
                return [quiet([*argv, *flags, "--", *task], env, cwd)]

            run = ["run", "--rm", "-i", "--init", "--network", "host", "--ipc", "host", IMAGE]
            ways: dict[str, tuple[Callable[[], list[subprocess.Popen[bytes]]], bool]] = {
                "dtrain --image": (lambda: dtrain("--image", IMAGE), True),
                "ssh podman run": (lambda: by_hand(*run), True),
                "dtrain --container": (lambda: dtrain("--container", "train"), False),
                "ssh podman exec": (lambda: by_hand("exec", "-i", "train"), False),
            }
            records: list[Record] = []
            try:
                podman.start()
                for host in cluster.hosts:
                    podman.start_container(host, "train", mounts=(str(cwd),))
                for rep in range(reps):
                    for name in rotated(list(ways), rep):
                        start, removes = ways[name]
                        began = time.monotonic()
                        for proc in start():
                            if proc.wait(timeout=STAMP_CAP_S) != 0:
                                raise RuntimeError(f"{name} exited {proc.returncode}")
                        while removes and any(
                            podman.container_names(h) != ["train"] for h in cluster.hosts
                        ):
                            if time.monotonic() > began + STAMP_CAP_S:
                                raise RuntimeError(f"{name} left a container behind")
                            time.sleep(0.02)
                        base = {
                            "scenario": "containers",
                            "launcher": name,
                            "rep": rep,
                            "mode": "stamp",
                        }
                        wall = time.monotonic() - began
                        records.append({**base, "hosts": hosts, "per_host": 1, "wall_s": wall})
            finally:
                podman.stop()
    return records
