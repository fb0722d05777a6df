"""The container spec, the runtime client's argv and the host script (dtrain/containers.py).

The host script runs under a real `sh` here, with stand-in runtimes (small shell scripts named
podman and docker that record their argv) on a PATH of their own: the real runtimes are tested
on the cluster (tests/cluster/test_containers_ssh.py).
"""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtrain import containers
from dtrain.containers import ContainerSpec, client_argv, for_job, from_flags, host_script
from dtrain.errors import UsageError
from dtrain.transport.local import LocalLink
from tests.conftest import run_dtrain

STAND_IN = """#!/bin/sh
# a stand-in runtime: answers the host script's questions from the environment, records argv
case "$1" in
  version) [ "$FAKE_DAEMON" = yes ]; exit $? ;;
  container) [ "$FAKE_RUNNING" = yes ] && echo true || echo false; exit 0 ;;
  image) [ "$FAKE_IMAGE" = yes ]; exit $? ;;
esac
for i in 1 2 3 4 5 6 7 8; do [ -e "$FAKE_LOG.$i" ] || break; done
for arg in "$@"; do printf '%s\\0' "$arg"; done > "$FAKE_LOG.$i"
exit "${FAKE_EXIT:-0}"
"""


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("a", "img", None, ()), "--container and --image exclude each other"),
        ((None, None, "podman", ()), "--container-runtime needs --container NAME or --image"),
        ((None, None, None, ("-v",)), "--container-arg needs --container NAME or --image"),
        (("a", None, None, ("-v",)), "--container-arg is for --image"),
        (("-rf", None, None, ()), "--container '-rf' is not a container name"),
        (("a b", None, None, ()), "--container 'a b' is not a container name"),
        ((None, "--privileged", None, ()), "--image '--privileged' is not an image reference"),
        ((None, "a b", None, ()), "--image 'a b' is not an image reference"),
        ((None, "x$(id)", None, ()), "--image 'x$(id)' is not an image reference"),
        (("a", None, "lxc", ()), "--container-runtime 'lxc' is not one dtrain knows"),
    ],
)
def test_bad_container_flags_are_one_usage_line(
    flags: tuple[str | None, str | None, str | None, tuple[str, ...]], message: str
) -> None:
    with pytest.raises(UsageError) as caught:
        from_flags(*flags)
    assert caught.value.what.startswith(message)
    assert caught.value.hint


def test_good_flags_make_a_spec_and_none_make_none() -> None:
    assert from_flags(None) is None
    assert from_flags("train", runtime="docker") == ContainerSpec(
        container="train", runtime="docker"
    )
    spec = from_flags(None, "localhost/x:1", None, ["--gpus=all"])
    assert spec == ContainerSpec(image="localhost/x:1", args=("--gpus=all",))
    assert spec.is_fresh and spec.shown == "image localhost/x:1"


def test_a_fresh_container_is_named_after_the_job_and_mounts_its_directories() -> None:
    spec = for_job(ContainerSpec(image="img"), "20261127-1830-ab/c", ["/w", "", "/w", "/dst"])
    assert spec.name == "dtrain-20261127-1830-ab-c"
    assert spec.mounts == ("/w", "/dst")
    running = for_job(ContainerSpec(container="train"), "job", ["/w"])
    assert running == ContainerSpec(container="train", job_id="job")


def test_a_directory_the_runtime_cannot_mount_is_one_usage_line() -> None:
    with pytest.raises(UsageError) as caught:
        for_job(ContainerSpec(image="img"), "job", ["/data/a:b"])
    assert (
        caught.value.what == "--image: cannot mount '/data/a:b' into the container: it holds a ':'"
    )


