"""How dtrain starts its agent on a host: the agent's code, and the local transport.

Every host runs the same agent (`dtrain.remote`), sent as source over the agent's stdin, so
nothing of dtrain need be installed on a host; its command line holds no job data, and the
job's environment travels inside the stream, never in any process's argv. `dtrain.transport.ssh`
carries the agent to remote hosts and `dtrain.transport.local` to this machine.
"""

from __future__ import annotations

import base64
import functools
import json
import shlex
import threading
import zlib
from pathlib import Path

from dtrain import remote
from dtrain.containers import ContainerSpec, host_script

REMOTE_MODULES = (
    "proto", "procs", "spawn", "files", "stacks", "probe", "netprobe", "setup", "facts", "checks",
    "tracebacks", "agent",
)  # fmt: skip

TOO_OLD_EXIT = 65  # the agent's python cannot run it: the remote command tries the next one
AUTO_PYTHON = "auto"
# Interpreters tried for the agent, in order, when --remote-python is "auto": a system python
# starts in ~20 ms, where a pyenv shim first in PATH runs several bash processes (~0.1 s).
# Tasks are unaffected: they run the user's command in the login environment either way.
AGENT_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "python3")

# The boot code runs under whatever python3 the host has (it checks the version before anything
# else, so it stays Python 3.0-compatible syntax: no f-strings). It reads the agent's compressed
# sources from stdin and serves them, and the package they make, through an import finder,
# so each module is compiled when the agent first imports it (a launch never compiles doctor's
# probes); then it runs the agent. Nothing is written on the host.
_BOOT = """import json,os,sys,zlib
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
from importlib.machinery import ModuleSpec
P="_dtrain_remote."
S=dict(json.loads(zlib.decompress(b).decode()))
class Sources:
 def find_spec(self,name,path,target=None):
  if name==P[:-1]:return ModuleSpec(name,self,is_package=True)
  if name.startswith(P) and name[len(P):] in S:return ModuleSpec(name,self)
 def create_module(self,spec):return None
 def exec_module(self,m):
  k=m.__name__[len(P):]
  if k:exec(compile(S[k],"dtrain/remote/"+k+".py","exec"),m.__dict__)
sys.meta_path.insert(0,Sources())
import _dtrain_remote.agent
_dtrain_remote.agent.main()
"""


_PAYLOAD_LOCK = threading.Lock()


def agent_payload() -> bytes:
    """The agent's modules, compressed, in import order.

    Built once per process: the first connection to need it builds it and the others, which
    connect at the same moment, wait for that one instead of each building their own (a cache
    alone let 8 hosts' threads build it 8 times, on every launch's critical path).
    """
    with _PAYLOAD_LOCK:
        return _build_payload()


@functools.cache
def _build_payload() -> bytes:
    folder = Path(remote.__file__).parent
    sources = [[name, (folder / f"{name}.py").read_text()] for name in REMOTE_MODULES]
    return zlib.compress(json.dumps(sources).encode())


@functools.cache
def boot_code() -> str:
    """The agent's first program: reads `agent_payload()` from stdin and runs the agent."""
    return _BOOT.format(size=len(agent_payload()), too_old=TOO_OLD_EXIT)


@functools.cache
def _packed_boot_code() -> str:
    """The boot code as the remote command's argument: the same for every host."""
    return base64.b64encode(zlib.compress(boot_code().encode(), 9)).decode()


def remote_command(python: str = AUTO_PYTHON, container: ContainerSpec | None = None) -> str:
    """The command sshd hands the login shell: find a python for the agent and start it
    (inside `container`, when given: `containers.host_script`).

    It is `sh -c '...'` so that any login shell (bash, zsh, fish, csh) runs it the same way;
    inside, no quotes but double ones, and the boot code travels as an argument.
    """
    if container is not None:
        probe = "python3" if python == AUTO_PYTHON else python
        return f"sh -c {shlex.quote(host_script(container, agent_argv(python), probe))}"
    return shlex.join(agent_argv(python))


def agent_argv(python: str = AUTO_PYTHON) -> list[str]:
    """The agent's command: `sh -c SCRIPT`, which tries each python in turn."""
    packed = _packed_boot_code()
    candidates = AGENT_PYTHONS if python == AUTO_PYTHON else (python,)
    boot = "import sys,base64,zlib;exec(zlib.decompress(base64.b64decode(sys.argv[1])))"
    script = (
        f"for p in {' '.join(shlex.quote(c) for c in candidates)}; do "
        f'if command -v "$p" >/dev/null 2>&1; then "$p" -S -c "{boot}" {packed}; '
        f"s=$?; [ $s -eq {TOO_OLD_EXIT} ] || exit $s; fi; done; "
        f'echo "dtrain: no python3 >= 3.6 for the agent on $(uname -n) '
        f'(tried {" ".join(candidates)})" >&2; exit 127'
    )
    return ["sh", "-c", script]
