"""Agents that connect back: a starter runs the agent once per host, and each agent dials in.

A scheduler's task starter (srun, mpirun, qrsh -inherit, pbsdsh, blaunch) gives its tasks no
stream of their own to the launcher, so the agents talk to it over TCP instead:

1. The launcher listens on the address its hosts route to it by, draws a fresh 256-bit key,
   and runs the starter, whose environment carries the key and the address; no argv holds
   the key, and only the job's owner (and root) can read a process's environment.
2. Each agent connects and names its host; launcher and agent each prove they hold the key
   (HMAC-SHA256 over the other side's fresh nonce and the host's name), so a stranger can
   neither pose as an agent nor as the launcher. The launcher takes one connection per
   expected host and stops listening once every host is in.
3. The connection becomes the agent's stdin and stdout, the launcher sends the agent's code
   over it, and from there on it is the same agent and protocol as over ssh. The launcher's
   death closes the connection, and the agent stops every task as it does over ssh.

What differs between schedulers is a `Starter`: its command, how an agent knows which host it
is, which of the starter's variables its tasks must not inherit, and how the starter's own end
reads. The stream is authenticated, not encrypted: like the rest of a scheduler's job traffic
it crosses the cluster's own network in the clear.
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
import signal
import socket
import subprocess
import threading
import time
from collections import deque
from collections.abc import Callable, Mapping, Sequence
from dataclasses import dataclass, field
from socket import SocketIO
from typing import Any, Protocol

from dtrain.errors import ConnectError, Problem
from dtrain.plan.hosts import Host
from dtrain.transport.bootstrap import TOO_OLD_EXIT, agent_payload, boot_code
from dtrain.transport.link import Link

logger = logging.getLogger(__name__)

KEY_VAR = "DTRAIN_AGENT_KEY"
CONNECT_VAR = "DTRAIN_AGENT_CONNECT"
# A starter that runs one process per host tells each agent its place in the host list here.
ORDER_VAR = "DTRAIN_AGENT_ORDER"
HELLO = b"dtrain-agent"
HANDSHAKE_TIMEOUT_S = 10.0
STOP_TIMEOUT_S = 10.0
ENDED_WAIT_S = 1.0  # a connection closed mid-job: how long the starter may take to end too
STDERR_TAIL = 60
NOTHING_STARTED = "nothing was started"
# After the agents closed (each stopped its tasks first), a starter has only bookkeeping left;
# one still running after this long waits on a lost host: it is stopped.
STARTER_EXIT_S = 3.0
# No agent yet after this long: the starter's note says what it waits for (srun, for one,
# says nothing while a step waits inside an allocation, even with -v).
QUIET_NOTE_S = 5.0
# The launcher's ssh session is not the agents': they would report its address as their own.
NOT_EXPORTED = ("SSH_CONNECTION", "SSH_CLIENT", "SSH_TTY", "SSH_AUTH_SOCK", KEY_VAR, CONNECT_VAR)


@dataclass(frozen=True)
class AgentIdentity:
    """How an agent started by one starter says who it is, and what of the starter it drops.

    `name_vars`: the first one set names the host (else its hostname); `order_vars`: the first
    one set is its place (a rank, a node id); `job_var`/`step_var`: the scheduler's ids, for
    job.json. The agent deletes `scrub_vars` and every variable starting with one of
    `scrub_prefixes` before it runs anything: its tasks get dtrain's ranks, and a framework that
    reads the scheduler's (Lightning reads SLURM_NTASKS, mpi4py OMPI_*) must not mistake the
    agent's place in the starter's world for its own.
    """

    name_vars: tuple[str, ...] = ()
    order_vars: tuple[str, ...] = (ORDER_VAR,)
    job_var: str = ""
    step_var: str = ""
    scrub_vars: tuple[str, ...] = (ORDER_VAR,)
    scrub_prefixes: tuple[str, ...] = ()


# Runs first in each agent (Python >= 3.6, stdlib): the handshake, then the usual boot code
# with the connection as its stdin and stdout.
_CONNECT_BACK = """import os,sys,socket,hmac,hashlib,binascii
k=binascii.unhexlify(os.environ.pop("{key}"))
a,p=os.environ.pop("{connect}").rsplit(":",1)
g=lambda vs,d:next((os.environ[v] for v in vs if os.environ.get(v)),d).encode()
me=g({name_vars!r},socket.gethostname())
m=lambda w,x:hmac.new(k,w+b" "+x+b" "+me,hashlib.sha256).hexdigest().encode()
try:
 s=socket.create_connection((a.strip("[]"),int(p)),60)
 s.settimeout({timeout})
 f=s.makefile("rwb",0)
 n=binascii.hexlify(os.urandom(16))
 i=[g({order_vars!r},"-"),g([{job!r}],"-"),g([{step!r}],"-")]
 f.write(b" ".join([{hello!r},me,n]+i)+b"\\n")
 l=f.readline().split()
