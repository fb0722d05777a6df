"""The Slurm engine: one job step starts an agent on every node, and each agent connects back.

srun gives a step's tasks no stream of their own (its stdin goes to task 0 only), so the
agents talk to the launcher over TCP instead:

1. The launcher listens on the address its nodes route to it by, draws a fresh 256-bit key,
   and runs one `srun` (one task per node) whose environment carries the key and the address;
   no argv holds the key, and only the job's owner (and root) can read a process's environment.
2. Each agent connects and names its node; launcher and agent each prove they hold the key
   (HMAC-SHA256 over the other side's fresh nonce and the node's name), so a stranger can
   neither pose as an agent nor as the launcher. The launcher takes one connection per
   expected node and stops listening once every node is in.
3. The connection becomes the agent's stdin and stdout, the launcher sends the agent's code
   over it, and from there on it is the same agent and protocol as over ssh. The launcher's
   death closes the connection, and the agent stops every task as it does over ssh.

The stream is authenticated, not encrypted: like the rest of a Slurm job's traffic it crosses
the cluster's own network in the clear.
"""

from __future__ import annotations

import contextlib
import hashlib
import hmac
import logging
import os
import secrets
import select
import shlex
import shutil
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass
from socket import SocketIO

from dtrain.errors import ConnectError, DtrainError, Problem, UsageError
from dtrain.plan import slurm
from dtrain.transport.bootstrap import AGENT_PYTHONS, TOO_OLD_EXIT, agent_payload, boot_code
from dtrain.transport.machine import route_address

logger = logging.getLogger(__name__)

KEY_VAR = "DTRAIN_AGENT_KEY"
CONNECT_VAR = "DTRAIN_AGENT_CONNECT"
HELLO = b"dtrain-agent"
HANDSHAKE_TIMEOUT_S = 10.0
STARTUP_TIMEOUT_S = 120.0  # srun's own retries for a busy node take up to a minute
# After the agents closed (each stopped its tasks first), srun only has bookkeeping left;
# one still running then waits on a lost node: SIGTERM makes it give up the step.
SRUN_EXIT_S = 3.0
STOP_TIMEOUT_S = 10.0
STDERR_TAIL = 60
# srun 22.05 says nothing while a step waits inside an allocation (a suspended job, nodes held
# by an exclusive step), even with -v: after this long with no agent, dtrain says it waits.
QUIET_NOTE_S = 5.0
SCONTROL_TIMEOUT_S = 30.0
# The launcher's ssh session is not the agents': they would report its address as their own.
_NOT_EXPORTED = ("SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY", "SSH_AUTH_SOCK", KEY_VAR, CONNECT_VAR)

# What srun sets for the agents' own step: each task gets dtrain's ranks, and a framework that
# reads Slurm's (Lightning's SLURMEnvironment reads SLURM_NTASKS and SLURM_PROCID) must not
# take the agent's place in its step for its own. The job's SLURM_JOB_* stay.
STEP_VARS = (
    "SLURM_PROCID",
    "SLURM_LOCALID",
    "SLURM_NODEID",
    "SLURM_NTASKS",
    "SLURM_NPROCS",
    "SLURM_NTASKS_PER_NODE",
    "SLURM_TASKS_PER_NODE",
    "SLURM_TASK_PID",
    "SLURM_GTIDS",
    "SLURM_STEPID",
)

# Runs first in each agent (Python >= 3.6, stdlib): the handshake, then the usual boot code
# with the connection as its stdin and stdout.
_CONNECT_BACK = """import os,sys,socket,hmac,hashlib,binascii
k=binascii.unhexlify(os.environ.pop("{key}"))
a,p=os.environ.pop("{connect}").rsplit(":",1)
me=(os.environ.get("SLURMD_NODENAME") or socket.gethostname()).encode()
e=lambda x:os.environ.get(x,"-").encode() or b"-"
m=lambda w,x:hmac.new(k,w+b" "+x+b" "+me,hashlib.sha256).hexdigest().encode()
try:
 s=socket.create_connection((a.strip("[]"),int(p)),60)
 s.settimeout({timeout})
 f=s.makefile("rwb",0)
 n=binascii.hexlify(os.urandom(16))
 f.write(b" ".join([{hello!r},me,n,e("SLURM_NODEID"),e("SLURM_JOB_ID"),e("SLURM_STEP_ID")])+b"\\n")
 l=f.readline().split()
except OSError as x:
 sys.exit("dtrain: cannot reach the launcher at "+a+":"+p+": "+str(x))
if len(l)!=2 or not hmac.compare_digest(l[1],m(b"launcher",n)):
 sys.exit("dtrain: "+a+":"+p+" did not prove it is this job's launcher")
f.write(m(b"agent",l[0])+b"\\n")
s.settimeout(None)
os.dup2(s.fileno(),0);os.dup2(s.fileno(),1);f.close();s.close()
for v in [v for v in os.environ if v in {step_vars!r} or v.startswith("SLURM_STEP_")]:
 del os.environ[v]
exec({boot!r})
"""


