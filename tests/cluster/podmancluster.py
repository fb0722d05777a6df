"""Real podman (or docker) on every host of a running test cluster, and a small python3 image,
no registry.

Each host gets what a real machine has (see the notes in the module's functions): its own
container store (`/var/lib/containers` bound from a per-host directory; `/run` is already the
host's own tmpfs), its own podman configuration (runc, host networking, ulimits under this
machine's hard limits), and the cgroup hierarchies mounted in its mount namespace (the host's
`/sys` is the one `ip netns exec` made, without them). The image is built from this machine's
own files (Debian's python3 with its standard library, sh and a few tools, and the shared
libraries they load) and imported on every host.

`stop()` removes every container and image on every host, unmounts the stores and deletes
them. A plain library like `netcluster`: standard library only, no pytest.
"""

from __future__ import annotations

import io
import os
import shutil
import subprocess
import tarfile
import tempfile
import threading
import time
from collections.abc import Iterable, Sequence
from pathlib import Path

from .netcluster import Cluster, ClusterHost

IMAGE = "localhost/dtrain-test-python:1"
# Run inside a container (python3 -S -c): the command line of every process there but itself.
LIST_PROCESSES = (
    "import os\n"
    "for p in os.listdir('/proc'):\n"
    "  if p.isdigit() and int(p) != os.getpid():\n"
    "    try: print(open('/proc/%s/cmdline' % p).read().replace('\\0', ' '))\n"
    "    except OSError: pass\n"
)
PYTHON = "/usr/bin/python3.11"
STDLIB = Path("/usr/lib/python3.11")
LEFT_OUT = {"test", "idlelib", "tkinter", "ensurepip", "lib2to3", "__pycache__", "turtledemo"}
TOOLS = ("/usr/bin/dash", "/usr/bin/sleep", "/usr/bin/cat", "/usr/bin/env", "/usr/bin/kill")
MERGED_USR = {"/bin": "usr/bin", "/lib": "usr/lib", "/lib64": "usr/lib64", "/sbin": "usr/sbin"}
# glibc dlopens it for pthread_exit; ldd does not list it
EXTRA_LIBS = ("/usr/lib/x86_64-linux-gnu/libgcc_s.so.1",)
CONTAINERS_CONF = """[containers]
netns = "host"
default_ulimits = ["nofile=20000:20000", "nproc=32768:32768"]
[engine]
runtime = "runc"
cgroup_manager = "cgroupfs"
events_logger = "file"
"""
STEP_TIMEOUT_S = 60.0


def _ldd(paths: Iterable[str]) -> set[str]:
    """The shared libraries `paths` load (ldd, run here on this machine's own files)."""
    found: set[str] = set()
    paths = list(paths)
    for start in range(0, len(paths), 200):
        out = subprocess.run(
            ["ldd", *paths[start : start + 200]], capture_output=True, text=True, timeout=60
        ).stdout
        for line in out.splitlines():
            words = line.split()
            for word in words:
                if word.startswith("/") and "=>" not in word and not word.endswith(":"):
                    found.add(word)
    return found


def _add(tar: tarfile.TarFile, path: str, done: set[str]) -> None:
    """Add `path` at its real location, and a symlink where it was named if that differs."""
    real = os.path.realpath(path)
    named = os.path.join(os.path.realpath(os.path.dirname(path)), os.path.basename(path))
    if real not in done:
        done.add(real)
        tar.add(real, arcname=real.lstrip("/"), recursive=False)
    if named != real and named not in done:
        done.add(named)
        info = tarfile.TarInfo(named.lstrip("/"))
        info.type, info.linkname = tarfile.SYMTYPE, real
        tar.addfile(info)


def _dirs(tar: tarfile.TarFile, names: Iterable[str], mode: int = 0o755) -> None:
    for name in names:
        info = tarfile.TarInfo(name)
        info.type, info.mode = tarfile.DIRTYPE, mode
        tar.addfile(info)