except OSError as x:
 sys.exit("dtrain: cannot reach the launcher at "+a+":"+p+": "+str(x))
if len(l)!=2 or not hmac.compare_digest(l[1],m(b"launcher",n)):
 sys.exit("dtrain: "+a+":"+p+" did not prove it is this job's launcher")
f.write(m(b"agent",l[0])+b"\\n")
s.settimeout(None)
os.dup2(s.fileno(),0);os.dup2(s.fileno(),1);f.close();s.close()
for v in [v for v in os.environ if v in {scrub!r} or v.startswith({prefixes!r})]:
 del os.environ[v]
exec({boot!r})
"""


def _mac(key: bytes, who: bytes, nonce: bytes, node: bytes) -> bytes:
    return hmac.new(key, who + b" " + nonce + b" " + node, hashlib.sha256).hexdigest().encode()


def agent_boot(identity: AgentIdentity) -> str:
    """The agent's first code under a starter: dial in, prove the key, then boot as usual."""
    return _CONNECT_BACK.format(
        key=KEY_VAR,
        connect=CONNECT_VAR,
        name_vars=list(identity.name_vars),
        timeout=HANDSHAKE_TIMEOUT_S,
        hello=HELLO,
        order_vars=list(identity.order_vars),
        job=identity.job_var,
        step=identity.step_var,
        scrub=list(identity.scrub_vars),
        prefixes=tuple(identity.scrub_prefixes),
        boot=boot_code(),
    )


def agent_command(pythons: Sequence[str], identity: AgentIdentity) -> list[str]:
    """The agent's command line for a starter: the one place a wrapper (a container's
    `exec`) applies to every connect-back engine.

    The agent runs under the first of `pythons` the host has (a pyenv shim first on PATH
    costs 0.1 s a host) and without `site` (as over ssh: it needs only the standard library);
    the boot code is the script's $0, an argument, never spliced into it. The key and the
    address stay in the environment."""
    candidates = " ".join(shlex.quote(p) for p in pythons)
    script = (
        f'for p in {candidates}; do if command -v "$p" >/dev/null 2>&1; then '
        f'"$p" -S -c "$0"; s=$?; [ $s -eq {TOO_OLD_EXIT} ] || exit $s; fi; done; '
        f'echo "dtrain: no python3 >= 3.6 for the agent on $(uname -n) '
        f'(tried {candidates})" >&2; exit 127'
    )
    return ["sh", "-c", script, agent_boot(identity)]


def shown_command(argv: Sequence[str]) -> str:
    """A starter's command for people: quoted, the agent's code (the last word) as <agent>."""
    return " ".join([*(shlex.quote(a) for a in argv[:-1]), "<agent>"])