def _mac(key: bytes, who: bytes, nonce: bytes, node: bytes) -> bytes:
    return hmac.new(key, who + b" " + nonce + b" " + node, hashlib.sha256).hexdigest().encode()


def agent_boot() -> str:
    return _CONNECT_BACK.format(
        key=KEY_VAR,
        connect=CONNECT_VAR,
        timeout=HANDSHAKE_TIMEOUT_S,
        hello=HELLO,
        step_vars=STEP_VARS,
        boot=boot_code(),
    )


def agent_command(pythons: Sequence[str]) -> list[str]:
    """The agent under the first of `pythons` the node has (a pyenv shim first on PATH costs
    0.1 s a node) and without `site` (as over ssh: the agent needs only the standard library);
    the boot code is the script's $0, an argument, never spliced into it."""
    candidates = " ".join(shlex.quote(p) for p in pythons)
    script = (
        f'for p in {candidates}; do if command -v "$p" >/dev/null 2>&1; then '
        f'"$p" -S -c "$0"; s=$?; [ $s -eq {TOO_OLD_EXIT} ] || exit $s; fi; done; '
        f'echo "dtrain: no python3 >= 3.6 for the agent on $(uname -n) '
        f'(tried {candidates})" >&2; exit 127'
    )
    return ["sh", "-c", script, agent_boot()]


# ---- the allocation ---------------------------------------------------------------------------


def _slurm_command(name: str) -> str:
    """The command's path. Missing, it is this machine's environment, not the user's flags:
    exit 3, as a command missing on a host and as an srun that fails (the README's table)."""
    path = shutil.which(name)
    if path is None:
        raise DtrainError(
            f"{name} is not on PATH: dtrain starts Slurm jobs with Slurm's own commands",
            hint="run dtrain where the Slurm client commands work (srun, scontrol), "
            "or pass --launcher ssh -H hosts",
        )
    return path


def _scontrol(*args: str) -> subprocess.CompletedProcess[str]:
    """`scontrol ARGS`, bounded; a missing or hung scontrol is an error that says so."""
    try:
        return subprocess.run(
            [_slurm_command("scontrol"), *args],
            capture_output=True,
            text=True,
            timeout=SCONTROL_TIMEOUT_S,
            check=False,
        )
    except subprocess.TimeoutExpired:
        raise ConnectError(
            f"scontrol {' '.join(args)} did not answer within {SCONTROL_TIMEOUT_S:.0f}s",
            hint="check that the Slurm controller is up (scontrol ping)",
        ) from None


def _records(text: str) -> list[dict[str, str]]:
    """`scontrol -o show ...`: one record a line, `Key=Value` words."""
    return [
        dict(word.split("=", 1) for word in line.split() if "=" in word)
        for line in text.splitlines()
    ]


def expand_nodelist(expression: str) -> tuple[str, ...]:
    """Slurm's own expansion (`scontrol show hostnames`); without scontrol, the same grammar
    here. A list neither can read is an error: never a silent fall back to this machine."""
    if shutil.which("scontrol") is None:
        return slurm.expand_hostlist(expression)
    done = _scontrol("show", "hostnames", expression)
    names = tuple(done.stdout.split())
    if done.returncode != 0 or not names:
        raise UsageError(
            f'cannot expand the Slurm node list "{expression}": '
            f"{done.stderr.strip() or 'scontrol printed no host'}",
            hint="check that this shell is inside the allocation (salloc, sbatch) "
            "and that scontrol reaches the controller",
        )
    return names


def current_allocation(env: Mapping[str, str]) -> slurm.Allocation:
    """The allocation this shell runs in (salloc, sbatch, srun --pty)."""
    nodes = expand_nodelist(env.get(slurm.NODELIST_VAR, ""))
    return slurm.allocation_from(env, nodes)


def node_addresses(nodes: Sequence[str]) -> dict[str, str]:
    """Each node's NodeAddr as the controller knows it (names may not resolve here)."""
    records = _records(_scontrol("-o", "show", "node", ",".join(nodes)).stdout)
    return {r["NodeName"]: r["NodeAddr"] for r in records if "NodeName" in r and "NodeAddr" in r}


