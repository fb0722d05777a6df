"""`dtrain launch --container / --image` with real podman on the namespaced ssh hosts.

The agent runs inside each host's container; every case ends with no process of the job in any
container and, with --image, no container left on any host.
"""

from __future__ import annotations

import functools
import importlib.util
import json
import os
import shutil
import signal
import subprocess
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from dtrain.remote import procs, proto
from tests.cluster.netcluster import Cluster, host_address
from tests.cluster.podmancluster import (
    IMAGE,
    DockerHosts,
    PodmanHosts,
    build_rootfs,
    framework_libraries,
)
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
    "print(e['DTRAIN_TASK'], e['DMLC_ROLE'], e['DMLC_NODE_HOST'], e['DMLC_PS_ROOT_URI'], "
    "any(map(os.path.exists, ('/run/.containerenv', '/.dockerenv'))), flush=True); "
    "import time; e['DMLC_ROLE'] != 'worker' and time.sleep(60)"
)


@pytest.fixture(scope="session")
def rootfs(tmp_path_factory: pytest.TempPathFactory) -> Path:
    torch = importlib.util.find_spec("torch")
    site = Path(torch.origin).parent.parent if torch and torch.origin else None
    extra = framework_libraries(site) if site is not None else []
    return build_rootfs(tmp_path_factory.mktemp("image") / "rootfs.tar", extra)


@pytest.fixture(params=["podman"])
def runtime(request: pytest.FixtureRequest) -> str:
    """The hosts' container runtime: podman, or (parametrized indirectly) docker."""
    name: str = request.param
    if name == "docker" and shutil.which("dockerd") is None:
        pytest.fail("docker cases need dockerd (Debian's docker.io; scripts/test.sh installs it)")
    return name


@pytest.fixture
def podman(
    make_cluster: Callable[[int], Cluster], rootfs: Path, runtime: str
) -> Iterator[PodmanHosts]:
    """Two hosts with the runtime and the test image; every container and store removed after."""
    kind = DockerHosts if runtime == "docker" else PodmanHosts
    hosts = kind(make_cluster(2), rootfs)
    try:
        hosts.start()
        yield hosts
    finally:
        hosts.stop()


def dtrain(podman: PodmanHosts, args: list[str], cwd: Path, timeout_s: float = 90) -> str:
    """Run `dtrain COMMAND -H hosts --ssh-config ... ARGS`; its output, exit code first."""
    command, *rest = args
    done = run_dtrain([command, *reach(podman), *rest], cwd, timeout_s=timeout_s)
    return f"{done.returncode}\n{done.stdout}{done.stderr}"


def start(podman: PodmanHosts, args: list[str], cwd: Path) -> subprocess.Popen[str]:
    return start_dtrain(["launch", *reach(podman), *args], cwd)


def reach(podman: PodmanHosts) -> list[str]:
    """The cluster's hosts and ssh config; docker named (podman is there too, and goes first)."""
    cluster = podman.cluster
    named = ["--container-runtime", "docker"] if podman.runtime == "docker" else []
    return ["-H", str(cluster.hosts_file()), "--ssh-config", str(cluster.ssh_config), *named]


def assert_nothing_left(podman: PodmanHosts, job: str, containers: tuple[str, ...] = ()) -> None:
    """No process of the job anywhere, and no container on any host but `containers`, each
    with nothing in it but its own init."""
    assert wait_until(lambda: not job_processes(job)), job_processes(job)
    for host in podman.cluster.hosts:
        assert wait_until(functools.partial(only_containers, podman, host.name, containers))
        for name in containers:
            assert wait_until(functools.partial(is_empty, podman, host.name, name))


def only_containers(podman: PodmanHosts, host: str, names: tuple[str, ...]) -> bool:
    return sorted(podman.container_names(host)) == sorted(names)


def is_empty(podman: PodmanHosts, host: str, container: str) -> bool:
    return not podman.processes_in(host, container)


def wait_started(cwd: Path, timeout_s: float = 60.0) -> str:
    """The job id once every host said its tasks started."""

    def started() -> bool:
        try:
            return "tasks_started_at" in json.loads((latest_job(cwd) / "job.json").read_text())
        except (OSError, ValueError):
            return False

    assert wait_until(started, timeout_s)
    return latest_job(cwd).name


def with_containers(podman: PodmanHosts, tmp_path: Path) -> None:
    for host in podman.cluster.hosts:
        podman.start_container(host, "train", mounts=(str(ROOT), str(tmp_path)))