@dataclass(frozen=True)
class StarterProcess:
    """One process a starter runs: its argv, what it adds to the environment, and the one host
    it starts the agent on, for starters that run one process per host (qrsh, pbsdsh)."""

    argv: list[str]
    env: Mapping[str, str] = field(default_factory=dict)
    host: str | None = None


class Starter(Protocol):
    """What one scheduler adds to the connect-back: how it runs the agent once per host."""

    @property
    def name(self) -> str:
        """The starter's command as people know it (`srun`, `mpirun`), in messages."""
        ...

    @property
    def identity(self) -> AgentIdentity: ...

    @property
    def names_by_order(self) -> bool:
        """Whether an agent's order (its rank) says which of the asked hosts it is, because
        its own name may not be the host list's (mpirun's ranks follow the list)."""
        ...

    def processes(
        self, command: Sequence[str], nodes: Sequence[str] | None, count: int, address: str
    ) -> list[StarterProcess]:
        """What to run so that `command` runs once on each of `nodes` (or on `count` nodes
        the scheduler chooses, when `nodes` is None); `address` is this machine's, where the
        agents connect (a starter whose own daemons call home may need to say it)."""
        ...

    def note(self, line: str) -> str | None:
        """A line of the starter's stderr worth showing as it comes (it waits), or None."""
        ...

    def quiet_note(self, nodes: Sequence[str] | None, timeout_s: float | None) -> str | None:
        """What to say when no agent came for a while (the starter itself is silent)."""
        ...

    def ended_why(self, job_id: str, returncodes: Sequence[int | None]) -> str | None:
        """Why the scheduler ended the job (cancelled, a time limit), if it did; `returncodes`:
        the starter's processes' (None: still running)."""
        ...


# ---- the link ------------------------------------------------------------------------------------


class SocketLink:
    """The byte stream to one agent that connected back."""

    def __init__(self, sock: socket.socket, step: ConnectBack) -> None:
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
        """The starter's messages, and last (the line the launcher quotes) why the scheduler
        ended the job, when it did: the connection closing is then its doing, not a crash."""
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


# ---- the agents of one start ------------------------------------------------------------------


@dataclass(frozen=True)
class Agent:
    """One agent that proved it belongs to this start: its host, and the scheduler's ids."""

    node: str
    link: SocketLink
    job_id: str
    step_id: str
    order: int  # the host's place in the allocation (a node id, a rank)