def test_the_clients_argv_for_exec_and_for_run() -> None:
    assert client_argv(ContainerSpec(container="train"), "podman", ["sh", "-c", "x"]) == [
        "podman", "exec", "-i", "-e", "SSH_CONNECTION", "train", "sh", "-c", "x"
    ]  # fmt: skip
    fresh = for_job(ContainerSpec(image="img", args=("--gpus", "all")), "job1", ["/w d"])
    assert client_argv(fresh, "docker", ["sh"]) == [
        "docker", "run", "--rm", "-i", "--init", "--pull", "never",
        "--network", "host", "--ipc", "host",
        "--name", "dtrain-job1", "--label", "dtrain.job=job1", "-v", "/w d:/w d",
        "-e", "SSH_CONNECTION", "--gpus", "all", "img", "sh",
    ]  # fmt: skip


@pytest.fixture
def bin_dir(tmp_path: Path) -> Path:
    """A PATH with only what the host script needs and no real runtime."""
    folder = tmp_path / "bin"
    folder.mkdir()
    for tool in ("uname", "mkdir", "cat"):
        found = shutil.which(tool)
        assert found is not None
        (folder / tool).symlink_to(found)
    return folder


def stand_in(bin_dir: Path, name: str) -> None:
    path = bin_dir / name
    path.write_text(STAND_IN)
    path.chmod(0o755)