@pytest.mark.parametrize("runtime", ["podman", "docker"], indirect=True)
def test_image_roles_and_addresses_come_from_inside_a_fresh_container_per_host(
    podman: PodmanHosts, tmp_path: Path
) -> None:
    out = dtrain(
        podman,
        ["launch", "-n", "2", "-s", "1", "--image", IMAGE, "--", "python3", "-S", "-c", SHOW],
        tmp_path,
    )
    assert out.startswith("0\n"), out
    first, second = host_address(1), host_address(2)
    shown = {line.split("] ", 1)[1] for line in out.splitlines() if "] " in line}
    assert f"scheduler scheduler {first} {first} True" in shown, out
    assert f"server.0 server {first} {first} True" in shown, out
    assert f"worker.0 worker {first} {first} True" in shown, out
    assert f"worker.1 worker {second} {first} True" in shown, out
    assert_nothing_left(podman, latest_job(tmp_path).name)


@pytest.mark.parametrize("runtime", ["podman", "docker"], indirect=True)
def test_container_fails_fast_with_the_tasks_code_and_leaves_nothing_inside(
    podman: PodmanHosts, tmp_path: Path
) -> None:
    with_containers(podman, tmp_path)
    args = ["launch", "-n", "2", "-s", "1", "--container", "train", "--"]
    out = dtrain(podman, [*args, "python3", BY_TASK, "worker.1=exit:7:0.5", "*=sleep"], tmp_path)
    assert out.startswith("7\n"), out
    assert "worker.1@h2 exited with code 7" in out, out
    assert_nothing_left(podman, latest_job(tmp_path).name, ("train",))


@pytest.mark.parametrize(
    ("how", "mode", "runtime"),
    [
        *(
            (how, mode, "podman")
            for how in ("sigkill", "ctrl-c", "timeout")
            for mode in ("image", "container")
        ),
        ("sigkill", "image", "docker"),
        ("ctrl-c", "container", "docker"),
        ("timeout", "image", "docker"),
    ],
    indirect=["runtime"],
)
def test_the_launcher_killed_interrupted_or_timed_out_leaves_nothing(
    podman: PodmanHosts, tmp_path: Path, how: str, mode: str
) -> None:
    if mode == "container":
        with_containers(podman, tmp_path)
        where = ["--container", "train"]
    else:
        where = ["--image", IMAGE, MOUNT_ROOT]
    limit = ["--timeout", "4"] if how == "timeout" else []
    launch = start(
        podman, ["-n", "2", *where, *limit, "--", "python3", BY_TASK, "*=tree"], tmp_path
    )
    try:
        job = wait_started(tmp_path)
        assert wait_until(lambda: len(job_processes(job)) >= 2 * 3)  # workers and sleepers
        if how == "sigkill":
            launch.kill()
        elif how == "ctrl-c":
            launch.send_signal(signal.SIGINT)
        code = launch.wait(timeout=60)
    finally:
        if launch.poll() is None:
            launch.kill()
        launch.communicate(timeout=10)
    assert code == {"sigkill": -9, "ctrl-c": 130, "timeout": 124}[how]
    assert_nothing_left(podman, job, ("train",) if mode == "container" else ())


@pytest.mark.parametrize("mode", ["image", "container"])
def test_the_agent_killed_inside_a_container_takes_its_tasks_along(
    podman: PodmanHosts, tmp_path: Path, mode: str
) -> None:
    if mode == "container":
        with_containers(podman, tmp_path)
        where = ["--container", "train"]
    else:
        where = ["--image", IMAGE, MOUNT_ROOT]
    args = ["-n", "2", *where, "--", "python3", BY_TASK, "*=tree"]
    launch = start(podman, args, tmp_path)
    try:
        job = wait_started(tmp_path)
        assert wait_until(lambda: len(job_processes(job)) >= 2 * 3)  # workers and sleepers
        table = procs.snapshot()
        tagged = {p for p, proc in table.items() if proc.tags.get(proto.JOB_ID_VAR) == job}
        agents = {table[pid].ppid for pid in tagged if table[pid].ppid not in tagged}
        assert len(agents) == 2  # one agent per host, each inside its container
        os.kill(min(agents), signal.SIGKILL)
        code = launch.wait(timeout=60)
    finally:
        if launch.poll() is None:
            launch.kill()
        launch.communicate(timeout=10)
    assert code == 255  # the host is lost
    assert_nothing_left(podman, job, ("train",) if mode == "container" else ())