def build_rootfs(out: Path, extra_elves: Sequence[str] = ()) -> Path:
    """A root filesystem tarball: python3 with its stdlib, sh, sleep, cat, env, kill, and the
    libraries they (and `extra_elves`, a framework's own libraries) load. ~3 s, ~40 MB."""
    stdlib = [
        str(p)
        for p in STDLIB.rglob("*")
        if p.is_file() and not LEFT_OUT.intersection(p.relative_to(STDLIB).parts)
    ]
    elves = [PYTHON, *TOOLS, *(p for p in stdlib if p.endswith(".so")), *extra_elves]
    system = ("/lib/", "/lib64/", "/usr/lib/", "/usr/lib64/")
    libs = {lib for lib in _ldd(elves) if lib.startswith(system)} | set(EXTRA_LIBS)
    done: set[str] = set()
    with tarfile.open(out, "w") as tar:
        _dirs(tar, ["usr", "usr/bin", "usr/lib", "usr/lib64", "usr/sbin", "etc", "root"])
        _dirs(tar, ["proc", "sys", "dev", "run", "var", "var/tmp"])
        _dirs(tar, ["tmp"], 0o1777)
        for link, target in MERGED_USR.items():
            info = tarfile.TarInfo(link.lstrip("/"))
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        for path in [PYTHON, *TOOLS, *sorted(libs), *stdlib]:
            if os.path.exists(path):
                _add(tar, path, done)
        for name, target in (("usr/bin/python3", "python3.11"), ("usr/bin/sh", "dash")):
            info = tarfile.TarInfo(name)
            info.type, info.linkname = tarfile.SYMTYPE, target
            tar.addfile(info)
        passwd = b"root:x:0:0:root:/root:/bin/sh\n"
        info = tarfile.TarInfo("etc/passwd")
        info.size = len(passwd)
        tar.addfile(info, io.BytesIO(passwd))
    return out


def framework_libraries(site_packages: Path) -> list[str]:
    """torch's and numpy's own shared libraries, whose system dependencies the image needs to
    run a venv of this machine's mounted read-only into the container."""
    found = []
    for package in ("torch/lib", "numpy", "numpy.libs", "torch.libs"):
        folder = site_packages / package
        if folder.is_dir():
            found += [str(p) for p in folder.rglob("*.so*") if p.is_file()]
    return found


def _cgroup_script() -> str:
    """Mount this machine's cgroup hierarchies in a host's own /sys (as the root namespace has
    them): podman's runc finds none there otherwise."""
    lines = ["mountpoint -q /sys/fs/cgroup || mount -t tmpfs -o mode=755 cgroup /sys/fs/cgroup"]
    for line in Path("/proc/self/mountinfo").read_text().splitlines():
        left, _, right = line.partition(" - ")
        point = left.split()[4]
        fstype, _, options = right.split()[:3]
        if not point.startswith("/sys/fs/cgroup/"):
            continue
        wanted = [o for o in options.split(",") if o not in ("rw", "ro")]
        opts = ",".join(wanted) if fstype == "cgroup" else ""
        mount = f"mount -t {fstype} {'-o ' + opts if opts else ''} {fstype} {point}"
        lines.append(f"mkdir -p {point} && (mountpoint -q {point} || {mount})")
    return "\n".join(lines)