class ConnectBack:
    """One start of the agents by a starter, and the connections they made back."""

    def __init__(
        self,
        starter: Starter,
        nodes: Sequence[str] | None,
        count: int,
        *,
        pythons: Sequence[str],
        on_note: Callable[[str], None] | None = None,
    ) -> None:
        self.starter = starter
        self.nodes = tuple(nodes) if nodes is not None else None
        self.count = count
        self.pythons = tuple(pythons)
        self.on_note = on_note
        self.agents: dict[str, Agent] = {}
        self.procs: list[subprocess.Popen[bytes]] = []
        self._proc_of: dict[str, subprocess.Popen[bytes]] = {}  # host -> its own starter
        self._key = secrets.token_bytes(32)
        self._stderr: deque[str] = deque(maxlen=STDERR_TAIL)
        self._listener: socket.socket | None = None
        self._lock = threading.Lock()
        self._why: str | None = None
        self._why_lock = threading.Lock()

    @property
    def proc(self) -> subprocess.Popen[bytes] | None:
        """The starter's (first) process."""
        return self.procs[0] if self.procs else None

    @property
    def job_id(self) -> str:
        return next((a.job_id for a in self.agents.values()), "")

    @property
    def step_id(self) -> str:
        return next((a.step_id for a in self.agents.values()), "")

    def stderr_text(self) -> str:
        return "\n".join(self._stderr)

    def ended_why(self) -> str | None:
        """Why the scheduler ended this job, if it did; asked once, when a connection closes."""
        with self._why_lock:
            if self._why is None:
                self._why = self.starter.ended_why(self.job_id, self._codes_soon()) or ""
            return self._why or None

    def _codes_soon(self) -> list[int | None]:
        """The starter's exit codes, once its processes end or a moment passes: a connection
        that closed because the starter was killed can close before the starter is reaped."""
        deadline = time.monotonic() + ENDED_WAIT_S
        for proc in self.procs:
            with contextlib.suppress(subprocess.TimeoutExpired):
                proc.wait(max(0.0, deadline - time.monotonic()))
        return [proc.poll() for proc in self.procs]

    def command(self) -> list[str]:
        return agent_command(self.pythons, self.starter.identity)

    def start(self, address: str) -> None:
        """Listen, then run the starter; the agents are accepted by `accept`."""
        env = self.listen(address)
        starting = self.starter.processes(self.command(), self.nodes, self.count, address)
        for process in starting:
            logger.debug("agent starter: %s", shown_command(process.argv))
            proc = subprocess.Popen(
                process.argv,
                stdin=subprocess.DEVNULL,
                stdout=subprocess.DEVNULL,
                stderr=subprocess.PIPE,
                env={**env, **process.env},
                start_new_session=True,  # the terminal's Ctrl-C is dtrain's to handle
            )
            self.procs.append(proc)
            if process.host is not None:
                self._proc_of[process.host] = proc
            reading = threading.Thread(
                target=self._read_stderr, args=(proc,), name="dtrain-starter", daemon=True
            )
            reading.start()

    def listen(self, address: str) -> dict[str, str]:
        """Open the socket the agents connect to; the environment that tells them where."""
        listener = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
        listener.bind((address, 0))
        listener.listen(min(self.count, 4096))
        self._listener = listener
        port = listener.getsockname()[1]
        # first, not last: MPICH 4.0's hydra drops the last variable of its environment
        env = {
            KEY_VAR: self._key.hex(),
            CONNECT_VAR: f"[{address}]:{port}" if ":" in address else f"{address}:{port}",
        }
        env.update((k, v) for k, v in os.environ.items() if k not in NOT_EXPORTED)
        return env

    def _read_stderr(self, proc: subprocess.Popen[bytes]) -> None:
        assert proc.stderr is not None
        for raw in proc.stderr:
            line = raw.decode("utf-8", "replace").rstrip()
            self._stderr.append(line)
            logger.debug("%s: %s", self.starter.name, line)
            note = self.starter.note(line)
            if self.on_note is not None and note is not None:
                self.on_note(note)

    def starters_ended(self) -> bool:
        return bool(self.procs) and all(proc.poll() is not None for proc in self.procs)

    def _nothing_left_to_wait_for(self) -> bool:
        """Every starter ended, or every host still missing had its own starter end: no agent
        can come any more (one host's failed qrsh does not hold the launch for the timeout)."""
        if self.starters_ended():
            return True
        if self.nodes is None or not self._proc_of:
            return False
        missing = [node for node in self.nodes if node not in self.agents]
        return all(
            node in self._proc_of and self._proc_of[node].poll() is not None for node in missing
        )

    def accept(self, timeout_s: float | None) -> dict[str, Problem]:
        """Take the agents' connections until every host is in, the starter ends, or time is up.

        `timeout_s` None waits as long as the starter does (it may sit in a queue). Returns
        the problem of each host that did not join, keyed by its name.
        """
        assert self._listener is not None
        deadline = None if timeout_s is None else time.monotonic() + timeout_s
        quiet_until: float | None = time.monotonic() + QUIET_NOTE_S
        pending: list[threading.Thread] = []
        while len(self.agents) < self.count:
            if self._nothing_left_to_wait_for() and not any(t.is_alive() for t in pending):
                break
            if deadline is not None and time.monotonic() > deadline:
                break
            if not self.agents and quiet_until is not None and time.monotonic() > quiet_until:
                quiet_until = None
                note = self.starter.quiet_note(self.nodes, timeout_s)
                if note is not None and self.on_note is not None:
                    self.on_note(note)
            ready, _, _ = select.select([self._listener], [], [], 0.2)
            if ready:
                try:
                    sock, peer = self._listener.accept()
                except OSError:  # closed under us (stop), or out of files: no more agents
                    break
                thread = threading.Thread(target=self._handshake, args=(sock, peer), daemon=True)
                thread.start()
                pending.append(thread)
        for thread in pending:  # once every host is in, a silent stranger holds nothing up
            if len(self.agents) < self.count:
                thread.join(HANDSHAKE_TIMEOUT_S)
        self._listener.close()  # nobody joins this job after this
        return self._missing(timeout_s)

    def _missing(self, timeout_s: float | None) -> dict[str, Problem]:
        if self.nodes is not None:
            missing = [node for node in self.nodes if node not in self.agents]
        else:
            missing = [f"node {i + 1}" for i in range(len(self.agents), self.count)]
        if not missing:
            return {}
        name = self.starter.name
        ended = [proc.returncode for proc in self.procs if proc.poll() is not None]
        waited = f"its agent did not connect back within {timeout_s or 0:.0f}s"
        if self.procs and len(ended) == len(self.procs):
            waited = f"{name} exited with {ended[0]}"
        tail = [line for line in self._stderr if line.strip()][-3:]
        hint = f"{name} said: " + " | ".join(tail) if tail else None
        problems = {}
        for node in missing:
            own = self._proc_of.get(node)
            code = own.poll() if own is not None else None
            why = f"{name} exited with {code}" if code is not None else waited
            problems[node] = Problem(why, host=node, hint=hint)
        return problems

    def _handshake(self, sock: socket.socket, peer: tuple[str, int]) -> None:
        """Admit one connection if it proves it holds the key and names a host still missing."""
        try:
            sock.settimeout(HANDSHAKE_TIMEOUT_S)
            with sock.makefile("rb", 0) as reader:  # unbuffered: reads nothing past a line
                agent = self._verify(sock, reader)
            with self._lock:
                wanted = self.nodes is None or agent.node in self.nodes
                if not wanted or agent.node in self.agents or len(self.agents) >= self.count:
                    raise ValueError(f"{agent.node} is not a host this start is waiting for")
                self.agents[agent.node] = agent
            sock.settimeout(None)
            agent.link.send(agent_payload())
        except (OSError, ValueError) as exc:
            logger.warning("refused a connection from %s: %s", peer[0], exc)
            sock.close()

    def _verify(self, sock: socket.socket, reader: SocketIO) -> Agent:
        """Both sides prove they hold the key (HMAC of the other's nonce and the host name)."""
        words = reader.readline(512).split()
        if len(words) != 6 or words[0] != HELLO:
            raise ValueError("not a dtrain agent")
        node, agent_nonce, order_word, job_id, step_id = words[1:]
        nonce = secrets.token_hex(16).encode()
        sock.sendall(nonce + b" " + _mac(self._key, b"launcher", agent_nonce, node) + b"\n")
        answer = reader.readline(512).strip()
        name = node.decode("utf-8", "replace")
        if not hmac.compare_digest(answer, _mac(self._key, b"agent", nonce, node)):
            raise ValueError(f"{name} did not prove it holds this job's key")
        order = int(order_word) if order_word.isdigit() else len(self.agents)
        if self.starter.names_by_order and self.nodes is not None:
            if not order_word.isdigit() or order >= len(self.nodes):
                raise ValueError(f"{name} has no place among the hosts (rank {order_word!r})")
            name = self.nodes[order]
        return Agent(name, SocketLink(sock, self), job_id.decode(), step_id.decode(), order)

    def stop(self) -> None:
        """The starter ends once its agents have: wait for that, then make sure (SIGTERM,
        SIGKILL to its process: the starter cancels what it asked for)."""
        if self._listener is not None:
            self._listener.close()
        for agent in self.agents.values():
            agent.link.sock.close()
        deadline = time.monotonic() + (STARTER_EXIT_S if self.agents else 0.1)
        for proc in self.procs:
            try:  # with no agent in yet (queued, or failing), there is nothing to wait for
                proc.wait(max(0.0, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                _stop_process(proc)


def _stop_process(proc: subprocess.Popen[bytes]) -> None:
    for sig in (signal.SIGTERM, signal.SIGKILL):
        with contextlib.suppress(ProcessLookupError):
            proc.send_signal(sig)
        try:
            proc.wait(STOP_TIMEOUT_S)
            return
        except subprocess.TimeoutExpired:
            continue


# ---- the engine ----------------------------------------------------------------------------------


class ConnectBackEngine:
    """An `Engine` whose agents connect back: the open, the allocation and the naming of hosts
    that never came, for any starter. A scheduler's module subclasses it with its starter,
    the address its hosts reach the launcher at, and its label."""

    startup_timeout_s: float | None = 120.0

    def __init__(
        self, pythons: Sequence[str], on_note: Callable[[str], None] | None = None
    ) -> None:
        self.pythons = tuple(pythons)
        self.on_note = on_note
        self.step: ConnectBack | None = None

    # -- what a scheduler's module says

    def new_step(self, nodes: Sequence[str] | None, count: int) -> ConnectBack:
        """The start of agents on `nodes` (or `count` nodes the scheduler picks)."""
        raise NotImplementedError

    def listen_address(self, nodes: Sequence[str]) -> str:
        """This machine's address on the route to `nodes`."""
        raise NotImplementedError

    def connect_back(
        self, starter: Starter, nodes: Sequence[str] | None, count: int
    ) -> ConnectBack:
        """A start of the agents by `starter`, with this engine's pythons and notes."""
        return ConnectBack(starter, nodes, count, pythons=self.pythons, on_note=self.on_note)

    def allocation_address(self) -> str:
        """This machine's address for the nodes of an allocation not made yet."""
        raise ConnectError(f"{self.label()} cannot make an allocation")

    def label(self) -> str:
        raise NotImplementedError

    def record(self) -> dict[str, Any] | None:
        return None

    # -- the same for every scheduler

    def allocate(self, count: int) -> tuple[Host, ...]:
        step = self.step = self.new_step(None, count)
        step.start(self.allocation_address())
        problems = step.accept(None)  # as long as the starter waits in the queue
        if problems:
            raise ConnectError(
                f"{step.starter.name} did not start dtrain's agents on {len(problems)} of "
                f"{count} node(s); {NOTHING_STARTED}",
                problems=list(problems.values()),
            )
        agents = sorted(step.agents.values(), key=lambda agent: agent.order)
        return tuple(Host(name=agent.node) for agent in agents)

    def open_links(self, hosts: Sequence[Host]) -> tuple[dict[str, Link], dict[str, Problem]]:
        """Every host's agent from one start (a new one, or the one `allocate` made)."""
        problems: dict[str, Problem] = {}
        step = self.step
        if not hosts and step is None:
            return {}, problems
        if step is None:
            names = [h.name for h in hosts]
            step = self.step = self.new_step(names, len(hosts))
            step.start(self.listen_address(names))
            found = step.accept(self.startup_timeout_s)
            problems |= {h.key: found[h.name] for h in hosts if h.name in found}
        else:
            problems |= {
                h.key: Problem("not in the allocation", host=h.display)
                for h in hosts
                if h.name not in step.agents
            }
        wanted = {h.name for h in hosts}
        for name, agent in step.agents.items():
            if name not in wanted:
                agent.link.close_input()  # a host the job does not use: its agent just exits
        links: dict[str, Link] = {
            h.key: step.agents[h.name].link for h in hosts if h.name in step.agents
        }
        return links, problems

    def close(self) -> None:
        if self.step is not None:
            self.step.stop()
