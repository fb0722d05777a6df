"""How dtrain starts its agent on a host: the agent's code, and the local transport.

Every host runs the same agent (`dtrain.remote`), sent as source over the agent's stdin, so
nothing of dtrain need be installed on a host; its command line holds no job data, and the
job's environment travels inside the stream, never in any process's argv. `dtrain.transport.ssh`
carries the agent to remote hosts and `dtrain.transport.local` to this machine.
"""

from __future__ import annotations

import base64
import functools
import hashlib
import json
import logging
import shlex
import threading
import zlib
from pathlib import Path

from dtrain import remote

logger = logging.getLogger(__name__)

REMOTE_MODULES = ("proto", "procs", "spawn", "files", "stacks", "probe", "heap", "setup", "agent")

TOO_OLD_EXIT = 65  # the agent's python cannot run it: the remote command tries the next one
AUTO_PYTHON = "auto"
# Interpreters tried for the agent, in order, when --remote-python is "auto": a system python
# starts in ~20 ms, where a pyenv shim first in PATH runs several bash processes (~0.1 s).
# Tasks are unaffected: they run the user's command in the login environment either way.
AGENT_PYTHONS = ("/usr/bin/python3", "/usr/local/bin/python3", "python3")

# The boot code runs under whatever python3 the host has (it checks the version before anything
# else, so it stays Python 3.0-compatible syntax: no f-strings). It reads the agent's compressed
# sources from stdin, then looks for their compiled code in the user's cache, keyed by the
# sources' hash and the interpreter's bytecode version: a hit skips decompressing, parsing and
# compiling the agent (~10-15 ms of CPU per host and launch). The cache is used only when the
# folder and file belong to this user and nobody else may write them; any failure there falls
# back to compiling, and a file's own digest guards against a torn or altered write (SHA-256
# from the interpreter's built-in module where it has one: hashlib would load OpenSSL, ~3 ms).
# Compiled agents of other dtrain versions are removed once a week old (a shared home may serve
# several).
_BOOT = """import os,sys,types,marshal,time
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
def cache():
 e=os.environ.get("XDG_CACHE_HOME") or os.path.join(os.path.expanduser("~"),".cache")
 d=os.path.join(e,"dtrain")
 if not os.path.isdir(d):os.makedirs(d,0o700,True)
 s=os.lstat(d)
 if s.st_uid!=os.getuid() or s.st_mode&0o22 or os.path.islink(d):return None
 t=str(sys.implementation.cache_tag)+"-"+str(marshal.version)
 return os.path.join(d,"agent-{key}-"+t+".bin")
def sha(r):
 try:from _sha256 import sha256
 except ImportError:
  try:from _sha2 import sha256
  except ImportError:from hashlib import sha256
 return sha256(r).digest()
def load(f):
 k=os.open(f,os.O_RDONLY|os.O_NOFOLLOW)
 try:
  s=os.fstat(k)
  if s.st_uid!=os.getuid() or s.st_mode&0o22:return None
  r=b""
  while True:
   c=os.read(k,1<<20)
   if not c:break
   r+=c
 finally:os.close(k)
 if sha(r[32:])!=r[:32]:return None
 return marshal.loads(r[32:])
def save(f,x):
 r=marshal.dumps(x);t=f+"."+str(os.getpid())
 k=os.open(t,os.O_WRONLY|os.O_CREAT|os.O_EXCL|os.O_NOFOLLOW,0o600)
 try:os.write(k,sha(r)+r)
 finally:os.close(k)
 os.rename(t,f)
 d=os.path.dirname(f)
 for o in os.listdir(d):
  o=os.path.join(d,o)
  a=os.path.basename(o).startswith("agent-") and o.endswith(".bin")
  if a and o!=f and os.lstat(o).st_mtime<time.time()-604800:os.unlink(o)
f=x=None
try:
 f=cache()
 if f and os.path.exists(f):x=load(f)
except Exception:x=None
if x is None:
 import json,zlib
 x=json.loads(zlib.decompress(b).decode())
 x=[(k,compile(s,"dtrain/remote/"+k+".py","exec")) for k,s in x]
 try:
  if f:save(f,x)
 except Exception:pass
p=types.ModuleType("_dtrain_remote");p.__path__=[];sys.modules[p.__name__]=p
for k,s in x:
 m=types.ModuleType(p.__name__+"."+k);m.__package__=p.__name__;sys.modules[m.__name__]=m;setattr(p,k,m);exec(s,m.__dict__)
sys.modules[p.__name__+".agent"].main()
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
    # Level 1: ~1 ms for 32 KB, where level 9 took ~9 ms for 27 KB. Every launch waits for it;
    # the 5 KB more per host cost the link nothing.
    return zlib.compress(json.dumps(sources).encode(), 1)


@functools.cache
def boot_code() -> str:
    """The agent's first program: reads `agent_payload()` from stdin and runs the agent."""
    payload = agent_payload()
    key = hashlib.sha256(payload).hexdigest()[:24]
    return _BOOT.format(size=len(payload), too_old=TOO_OLD_EXIT, key=key)


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
    # binascii, not base64: base64 imports `re` (and with it `enum`), ~10 ms of every agent
    boot = "import sys,binascii,zlib;exec(zlib.decompress(binascii.a2b_base64(sys.argv[1])))"
    script = (
        f"for p in {' '.join(shlex.quote(c) for c in candidates)}; do "
        f'if command -v "$p" >/dev/null 2>&1; then "$p" -S -c "{boot}" {packed}; '
        f"s=$?; [ $s -eq {TOO_OLD_EXIT} ] || exit $s; fi; done; "
        f'echo "dtrain: no python3 >= 3.6 for the agent on $(uname -n) '
        f'(tried {" ".join(candidates)})" >&2; exit 127'
    )
    return f"sh -c {shlex.quote(script)}"


# ---- local --------------------------------------------------------------------------------


# ---- facts about this machine ---------------------------------------------------------------