class PodmanHosts:
    """podman on every host of `cluster` (already started), each with the test image."""

    runtime = "podman"

    def __init__(self, cluster: Cluster, rootfs: Path) -> None:
        self.cluster = cluster
        self.rootfs = rootfs
        self.dir = Path(tempfile.mkdtemp(prefix="dtrain-podman-"))

    def host_dir(self, host: ClusterHost) -> Path:
        return self.dir / host.name

    def start(self) -> None:
        """Prepare every host in parallel; any failure raises after undoing them all."""
        self._each(self._prepare)

    def _each(self, step: object) -> None:
        errors: list[BaseException] = []

        def one(host: ClusterHost) -> None:
            try:
                step(host)  # type: ignore[operator]
            except BaseException as exc:
                errors.append(exc)

        threads = [threading.Thread(target=one, args=(h,)) for h in self.cluster.hosts]
        for thread in threads:
            thread.start()
        for thread in threads:
            thread.join()
        if errors:
            raise errors[0]

    def _prepare(self, host: ClusterHost) -> None:
        d = self.host_dir(host)
        (d / "storage").mkdir(parents=True)
        etc = d / "etc-containers"
        if Path("/etc/containers").is_dir():
            shutil.copytree("/etc/containers", etc, symlinks=True)
        (etc / "containers.conf.d").mkdir(parents=True, exist_ok=True)
        (etc / "containers.conf.d" / "dtrain-tests.conf").write_text(CONTAINERS_CONF)
        script = "\n".join(
            [
                "set -e",
                _cgroup_script(),
                "mkdir -p /var/lib/containers /etc/containers",
                f"mount --bind {d / 'storage'} /var/lib/containers",
                f"mount --bind {etc} /etc/containers",
                f"podman import -q {self.rootfs} {IMAGE} >/dev/null",
            ]
        )
        self.cluster.run(host, script, timeout=STEP_TIMEOUT_S, check=True)

    def cli(
        self, host: ClusterHost | str, *args: str, timeout: float = 30.0, check: bool = False
    ) -> subprocess.CompletedProcess[str]:
        """The runtime's command line on `host`."""
        return self.cluster.run(host, [self.runtime, *args], timeout=timeout, check=check)

    def container_names(self, host: ClusterHost | str) -> list[str]:
        """Every container on the host, running or not."""
        out = self.cli(host, "ps", "-a", "--format", "{{.Names}}", check=True).stdout
        return out.split()

    def start_container(
        self, host: ClusterHost | str, name: str, mounts: Sequence[str] = ()
    ) -> None:
        """A long-running container `name` (what `--container` execs into), with --init."""
        volumes = [arg for m in mounts for arg in ("-v", f"{m}:{m}:ro")]
        self.cli(
            host, "run", "-d", "--init", "--name", name, "--network", "host", "--ipc", "host",
            *volumes, IMAGE, "sleep", "infinity", check=True, timeout=60,
        )  # fmt: skip

    def processes_in(self, host: ClusterHost | str, name: str) -> list[str]:
        """The command lines of every process in container `name` but its init and sleep."""
        out = self.cli(host, "exec", name, "python3", "-S", "-c", LIST_PROCESSES, check=True).stdout
        return [line for line in out.splitlines() if line.strip() and "sleep infinity" not in line]

    def stop(self) -> None:
        """Remove every container and image on every host, unmount and delete the stores."""
        try:
            if self.cluster.is_running:
                self._each(self._clean)
        finally:
            shutil.rmtree(self.dir, ignore_errors=True)

    def _clean(self, host: ClusterHost) -> None:
        self.cluster.run(
            host,
            "podman rm -af -t 0 >/dev/null 2>&1; podman rmi -af >/dev/null 2>&1; "
            "umount /var/lib/containers/storage/overlay 2>/dev/null; "
            "umount -R /var/lib/containers 2>/dev/null; true",
            timeout=STEP_TIMEOUT_S,
        )


class DockerHosts(PodmanHosts):
    """One dockerd per host (docker's containers belong to the daemon, and `--network host`
    means the daemon's network namespace: it must run inside the host), with its own data and
    exec roots, no bridge, no iptables, no forwarding; the same image imported."""

    runtime = "docker"
    START_S = 30.0

    def _prepare(self, host: ClusterHost) -> None:
        d = self.host_dir(host)
        (d / "docker").mkdir(parents=True)
        script = "\n".join(
            [
                "set -e",
                _cgroup_script(),
                "mkdir -p /var/lib/docker",
                f"mount --bind {d / 'docker'} /var/lib/docker",
            ]
        )
        self.cluster.run(host, script, timeout=STEP_TIMEOUT_S, check=True)
        dockerd = [
            "dockerd", "--iptables=false", "--ip6tables=false", "--ip-forward=false",
            "--ip-masq=false", "--bridge=none", "--userland-proxy=false",
            "--data-root", "/var/lib/docker", "--exec-root", "/run/docker",
            "--pidfile", "/run/docker.pid", "-H", "unix:///run/docker.sock",
        ]  # fmt: skip
        with open(d / "dockerd.log", "ab") as log:
            self.cluster.spawn(host, dockerd, stdout=log, stderr=log)
        deadline = time.monotonic() + self.START_S
        while self.cli(host, "version", "--format", "{{.Server.Version}}").returncode != 0:
            if time.monotonic() > deadline:
                raise RuntimeError(f"dockerd did not start on {host.name}: {d / 'dockerd.log'}")
            time.sleep(0.2)
        self.cli(host, "import", str(self.rootfs), IMAGE, timeout=STEP_TIMEOUT_S, check=True)

    def _clean(self, host: ClusterHost) -> None:
        self.cluster.run(
            host,
            "docker ps -aq | xargs -r docker rm -f >/dev/null 2>&1; "
            "docker images -q | xargs -r docker rmi -f >/dev/null 2>&1; "
            "p=$(cat /run/docker.pid 2>/dev/null) && kill $p && "
            "for i in $(seq 100); do kill -0 $p 2>/dev/null || break; sleep 0.1; done; "
            "umount -R /var/lib/docker 2>/dev/null; true",
            timeout=STEP_TIMEOUT_S,
        )
