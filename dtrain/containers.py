"""Running each host's agent inside a container: what to run it in, and the host's command.

`--container NAME` execs the agent into a container already running on every host; `--image
IMAGE` runs a fresh container of IMAGE per host for the job (`run --rm -i --init`, host network
and IPC), named after the job. Either way the agent itself runs *inside* the container: killing
an `exec` client never stops what it started, so only an agent in the container's PID namespace
can stop the tasks when the launcher goes away.

Pure: a `ContainerSpec` and the POSIX shell script each host runs (find the runtime, check the
container or image, start the runtime client with the agent's own command inside). Imports only
the standard library and `errors`; the transports call `host_script` where they make the agent's
command line.
"""

from __future__ import annotations

import dataclasses
import re
import shlex
from collections.abc import Sequence
from dataclasses import dataclass

from dtrain.errors import UsageError

RUNTIMES = ("podman", "docker")
# What the agent needs from the host inside the container: the address ssh reached the host at
# (the tasks advertise it).
PASSED_ENV = ("SSH_CONNECTION",)
REFUSED_EXIT = 125  # the host script refused (no runtime, container not running, no image)
NO_PYTHON_EXIT = 127  # the runtime found no such command in the container
JOB_LABEL = "dtrain.job"
# Docker's and podman's rule for container names, and the characters an image reference
# (registry/name:tag@digest) can hold: neither needs quoting in the host script's messages.
_NAME_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_.-]*\Z")
_IMAGE_RE = re.compile(r"[A-Za-z0-9][A-Za-z0-9_./:@-]*\Z")
RUNTIME_HINT = (
    "install podman (or docker, with its daemon running) on every host, or name the one "
    "to use with --container-runtime"
)


@dataclass(frozen=True, slots=True)
class ContainerSpec:
    """Where each host's agent runs: in the running container `container`, or in a fresh
    container of `image` named `name` (the job's), with `mounts` (host directories, at the same
    path) and the user's extra `run` flags `args`. `runtime` None: found on each host."""

    container: str | None = None
    image: str | None = None
    runtime: str | None = None
    args: tuple[str, ...] = ()
    name: str | None = None
    mounts: tuple[str, ...] = ()
    job_id: str | None = None

    @property
    def is_fresh(self) -> bool:
        """A container of its own per host (--image), removed at the end."""
        return self.image is not None

    @property
    def shown(self) -> str:
        return f"image {self.image}" if self.image is not None else f"container {self.container}"


def from_flags(
    container: str | None,
    image: str | None = None,
    runtime: str | None = None,
    args: Sequence[str] = (),
) -> ContainerSpec | None:
    """The container flags as a spec (None: no container); a `UsageError` naming the flag."""
    if container is not None and image is not None:
        raise UsageError(
            "--container and --image exclude each other",
            hint="--container NAME runs the tasks in a container already running on every "
            "host; --image IMAGE starts a fresh one per host for the job: give one",
        )
    if container is None and image is None:
        if runtime is not None or args:
            flag = "--container-runtime" if runtime is not None else "--container-arg"
            raise UsageError(
                f"{flag} needs --container NAME or --image IMAGE", hint="give one of them"
            )
        return None
    if args and image is None:
        raise UsageError(
            "--container-arg is for --image (the flags of the container dtrain starts)",
            hint="a running container's flags were set when it was started",
        )
    if container is not None and not _NAME_RE.match(container):
        raise UsageError(
            f"--container {container!r} is not a container name",
            hint="names are letters, digits, '_', '.' and '-', starting with a letter or digit",
        )
    if image is not None and not _IMAGE_RE.match(image):
        raise UsageError(
            f"--image {image!r} is not an image reference",
            hint="e.g. --image docker.io/library/python:3.12 or --image localhost/train:1",
        )
    if runtime is not None and runtime not in RUNTIMES:
        raise UsageError(
            f"--container-runtime {runtime!r} is not one dtrain knows",
            hint=f"choose {' or '.join(RUNTIMES)}",
        )
    return ContainerSpec(container=container, image=image, runtime=runtime, args=tuple(args))


def for_job(spec: ContainerSpec, job_id: str, mounts: Sequence[str]) -> ContainerSpec:
    """The spec a launch uses: a fresh container is named after the job and mounts `mounts`
    (the working directory, --sync-dst-dir); a running one is only tagged with the job."""
    if not spec.is_fresh:
        return dataclasses.replace(spec, job_id=job_id)
    unique = tuple(dict.fromkeys(m for m in mounts if m))
    for path in unique:
        if ":" in path:  # `-v SRC:DST` has no way to write one
            raise UsageError(
                f"--image: cannot mount {path!r} into the container: it holds a ':'",
                hint="run from (or --sync-dst-dir to) a directory without ':', or use "
                "--container with a container that mounts it",
            )
    return dataclasses.replace(spec, name=container_name(job_id), mounts=unique, job_id=job_id)