def run_script(
    spec: ContainerSpec, bin_dir: Path, inner: list[str], **fake: str
) -> tuple[subprocess.CompletedProcess[str], list[list[str]]]:
    log = bin_dir.parent / "argv.log"
    env = {
        "PATH": str(bin_dir),
        "FAKE_LOG": str(log),
        **{f"FAKE_{k.upper()}": v for k, v in fake.items()},
    }
    done = subprocess.run(
        ["/bin/sh", "-c", host_script(spec, inner)],
        env=env,
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    calls = []
    for i in range(1, 9):  # one file per call, each argument ended by a NUL
        path = log.with_name(f"{log.name}.{i}")
        if path.exists():
            calls.append(path.read_bytes().decode().split("\0")[:-1])
    return done, calls


def test_exec_runs_the_agent_in_the_running_container(bin_dir: Path) -> None:
    stand_in(bin_dir, "podman")
    done, calls = run_script(
        ContainerSpec(container="train"), bin_dir, ["sh", "-c", "a b"], running="yes"
    )
    assert done.returncode == 0, done.stderr
    assert calls == [["exec", "-i", "-e", "SSH_CONNECTION", "train", "sh", "-c", "a b"]]


def test_a_container_that_is_not_running_is_named_in_one_line(bin_dir: Path) -> None:
    stand_in(bin_dir, "podman")
    done, calls = run_script(
        ContainerSpec(container="train"), bin_dir, ["sh"], running="no", exit="125"
    )
    assert done.returncode == containers.REFUSED_EXIT and [c[0] for c in calls] == ["exec"]
    host = os.uname().nodename
    assert done.stderr == (
        f"dtrain: container train is not running on {host} (podman): start it there first, "
        "or use --image IMAGE\n"
    )


def test_a_missing_image_is_named_once_the_run_failed_for_it_never_pulled(bin_dir: Path) -> None:
    stand_in(bin_dir, "podman")
    done, calls = run_script(ContainerSpec(image="img"), bin_dir, ["sh"], image="no", exit="125")
    assert done.returncode == containers.REFUSED_EXIT and [c[0] for c in calls] == ["run"]
    assert done.stderr.startswith("dtrain: image img is not on ")


def test_a_docker_cli_without_its_daemon_is_no_runtime(bin_dir: Path) -> None:
    stand_in(bin_dir, "docker")
    done, calls = run_script(ContainerSpec(image="img"), bin_dir, ["sh"], daemon="no", image="yes")
    assert done.returncode == containers.REFUSED_EXIT and calls == []
    assert "dtrain: no container runtime on " in done.stderr
    assert done.stderr.count("\n") == 1
    done, calls = run_script(ContainerSpec(image="img"), bin_dir, ["sh"], daemon="yes", image="yes")
    assert done.returncode == 0 and calls[0][:2] == ["run", "--rm"]


def test_the_named_runtime_is_the_only_one_tried(bin_dir: Path) -> None:
    stand_in(bin_dir, "podman")
    spec = ContainerSpec(container="train", runtime="docker")
    done, calls = run_script(spec, bin_dir, ["sh"], running="yes")
    assert done.returncode == containers.REFUSED_EXIT and calls == []
    assert "(tried docker;" in done.stderr


def test_a_container_without_python_is_named_after_the_agent_fails(bin_dir: Path) -> None:
    stand_in(bin_dir, "podman")
    done, calls = run_script(
        ContainerSpec(container="train"), bin_dir, ["sh"], running="yes", exit="127"
    )
    assert done.returncode == 127
    assert calls[1] == ["exec", "train", "python3", "-S", "-c", ""]  # the probe
    assert done.stderr.splitlines()[-1].startswith("dtrain: no python3 >= 3.6 in container train")


ARG_CHARS = st.characters(codec="utf-8", exclude_characters="\0")  # what an argv can hold


@settings(max_examples=40, deadline=None)
@given(
    inner=st.lists(st.text(ARG_CHARS, max_size=12), max_size=4),
    args=st.lists(
        st.text(ARG_CHARS, min_size=1, max_size=8),
        max_size=3,
    ),
)
def test_argv_reaches_the_runtime_byte_for_byte(
    tmp_path_factory: pytest.TempPathFactory, inner: list[str], args: list[str]
) -> None:
    folder = tmp_path_factory.mktemp("case") / "bin"
    folder.mkdir()
    for tool in ("uname", "mkdir"):
        (folder / tool).symlink_to(shutil.which(tool) or tool)
    stand_in(folder, "podman")
    spec = for_job(ContainerSpec(image="img", args=tuple(args)), "job", ["/tmp/a dir"])
    done, calls = run_script(spec, folder, inner, image="yes")
    assert done.returncode == 0, done.stderr
    assert calls == [client_argv(spec, "podman", inner)[1:]]


def test_the_local_engine_starts_its_agent_through_the_runtime(bin_dir: Path) -> None:
    """LocalLink's wrap, with a stand-in podman that runs what it was asked to exec: the agent
    boots from the payload sent through it, and leaves at end of input."""
    runtime = bin_dir / "podman"
    runtime.write_text(
        '#!/bin/sh\nprintf "%s\\n" "$1" >> "$FAKE_LOG"\n'
        'case "$1" in container) echo true; exit 0 ;; esac\n'
        'shift 5\nexec "$@"\n'  # exec -i -e SSH_CONNECTION NAME ...
    )
    runtime.chmod(0o755)
    log = bin_dir.parent / "calls"
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "FAKE_LOG": str(log)}
    link = LocalLink(env=env, container=ContainerSpec(container="train"))
    link.close_input()
    assert link.proc.wait(timeout=30) == 0, link.stderr_text()
    link.close()
    assert log.read_text() == "exec\n"


@pytest.mark.parametrize(
    ("args", "first_line"),
    [
        (
            ["launch", "--container", "a", "--image", "b", "--", "true"],
            "dtrain: --container and --image exclude each other",
        ),
        (
            ["launch", "--container-arg=--privileged", "--", "true"],
            "dtrain: --container-arg needs --container NAME or --image IMAGE",
        ),
        (
            ["launch", "--launcher", "slurm", "--nodes", "1", "--image", "b", "--", "true"],
            "dtrain: --container and --image run over ssh or on this machine: not yet under "
            "Slurm, Grid Engine or mpirun",
        ),
    ],
)
def test_the_command_line_refuses_in_one_line_and_starts_nothing(
    tmp_path: Path, args: list[str], first_line: str
) -> None:
    done = run_dtrain(args, tmp_path, timeout_s=60)
    assert done.returncode == 2
    assert done.stdout == ""
    lines = done.stderr.splitlines()
    assert lines[0] == first_line and lines[1].startswith("  hint: ") and len(lines) == 2
    assert not (tmp_path / "dtrain-logs").exists()
