"""`dtrain launch --image / --container` with tasks on this machine, with real podman.

The runtime gets a container store and configuration of the test's own through the environment
dtrain passes on (`CONTAINERS_STORAGE_CONF`, `CONTAINERS_CONF`): its own graph and run roots,
runc with its own state directory, host networking, ulimits under this machine's hard limits,
file locks and its own network configuration directory. Nothing of the machine's own store is
used; every container and the store itself are removed at the end.
"""

from __future__ import annotations

import functools
import json
import os
import shutil
import signal
import subprocess
import tempfile
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.cluster.podmancluster import IMAGE, LIST_PROCESSES, build_rootfs
from tests.conftest import (
    ROOT,
    job_processes,
    latest_job,
    program,
    run_dtrain,
    start_dtrain,
    wait_until,
)

BY_TASK = program("by_task.py")
MOUNT_ROOT = f"--container-arg=--volume={ROOT}:{ROOT}:ro"
SHOW = (
    "import os; e = os.environ; "
    "print(e['DTRAIN_TASK'], e['DMLC_ROLE'], os.path.exists('/run/.containerenv'), "
    "open('/proc/1/cmdline').read().split(chr(0))[0], flush=True)"
)


def _configs(root: Path) -> dict[str, str]:
    """The environment that gives podman a store and configuration under `root` alone (runc
    too: its state goes to /run/runc unless told, so it runs through a wrapper that tells it)."""
    runc = root / "bin" / "runc"
    runc.parent.mkdir()
    runc.write_text(f'#!/bin/sh\nexec {shutil.which("runc")} --root {root / "runc"} "$@"\n')
    runc.chmod(0o755)
    storage = root / "storage.conf"
    storage.write_text(
        f'[storage]\ndriver = "vfs"\ngraphroot = "{root / "graph"}"\nrunroot = "{root / "run"}"\n'
    )
    conf = root / "containers.conf"
    conf.write_text(
        "[containers]\n"
        'netns = "host"\n'
        'default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]\n'
        "[network]\n"
        f'network_config_dir = "{root / "networks"}"\n'
        "[engine]\n"
        'runtime = "runc"\n'
        'cgroup_manager = "cgroupfs"\n'
        'events_logger = "file"\n'
        'lock_type = "file"\n'
        f'tmp_dir = "{root / "tmp"}"\n'
        f'static_dir = "{root / "graph" / "libpod"}"\n'
        f'volume_path = "{root / "graph" / "volumes"}"\n'
        "[engine.runtimes]\n"
        f'runc = ["{runc}"]\n'
    )
    return {**os.environ, "CONTAINERS_STORAGE_CONF": str(storage), "CONTAINERS_CONF": str(conf)}


class Store:
    """podman on this machine with a store of its own and the test image in it."""

    def __init__(self, env: dict[str, str]) -> None:
        self.env = env

    def cli(self, *args: str, timeout: float = 60.0) -> str:
        done = subprocess.run(
            ["podman", *args],
            env=self.env,
            capture_output=True,
            text=True,
            timeout=timeout,
            stdin=subprocess.DEVNULL,
        )
        assert done.returncode == 0, done.stderr
        return done.stdout

    def containers(self) -> list[str]:
        return self.cli("ps", "-a", "--format", "{{.Names}}").split()

    def processes_in(self, name: str) -> list[str]:
        """Every process in container `name` but its init and its sleep."""
        out = self.cli("exec", name, "python3", "-S", "-c", LIST_PROCESSES)
        return [line for line in out.splitlines() if line.strip() and "sleep" not in line]


@pytest.fixture(scope="module")
def store() -> Iterator[Store]:
    for tool in ("podman", "runc", "unshare"):
        if shutil.which(tool) is None:
            pytest.fail(f"needs {tool} (scripts/test.sh installs podman and runc)")
    root = Path(tempfile.mkdtemp(prefix="dtrain-podman-here-"))
    made = Store(_configs(root))
    try:
        rootfs = build_rootfs(root / "rootfs.tar")
        # The import writes a blob cache under /var/lib/containers whatever the store: give
        # it a private tmpfs there, so the machine's own directory is never written.
        script = (
            "mount --make-rprivate / && mount -t tmpfs tmpfs /var/lib/containers && "
            f"podman import -q {rootfs} {IMAGE} >/dev/null"
        )
        if not Path("/var/lib/containers").is_dir():
            script = script.replace("mount -t tmpfs tmpfs /var/lib/containers && ", "")
        subprocess.run(["unshare", "-m", "sh", "-c", script], env=made.env, check=True, timeout=120)
        yield made
    finally:
        for args in (("rm", "-af", "-t", "0"), ("rmi", "-af")):
            subprocess.run(["podman", *args], env=made.env, capture_output=True, timeout=120)
        shutil.rmtree(root, ignore_errors=True)