def listen_address(nodes: Sequence[str]) -> str:
    """This machine's address on the route to the nodes (the first that has one)."""
    addresses = node_addresses(nodes[:8]) if shutil.which("scontrol") else {}
    unresolved: list[str] = []
    for node in nodes[:8]:
        target = addresses.get(node, node)
        try:
            target = str(socket.getaddrinfo(target, None, socket.AF_INET)[0][4][0])
        except OSError as exc:
            unresolved.append(f"{target} ({exc.strerror or exc})")
            continue
        address = route_address(target)
        if address is not None:
            return address
    shown = f"{', '.join(nodes[:3])}{'...' if len(nodes) > 3 else ''}"
    if len(unresolved) == len(nodes[:8]):
        raise ConnectError(
            f"the Slurm nodes' names do not resolve on this machine: {'; '.join(unresolved[:3])}",
            hint="run dtrain on a node of the allocation, or give the nodes a NodeAddr that "
            "resolves here (scontrol show node shows it)",
        )
    raise ConnectError(
        f"no route from this machine to the Slurm nodes ({shown})",
        hint="run dtrain on a node of the allocation, or on a login node that reaches them",
    )


# What srun says while it waits, shown as it comes: the job in the queue, a step that cannot
# start yet (a suspended job, busy nodes: "step creation temporarily disabled, retrying"),
# the controller away; and that the wait is over.
_WAITING = (
    "queued and waiting",
    "has been allocated",
    "step creation",
    "step created",
    "slurm is busy",
    "not responding",
)


def is_waiting(line: str) -> bool:
    """Whether one of srun's lines says it waits (or stopped waiting)."""
    lowered = line.lower()
    return any(mark in lowered for mark in _WAITING)


# ---- the link ------------------------------------------------------------------------------------


class SocketLink:
    """The byte stream to one agent that connected back."""

    def __init__(self, sock: socket.socket, step: SlurmStep) -> None:
        self.sock = sock
        self.step = step
        self._eof = threading.Event()

    def send(self, data: bytes) -> None:
        self.sock.sendall(data)

    def recv(self, size: int) -> bytes:
        try:
            data = self.sock.recv(size)
        except OSError:
            data = b""
        if not data:
            self._eof.set()
        return data

    def stderr_text(self) -> str:
        """srun's messages, and last (the line the launcher quotes) why Slurm ended the job,
        when it did: the connection closing is then Slurm's doing, not a crash."""
        why = self.step.ended_why()
        text = self.step.stderr_text()
        return f"{text}\n{why}" if why else text

    def close_input(self) -> None:
        with contextlib.suppress(OSError):
            self.sock.shutdown(socket.SHUT_WR)

    def close(self) -> None:
        """Give the agent time to stop its tasks (it closes when done), then drop the socket."""
        self._eof.wait(10.0)
        self.sock.close()


# ---- the step -------------------------------------------------------------------------------


@dataclass(frozen=True)
class Agent:
    """One agent that proved it belongs to this step: its node, and Slurm's ids for it."""

    node: str
    link: SocketLink
    job_id: str
    step_id: str
    order: int  # SLURM_NODEID: the node's place in the allocation


