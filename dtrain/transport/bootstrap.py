"""How dtrain starts its agent on a host: the agent's code, and the local transport.

Every host runs the same agent (`dtrain.remote`), sent as source over the agent's stdin, so
nothing of dtrain need be installed on a host; its command line holds no job data, and the
job's environment travels inside the stream, never in any process's argv. `dtrain.transport.ssh`
carries the agent to remote hosts and `dtrain.transport.local` to this machine.
"""

from __future__ import annotations

import base64
import contextlib
import functools
import json
import logging
import os
import shlex
import socket
import subprocess
import sys
import threading
import zlib
from collections.abc import Mapping
from dataclasses import dataclass, field
from pathlib import Path

from dtrain import remote

logger = logging.getLogger(__name__)

REMOTE_MODULES = ("proto", "procs", "files", "probe", "agent")

TOO_OLD_EXIT = 65  # the agent's python cannot run it: the remote command tries the next one
AUTO_PYTHON = "auto"
# Interpreters tried for the agent, in order, when --remote-python is "auto": a system python
# starts in ~20 ms, where a pyenv shim first in PATH runs several bash processes (~0.1 s).
# Tasks are unaffected: they run the user's command in the login environment either way.
AGENT_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "python3")

_BOOT = """import os,sys,types,json,zlib
v=sys.version.split()[0]
if sys.version_info<(3,6):
 sys.stderr.write("dtrain: the agent needs Python >= 3.6, "+sys.executable+" is "+v+"\\n")
 sys.exit({too_old})
n={size}
b=b""
while len(b)<n:
 c=os.read(0,n-len(b))
 if not c:sys.exit(70)
 b+=c
p=types.ModuleType("_dtrain_remote");p.__path__=[];sys.modules[p.__name__]=p
for k,s in json.loads(zlib.decompress(b).decode()):
 m=types.ModuleType(p.__name__+"."+k);m.__package__=p.__name__;sys.modules[m.__name__]=m;setattr(p,k,m);exec(compile(s,"dtrain/remote/"+k+".py","exec"),m.__dict__)
sys.modules[p.__name__+".agent"].main()
"""


@functools.cache
def agent_payload() -> bytes:
    """The agent's modules, compressed, in import order."""
    folder = Path(remote.__file__).parent
    sources = [[name, (folder / f"{name}.py").read_text()] for name in REMOTE_MODULES]
    return zlib.compress(json.dumps(sources).encode(), 9)


def boot_code() -> str:
    return _BOOT.format(size=len(agent_payload()), too_old=TOO_OLD_EXIT)


@functools.cache
def _packed_boot_code() -> str:
    """The boot code as the remote command's argument: the same for every host."""
    return base64.b64encode(zlib.compress(boot_code().encode(), 9)).decode()


def remote_command(python: str = AUTO_PYTHON) -> str:
    """The command sshd hands the login shell: find a python for the agent and start it.

    It is `sh -c '...'` so that any login shell (bash, zsh, fish, csh) runs it the same way;
    inside, no quotes but double ones, and the boot code travels as an argument.
    """
    packed = _packed_boot_code()
    candidates = AGENT_PYTHONS if python == AUTO_PYTHON else (python,)
    boot = "import sys,base64,zlib;exec(zlib.decompress(base64.b64decode(sys.argv[1])))"
    script = (
        f"for p in {' '.join(shlex.quote(c) for c in candidates)}; do "
        f'if command -v "$p" >/dev/null 2>&1; then "$p" -c "{boot}" {packed}; '
        f"s=$?; [ $s -eq {TOO_OLD_EXIT} ] || exit $s; fi; done; "
        f'echo "dtrain: no python3 >= 3.6 for the agent on $(uname -n) '
        f'(tried {" ".join(candidates)})" >&2; exit 127'
    )
    return f"sh -c {shlex.quote(script)}"


@dataclass(frozen=True)
class SshOptions:
    """How to reach remote hosts (ssh config file, host keys, connect timeout)."""

    config_file: str | None = None
    accept_new_host_keys: bool = False
    connect_timeout_s: float | None = None
    user_config_dir: str = field(default_factory=lambda: os.path.expanduser("~/.ssh"))


# ---- local --------------------------------------------------------------------------------


class LocalLink:
    """A local agent process in its own session, so the terminal's Ctrl-C reaches only dtrain."""

    def __init__(self, env: Mapping[str, str] | None = None) -> None:
        self.proc = subprocess.Popen(
            [sys.executable, "-c", boot_code()],
            stdin=subprocess.PIPE,
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            start_new_session=True,
            env=dict(env) if env is not None else None,
        )
        assert self.proc.stdin and self.proc.stdout and self.proc.stderr
        self._stdin_fd = self.proc.stdin.fileno()
        self._stdout_fd = self.proc.stdout.fileno()
        self._stderr = bytearray()
        self._stderr_thread = threading.Thread(target=self._read_stderr, daemon=True)
        self._stderr_thread.start()
        self.send(agent_payload())

    def _read_stderr(self) -> None:
        assert self.proc.stderr
        fd = self.proc.stderr.fileno()
        while chunk := os.read(fd, 65536):
            self._stderr += chunk[: max(0, 65536 - len(self._stderr))]

    def send(self, data: bytes) -> None:
        view = memoryview(data)
        while view:
            written = os.write(self._stdin_fd, view)
            view = view[written:]

    def recv(self, size: int) -> bytes:
        return os.read(self._stdout_fd, size)

    def stderr_text(self) -> str:
        return self._stderr.decode("utf-8", "replace")

    def close_input(self) -> None:
        if self.proc.stdin and not self.proc.stdin.closed:
            self.proc.stdin.close()

    def close(self) -> None:
        """Wait briefly for the agent to finish its cleanup; never leave it behind."""
        self.close_input()
        try:
            self.proc.wait(timeout=10)
        except subprocess.TimeoutExpired:
            self.proc.kill()
            self.proc.wait()
        for stream in (self.proc.stdout, self.proc.stderr):
            if stream:
                stream.close()


# ---- facts about this machine ---------------------------------------------------------------


def route_address(destination: str) -> str | None:
    """The local address the kernel would use to reach `destination` (no packet is sent)."""
    family = socket.AF_INET6 if ":" in destination else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((destination, 9))
            address: str = sock.getsockname()[0]
            return address
    except OSError:
        return None


def resolve_address(name: str) -> str | None:
    """The first address a name resolves to, or None."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    return str(infos[0][4][0]) if infos else None


def local_hostname() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


def local_interfaces() -> dict[str, str]:
    import psutil

    result: dict[str, str] = {}
    for name, addresses in psutil.net_if_addrs().items():
        for address in addresses:
            if address.family == socket.AF_INET:
                result.setdefault(name, address.address)
    return result


def raise_open_file_limit() -> None:
    """Up to the hard limit: a socket per host and a log per task pass the usual soft limit of
    1024 at 256 hosts x 4 tasks."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 16
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def local_free_ports(count: int) -> list[int]:
    """Free ports here, found the way every host's agent finds its own."""
    from dtrain.remote.agent import free_ports  # only dry runs and doctor need the agent here

    return free_ports(count)