def assert_nothing_left(store: Store, job: str, kept: tuple[str, ...] = ()) -> None:
    """No process of the job, no container but `kept`, each with nothing but its init."""
    assert wait_until(lambda: not job_processes(job)), job_processes(job)
    assert wait_until(lambda: sorted(store.containers()) == sorted(kept)), store.containers()
    for name in kept:
        assert wait_until(functools.partial(is_empty, store, name)), store.processes_in(name)


def is_empty(store: Store, name: str) -> bool:
    return not store.processes_in(name)


def where(store: Store, mode: str, cwd: Path) -> tuple[list[str], tuple[str, ...]]:
    """The container flags of `mode` and the containers that stay (a running one's)."""
    if mode == "image":
        return ["--image", IMAGE, MOUNT_ROOT], ()
    store.cli(
        "run", "-d", "--init", "--name", "train", "--network", "host", "--ipc", "host",
        "-v", f"{ROOT}:{ROOT}:ro", "-v", f"{cwd}:{cwd}", IMAGE, "sleep", "infinity",
    )  # fmt: skip
    return ["--container", "train"], ("train",)


@pytest.fixture
def kept(store: Store) -> Iterator[None]:
    """Each case starts and ends with no container in the store."""
    yield
    store.cli("rm", "-af", "-t", "0")


def test_local_roles_run_inside_a_fresh_container_and_nothing_stays(
    store: Store, tmp_path: Path, kept: None
) -> None:
    done = run_dtrain(
        ["launch", "-n", "2", "-s", "1", "--image", IMAGE, "--", "python3", "-S", "-c", SHOW],
        tmp_path,
        timeout_s=120,
        env=store.env,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 0, out
    for task, role in (
        ("scheduler", "scheduler"),
        ("server.0", "server"),
        ("worker.0", "worker"),
        ("worker.1", "worker"),
    ):
        assert f"{task} {role} True /run/podman-init" in out, out
    assert_nothing_left(store, latest_job(tmp_path).name)


@pytest.mark.parametrize("mode", ["image", "container"])
def test_local_container_fails_fast_with_the_tasks_code(
    store: Store, tmp_path: Path, kept: None, mode: str
) -> None:
    flags, stays = where(store, mode, tmp_path)
    args = ["launch", "-n", "2", "-s", "1", *flags, "--"]
    done = run_dtrain(
        [*args, "python3", BY_TASK, "worker.1=exit:7:0.5", "*=sleep"],
        tmp_path,
        timeout_s=120,
        env=store.env,
    )
    out = done.stdout + done.stderr
    assert done.returncode == 7, out
    assert "worker.1 exited with code 7" in out, out
    assert_nothing_left(store, latest_job(tmp_path).name, stays)


def wait_started(cwd: Path, timeout_s: float = 60.0) -> str:
    """The job id once its tasks all started."""

    def started() -> bool:
        try:
            return "tasks_started_at" in json.loads((latest_job(cwd) / "job.json").read_text())
        except (OSError, ValueError):
            return False

    assert wait_until(started, timeout_s)
    return latest_job(cwd).name


@pytest.mark.parametrize("mode", ["image", "container"])
def test_dtrain_sigkilled_leaves_no_process_and_no_container(
    store: Store, tmp_path: Path, kept: None, mode: str
) -> None:
    flags, stays = where(store, mode, tmp_path)
    launch = start_dtrain(
        ["launch", "-n", "2", *flags, "--", "python3", BY_TASK, "*=tree"],
        tmp_path,
        env=store.env,
    )
    try:
        job = wait_started(tmp_path)
        assert wait_until(lambda: len(job_processes(job)) >= 2 * 3)  # workers and sleepers
        launch.kill()
        code = launch.wait(timeout=60)
    finally:
        if launch.poll() is None:
            launch.kill()
        launch.communicate(timeout=10)
    assert code == -signal.SIGKILL
    assert_nothing_left(store, job, stays)


def test_ps_and_kill_without_hosts_see_into_this_machines_container(
    store: Store, tmp_path: Path, kept: None
) -> None:
    flags, stays = where(store, "container", tmp_path)
    launch = start_dtrain(
        ["launch", "-n", "1", *flags, "--", "python3", BY_TASK, "*=sleep"],
        tmp_path,
        env=store.env,
    )
    try:
        job = wait_started(tmp_path)
        shown = run_dtrain(["ps", "--container", "train"], tmp_path, env=store.env)
        assert shown.returncode == 0, shown.stderr
        assert job in shown.stdout and "worker.0" in shown.stdout, shown.stdout
        killed = run_dtrain(["kill", "--container", "train", "--job", job], tmp_path, env=store.env)
        assert killed.returncode == 0, killed.stdout + killed.stderr
        assert "stopped 3 of 3 processes" in killed.stdout, killed.stdout
        code = launch.wait(timeout=60)
    finally:
        if launch.poll() is None:
            launch.kill()
        launch.communicate(timeout=10)
    assert code == 128 + signal.SIGTERM  # the task's own death, as without a container
    assert_nothing_left(store, job, stays)