class SlurmStep:
    """One srun step with an agent on each node, and the connections they made back."""

    def __init__(
        self,
        nodes: Sequence[str] | None,
        count: int,
        *,
        pythons: Sequence[str] = AGENT_PYTHONS,
        job_name: str = "dtrain",
        srun_args: Sequence[str] = (),
        on_note: Callable[[str], None] | None = None,
    ) -> None:
        self.nodes = tuple(nodes) if nodes is not None else None
        self.count = count
        self.pythons = tuple(pythons)
        self.job_name = job_name
        self.srun_args = tuple(srun_args)
        self.on_note = on_note
        self.agents: dict[str, Agent] = {}
        self.proc: subprocess.Popen[bytes] | None = None
        self._key = secrets.token_bytes(32)
        self._stderr: deque[str] = deque(maxlen=STDERR_TAIL)
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._why: str | None = None
        self._why_lock = threading.Lock()

    @property
    def job_id(self) -> str:
        return next((a.job_id for a in self.agents.values()), "")

    @property
    def step_id(self) -> str:
        return next((a.step_id for a in self.agents.values()), "")

    def stderr_text(self) -> str:
        return "\n".join(self._stderr)

    def ended_why(self) -> str | None:
        """Why Slurm ended this job, if it did (scancel, its time limit, a node, preemption);
        asked once, when a connection closes."""
        with self._why_lock:
            if self._why is None:
                self._why = _ended_why(self.job_id) if self.job_id.isdigit() else ""
            return self._why or None

    def start(self, address: str) -> None:
        """Listen, then run srun; the agents are accepted by `accept`."""
        srun = _slurm_command("srun")
        env = self.listen(address)
        command = agent_command(self.pythons)
        argv = slurm.agent_step_argv(self.nodes, self.count, command, self.job_name, self.srun_args)
        argv[0] = srun
        logger.debug("agent step: %s", " ".join(argv[:-3]))
        self.proc = subprocess.Popen(
            argv,
            stdin=subprocess.DEVNULL,
            stdout=subprocess.DEVNULL,
            stderr=subprocess.PIPE,
            env=env,
            start_new_session=True,  # the terminal's Ctrl-C is dtrain's to handle
        )
        threading.Thread(target=self._read_stderr, name="dtrain-srun", daemon=True).start()

    def listen(self, address: str) -> dict[str, str]:
        """Open the socket the agents connect to; the environment that tells them where."""
        listener = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
        listener.bind((address, 0))
        listener.listen(min(self.count, 4096))
        self._listener = listener
        env = {k: v for k, v in os.environ.items() if k not in _NOT_EXPORTED}
        env[KEY_VAR] = self._key.hex()
        port = listener.getsockname()[1]
        env[CONNECT_VAR] = f"[{address}]:{port}" if ":" in address else f"{address}:{port}"
        return env

    def _read_stderr(self) -> None:
        assert self.proc is not None and self.proc.stderr is not None
        for raw in self.proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            self._stderr.append(line)
            logger.debug("srun: %s", line)
            if self.on_note is not None and is_waiting(line):
                self.on_note(line.removeprefix("srun: "))

    def accept(self, timeout_s: float | None) -> dict[str, Problem]:
        """Take the agents' connections until every node is in, srun ends, or time is up.

        `timeout_s` None waits as long as srun does (it may sit in the queue). Returns the
        problem of each node that did not join, keyed by node name.
        """
        assert self._listener is not None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        quiet_until: float | None = time.monotonic() + QUIET_NOTE_S
        pending: list[threading.Thread] = []
        while len(self.agents) < self.count:
            srun_ended = self.proc is not None and self.proc.poll() is not None
            if srun_ended and not any(t.is_alive() for t in pending):
                break
            if deadline is not None and time.monotonic() > deadline:
                break
            if not self.agents and quiet_until is not None and time.monotonic() > quiet_until:
                quiet_until = None
                self._note_waiting(timeout_s)
            ready, _, _ = select.select([self._listener], [], [], 0.2)
            if ready:
                try:
                    sock, peer = self._listener.accept()
                except OSError:  # closed under us (stop), or out of files: no more agents
                    break
                thread = threading.Thread(target=self._handshake, args=(sock, peer), daemon=True)
                thread.start()
                pending.append(thread)
        for thread in pending:  # once every node is in, a silent stranger holds nothing up
            if len(self.agents) < self.count:
                thread.join(HANDSHAKE_TIMEOUT_S)
        self._listener.close()  # nobody joins this job after this
        return self._missing(timeout_s)

    def _note_waiting(self, timeout_s: float | None) -> None:
        """Say that the step has not started, and the job's state when it tells why
        (SUSPENDED): srun itself is silent while a step waits inside an allocation."""
        if self.on_note is None or self.nodes is None:
            return  # making an allocation: srun says "queued and waiting" itself
        job = os.environ.get(slurm.JOB_ID_VAR, "")
        state = ""
        if job.isdigit():
            with contextlib.suppress(OSError, DtrainError):
                records = _records(_scontrol("-o", "show", "job", job).stdout)
                state = records[0].get("JobState", "") if records else ""
        why = f" (Slurm job {job} is {state})" if state and state != "RUNNING" else ""
        limit = f"; waiting up to {timeout_s:.0f}s" if timeout_s is not None else ""
        self.on_note(
            f"Slurm has not started dtrain's agents on {len(self.nodes)} node(s) after "
            f"{QUIET_NOTE_S:.0f}s{why}{limit}"
        )

    def _missing(self, timeout_s: float | None) -> dict[str, Problem]:
        if self.nodes is not None:
            missing = [node for node in self.nodes if node not in self.agents]
        else:
            missing = [f"node {i + 1}" for i in range(len(self.agents), self.count)]
        if not missing:
            return {}
        if self.proc is not None and self.proc.poll() is not None:
            why = f"srun exited with {self.proc.returncode}"
        else:
            why = f"its agent did not connect back within {timeout_s:.0f}s"
        tail = [line for line in self._stderr if line.strip()][-3:]
        hint = "srun said: " + " | ".join(tail) if tail else None
        return {node: Problem(f"{why}", host=node, hint=hint) for node in missing}

    def _handshake(self, sock: socket.socket, peer: tuple[str, int]) -> None:
        """Admit one connection if it proves it holds the key and names a node still missing."""
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT_S)
            with sock.makefile("rb", 0) as reader:  # unbuffered: reads nothing past a line
                agent = self._verify(sock, reader)
            with self._lock:
                wanted = self.nodes is None or agent.node in self.nodes
                if not wanted or agent.node in self.agents or len(self.agents) >= self.count:
                    raise ValueError(f"{agent.node} is not a node this step is waiting for")
                self.agents[agent.node] = agent
            sock.settimeout(None)
            agent.link.send(agent_payload())
        except (OSError, ValueError) as exc:
            logger.warning("refused a connection from %s: %s", peer[0], exc)
            sock.close()

    def _verify(self, sock: socket.socket, reader: SocketIO) -> Agent:
        """Both sides prove they hold the key (HMAC of the other's nonce and the node name)."""
        words = reader.readline(512).split()
        if len(words) != 6 or words[0] != HELLO:
            raise ValueError("not a dtrain agent")
        node, agent_nonce, node_id, job_id, step_id = words[1:]
        name = node.decode("utf-8", "replace")
        nonce = secrets.token_hex(16).encode()
        sock.sendall(nonce + b" " + _mac(self._key, b"launcher", agent_nonce, node) + b"\n")
        answer = reader.readline(512).strip()
        if not hmac.compare_digest(answer, _mac(self._key, b"agent", nonce, node)):
            raise ValueError(f"{name} did not prove it holds this job's key")
        order = int(node_id) if node_id.isdigit() else len(self.agents)
        return Agent(name, SocketLink(sock, self), job_id.decode(), step_id.decode(), order)

    def stop(self) -> None:
        """srun ends once its agents have: wait for that, then make sure (SIGTERM, SIGKILL)."""
        if self._listener is not None:
            self._listener.close()
        for agent in self.agents.values():
            agent.link.sock.close()
        if self.proc is None:
            return
        try:  # with no agent in yet (queued, or failing), there is nothing to wait for
            self.proc.wait(SRUN_EXIT_S if self.agents else 0.1)
        except subprocess.TimeoutExpired:
            for sig in (signal.SIGTERM, signal.SIGKILL):  # srun cancels what it asked for
                with contextlib.suppress(ProcessLookupError):
                    self.proc.send_signal(sig)
                try:
                    self.proc.wait(STOP_TIMEOUT_S)
                    break
                except subprocess.TimeoutExpired:
                    continue