def test_a_pytorch_ddp_job_trains_inside_fresh_containers(
    podman: PodmanHosts, tmp_path: Path
) -> None:
    venv = Path("/work/main/.venv")
    config = (venv / "pyvenv.cfg").read_text() if venv.is_dir() else ""
    home = next(
        (line.split("=", 1)[1].strip() for line in config.splitlines() if line.startswith("home")),
        "",
    )
    if not home or importlib.util.find_spec("torch") is None:
        pytest.skip("needs the main venv with PyTorch")
    base = str(Path(home).parent)  # the venv's own python, mounted read-only as it is
    mounts = [f"--container-arg=--volume={p}:{p}:ro" for p in (str(venv), base, str(ROOT))]
    out = dtrain(
        podman,
        [
            "launch",
            "--framework",
            "torch",
            "-n",
            "2",
            "--image",
            IMAGE,
            *mounts,
            "--",
            str(venv / "bin" / "python"),
            str(ROOT / "examples" / "torch_ddp.py"),
            "--steps",
            "5",
        ],
        tmp_path,
        timeout_s=240,
    )
    assert out.startswith("0\n"), out
    sums = [
        line.split("checksum", 1)[1].split()[0] for line in out.splitlines() if "checksum" in line
    ]
    assert len(sums) == 2 and len(set(sums)) == 1, out
    assert_nothing_left(podman, latest_job(tmp_path).name)


def test_ps_stacks_and_kill_see_into_the_container(podman: PodmanHosts, tmp_path: Path) -> None:
    with_containers(podman, tmp_path)
    args = ["-n", "2", "--container", "train", "--", "python3", BY_TASK, "*=sleep"]
    launch = start(podman, args, tmp_path)
    try:
        job = wait_started(tmp_path)
        seen = dtrain(podman, ["ps", "--container", "train", "--json"], tmp_path)
        assert seen.startswith("0\n"), seen
        assert seen.count('"worker.') >= 2 and job in seen, seen
        outside = dtrain(podman, ["ps", "--json"], tmp_path)  # the hosts themselves: none
        assert job not in outside, outside
        stacks = dtrain(podman, ["stacks", "--container", "train", "--job", job], tmp_path)
        assert "py-spy" in stacks, stacks
        killed = dtrain(podman, ["kill", "--container", "train", "--job", job], tmp_path)
        assert killed.startswith("0\n"), killed
        code = launch.wait(timeout=60)
    finally:
        if launch.poll() is None:
            launch.kill()
        launch.communicate(timeout=10)
    assert code != 0
    assert_nothing_left(podman, job, ("train",))


def test_doctor_checks_inside_the_container(podman: PodmanHosts, tmp_path: Path) -> None:
    with_containers(podman, tmp_path)
    out = dtrain(podman, ["doctor", "--container", "train", "--json"], tmp_path)
    document = json.loads(out.split("\n", 1)[1].split("\ndtrain:", 1)[0])
    python = {r["host"]: r for r in document["data"]["results"] if r["check"] == "python"}
    assert sorted(python) == ["h1", "h2"], out  # this machine runs no task of such a job
    for host in ("h1", "h2"):  # the image's python, not the hosts' own (a pyenv shim here)
        assert python[host]["detail"] == "python3 runs /usr/bin/python3 3.11.2", out
    assert document["status"] == "ok", out
    missing = dtrain(podman, ["doctor", "--container", "nosuch"], tmp_path)
    assert "container nosuch is not running on h1 (podman)" in missing, missing


@pytest.mark.parametrize(
    "case",
    [
        "container-not-running",
        "image-missing",
        "no-python3",
        "no-runtime",
        "runtime-without-daemon",
    ],
)
def test_bad_input_is_one_line_and_nothing_starts_anywhere(
    podman: PodmanHosts, tmp_path: Path, case: str
) -> None:
    first, second = podman.cluster.hosts
    runtime: list[str] = []
    if case == "container-not-running":
        podman.start_container(first, "train")  # on one host only
        where, expected = ["--container", "train"], "container train is not running on h2 (podman)"
    elif case == "image-missing":
        podman.cli(second, "rmi", IMAGE, check=True)
        where, expected = ["--image", IMAGE], f"image {IMAGE} is not on h2 (podman)"
    elif case == "no-python3":
        bare = "localhost/no-python:1"
        for host in podman.cluster.hosts:
            podman.cluster.run(
                host,
                f"tar -C / -c usr/bin/dash | podman import -q - {bare}",
                timeout=60,
                check=True,
            )
        where, expected = ["--image", bare], f"no python3 >= 3.6 in image {bare} on h1 (podman)"
    else:
        podman.cluster.hide_path(second, "/usr/bin/podman")  # h2: only the docker CLI
        runtime = ["--container-runtime", "docker"] if case == "runtime-without-daemon" else []
        where, expected = ["--image", IMAGE, *runtime], "no container runtime on h2"
    out = dtrain(podman, ["launch", "-n", "2", *where, "--", "python3", BY_TASK], tmp_path)
    assert out.startswith("3\n"), out
    assert expected in out, out
    assert "Traceback" not in out
    left = {first.name: ("train",) if case == "container-not-running" else ()}
    if "runtime" not in case:  # h2 still has podman to ask
        left[second.name] = ()
    for name, names in left.items():
        assert wait_until(functools.partial(only_containers, podman, name, names))
    if case == "container-not-running":
        assert not podman.processes_in(first, "train")