def container_name(job_id: str) -> str:
    """The fresh container's name on every host: the job's id, so `ps -a` says whose it is."""
    return "dtrain-" + re.sub(r"[^A-Za-z0-9_.-]", "-", job_id)


def client_argv(spec: ContainerSpec, runtime: str, inner: Sequence[str]) -> list[str]:
    """The runtime client's command line that runs `inner` inside the container."""
    passed = [arg for name in PASSED_ENV for arg in ("-e", name)]
    if not spec.is_fresh:
        assert spec.container is not None
        return [runtime, "exec", "-i", *passed, spec.container, *inner]
    assert spec.image is not None
    argv = [runtime, "run", "--rm", "-i", "--init", "--pull", "never"]
    argv += ["--network", "host", "--ipc", "host"]
    if spec.name is not None:
        argv += ["--name", spec.name]
    if spec.job_id is not None:
        argv += ["--label", f"{JOB_LABEL}={spec.job_id}"]
    for path in spec.mounts:
        argv += ["-v", f"{path}:{path}"]
    return [*argv, *passed, *spec.args, spec.image, *inner]


def host_script(spec: ContainerSpec, inner: Sequence[str], python: str = "python3") -> str:
    """The POSIX shell script a host runs to start `inner` (the agent's command) in the
    container: the runtime found (or the one named), then the client; if that fails, why (the
    container not running, the image missing, no python3), one line on stderr naming the host.
    """
    q = shlex.quote
    where = "on $(uname -n)"
    candidates = (spec.runtime,) if spec.runtime is not None else RUNTIMES
    lines = [
        "rt=",
        f"for c in {' '.join(candidates)}; do",
        '  command -v "$c" >/dev/null 2>&1 || continue',
        # a docker CLI with no daemon behind it is not a runtime
        '  if [ "$c" = docker ]; then docker version --format "{{.Server.Version}}" '
        ">/dev/null 2>&1 || continue; fi",
        "  rt=$c; break",
        "done",
        f'[ -n "$rt" ] || {{ echo "dtrain: no container runtime {where} '
        f"(tried {', '.join(candidates)}; a docker CLI counts only with its daemon running): "
        f'{RUNTIME_HINT}" >&2; exit {REFUSED_EXIT}; }}',
    ]
    if spec.is_fresh:
        lines += [f"mkdir -p {q(path)} 2>/dev/null" for path in spec.mounts]
    client = client_argv(spec, "", inner)[1:]
    lines += ['"$rt" ' + " ".join(q(arg) for arg in client), "s=$?", "[ $s -ne 0 ] || exit 0"]
    # Why it failed, asked only now: a launch that works pays for none of these questions.
    refuse = f">&2; exit {REFUSED_EXIT}; }}"
    if spec.is_fresh:
        lines.append(
            f'"$rt" image inspect --format . {q(spec.image or "")} >/dev/null 2>&1 || {{ echo '
            f'"dtrain: image {spec.image} is not {where} ($rt): pull or load it there '
            f'(dtrain pulls nothing)" {refuse}'
        )
        probe = ["run", "--rm", "--network", "host", spec.image or "", python, "-S", "-c", ""]
    else:
        lines.append(
            f'[ "$("$rt" container inspect --format "{{{{.State.Running}}}}" '
            f'{q(spec.container or "")} 2>/dev/null)" = true ] || {{ echo "dtrain: container '
            f"{spec.container} is not running {where} ($rt): start it there first, or use "
            f'--image IMAGE" {refuse}'
        )
        probe = ["exec", spec.container or "", python, "-S", "-c", ""]
    # with --init, a missing command is the init's failure, not the runtime's 127: ask
    lines += [
        f'"$rt" {" ".join(q(a) for a in probe)} >/dev/null 2>&1',
        f'[ $? -ne {NO_PYTHON_EXIT} ] || echo "dtrain: no python3 >= 3.6 in {spec.shown} '
        f"{where} ($rt): the agent runs inside the container; use an image with python3 "
        '(or name it with --remote-python PATH)" >&2',
        "exit $s",
    ]
    return "\n".join(lines)