# Job states that mean Slurm itself ended the job, as `scontrol show job` spells them.
_ENDED_BY_SLURM = {
    "CANCELLED": "Slurm cancelled job {job} (scancel, or an administrator)",
    "TIMEOUT": "Slurm job {job} reached its time limit",
    "NODE_FAIL": "Slurm job {job} lost a node (NODE_FAIL)",
    "PREEMPTED": "Slurm job {job} was preempted",
    "DEADLINE": "Slurm job {job} reached its deadline",
    "OUT_OF_MEMORY": "Slurm job {job} ran out of memory",
}
_STATE_WAIT_S = 3.0  # a job being torn down shows COMPLETING for a moment before its state


def _ended_why(job_id: str) -> str:
    """The sentence for a job Slurm ended, or "" (still running, or scontrol cannot say)."""
    deadline = time.monotonic() + _STATE_WAIT_S
    while True:
        try:
            records = _records(_scontrol("-o", "show", "job", job_id).stdout)
        except (OSError, DtrainError):
            return ""
        state = records[0].get("JobState", "") if records else ""
        if state != "COMPLETING" or time.monotonic() > deadline:
            return _ENDED_BY_SLURM.get(state, "").format(job=job_id)
        time.sleep(0.2)


def controller_route() -> str:
    """This machine's address towards the Slurm controller: where the nodes of an allocation
    not made yet can reach the launcher (they all talk to the controller)."""
    done = _scontrol("show", "config")
    for line in done.stdout.splitlines():
        key, _, value = line.partition("=")
        if key.strip().startswith("SlurmctldHost"):
            name, _, address = value.strip().partition("(")
            target = address.rstrip(")") or name
            with contextlib.suppress(OSError):
                target = str(socket.getaddrinfo(target, None, socket.AF_INET)[0][4][0])
            if (found := route_address(target)) is not None:
                return found
    raise ConnectError(
        "cannot tell which address Slurm's nodes reach this machine at: "
        f"`scontrol show config` {'failed' if done.returncode else 'names no SlurmctldHost'}",
        hint=done.stderr.strip() or "run dtrain where scontrol reaches the controller",
    )
