#!/usr/bin/env python3
# This file must run on any host's python3 >= 3.8. Before 3.10, socket.timeout is not
# TimeoutError and zip() has no strict=, so those two modernisations are off here.
# ruff: noqa: UP041, B905
"""A parameter-server job in plain Python (standard library only, Python >= 3.8).

The quickstart's first job: a scheduler, servers and workers meet over the DMLC_* addresses
that `dtrain launch` sets and train a linear model by synchronous data-parallel SGD, with
ps-lite's `dist_sync` semantics. The model's keys are sharded over the servers. Every round,
each worker pushes the gradient of its own data shard. Each server waits for every worker's
push, averages the pushes, updates its keys and sends the new weights back. At the end the
scheduler checks that all workers hold the same final weights.

Every wait is bounded. If a peer disappears or stalls, this process exits non-zero with a
single line that names what it was waiting for, so the launcher sees a failure, not a hang.

    dtrain launch -n 2 -s 2 -- python examples/ps_sum.py --rounds 20

Exit codes: 0 done and verified; 1 the job failed (lost peer, timeout, workers disagree);
2 bad DMLC_* environment or flags; 3 injected failure (`--fail-mode exit`).
"""

from __future__ import annotations

import argparse
import contextlib
import hashlib
import json
import os
import random
import select
import socket
import struct
import sys
import time
from collections import deque
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from dataclasses import dataclass
from typing import Any

PROG = "ps_sum"
ROLES = ("scheduler", "server", "worker")
HEADER = struct.Struct("!I")
MAX_FRAME_BYTES = 16 << 20
HELLO_TIMEOUT_S = 5.0
# When a worker stalls, the servers know exactly whose push is missing. Waits further from
# that knowledge (workers' pulls, the scheduler) last a little longer, so that the precise
# message comes first.
ROUND_MARGIN_S = {"server": 0.0, "worker": 2.0, "scheduler": 4.0}
START_HINT = "start this script with `dtrain launch`, which sets every DMLC_* variable"


class UsageError(Exception):
    """The environment or the flags are wrong: exit 2 before touching the network."""


class JobError(Exception):
    """The job cannot finish (a peer is gone, stalled or disagrees): exit 1."""


@dataclass(frozen=True)
class NodeEnv:
    """This task's view of the job, read once from the DMLC_* variables."""

    role: str
    node_id: int
    root_host: str
    root_port: int
    num_worker: int
    num_server: int
    node_host: str
    task: str

    @property
    def label(self) -> str:
        return "scheduler" if self.role == "scheduler" else f"{self.role} {self.node_id}"


def _require(environ: Mapping[str, str], name: str, expected: str) -> str:
    value = environ.get(name, "").strip()
    if not value:
        raise UsageError(f"{name} is not set (expected {expected}); {START_HINT}")
    return value


def _require_int(environ: Mapping[str, str], name: str, low: int, high: int) -> int:
    expected = f"an integer {low}-{high}"
    text = _require(environ, name, expected)
    try:
        value = int(text)
    except ValueError:
        value = low - 1
    if not low <= value <= high:
        raise UsageError(f"{name}={text!r} is not {expected}; {START_HINT}")
    return value


def read_env(environ: Mapping[str, str]) -> NodeEnv:
    """Validate the launcher's contract up front so a bad variable never becomes a hang."""
    role = _require(environ, "DMLC_ROLE", "scheduler, server or worker")
    if role not in ROLES:
        raise UsageError(f"DMLC_ROLE={role!r} is not one of: {', '.join(ROLES)}")
    root_host = _require(environ, "DMLC_PS_ROOT_URI", "the scheduler's IP address")
    root_port = _require_int(environ, "DMLC_PS_ROOT_PORT", 1, 65535)
    num_worker = _require_int(environ, "DMLC_NUM_WORKER", 1, 10_000)
    num_server = _require_int(environ, "DMLC_NUM_SERVER", 1, 10_000)
    node_id = 0
    if role == "server":
        node_id = _require_int(environ, "DMLC_SERVER_ID", 0, num_server - 1)
    elif role == "worker":
        node_id = _require_int(environ, "DMLC_WORKER_ID", 0, num_worker - 1)
    # Servers listen, so they need the address peers reach them at; others only connect out.
    node_host = environ.get("DMLC_NODE_HOST", "").strip()
    if role == "server" and not node_host:
        raise UsageError(f"DMLC_NODE_HOST is not set (expected this host's IP); {START_HINT}")
    default_task = "scheduler" if role == "scheduler" else f"{role}.{node_id}"
    task = environ.get("DTRAIN_TASK", "") or default_task
    return NodeEnv(role, node_id, root_host, root_port, num_worker, num_server, node_host, task)


def say(env: NodeEnv, text: str) -> None:
    """Progress for the person watching; flushed because a launcher reads it through a pipe."""
    print(f"{env.label}: {text}", flush=True)


# ---------------------------------------------------------------- framed JSON over TCP


class Link:
    """One TCP connection carrying length-prefixed JSON; `name` is how errors call the peer."""

    def __init__(self, sock: socket.socket, name: str) -> None:
        sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
        self.sock = sock
        self.name = name
        self.inbox: deque[dict[str, Any]] = deque()

    def send(self, msg: Mapping[str, Any], timeout_s: float) -> None:
        data = json.dumps(msg, separators=(",", ":")).encode()
        self.sock.settimeout(timeout_s)
        try:
            self.sock.sendall(HEADER.pack(len(data)) + data)
        except socket.timeout:
            raise JobError(f"timed out after {timeout_s:g}s sending to {self.name}") from None
        except OSError as exc:
            raise JobError(f"lost {self.name} while sending to it ({_reason(exc)})") from None

    def read(self, deadline: float, waiting_for: str) -> dict[str, Any]:
        """Read one whole frame; EOF, reset or the deadline become a JobError naming the wait."""
        (size,) = HEADER.unpack(self._read_exact(HEADER.size, deadline, waiting_for))
        if size > MAX_FRAME_BYTES:
            raise JobError(f"{self.name} sent a {size}-byte frame; is it really a {PROG} node?")
        try:
            msg = json.loads(self._read_exact(size, deadline, waiting_for))
        except ValueError:
            raise JobError(f"{self.name} sent a frame that is not JSON") from None
        if not isinstance(msg, dict) or not isinstance(msg.get("op"), str):
            raise JobError(f"{self.name} sent a message without an 'op'")
        return msg

    def _read_exact(self, size: int, deadline: float, waiting_for: str) -> bytes:
        chunks: list[bytes] = []
        while size:
            remaining = deadline - time.monotonic()
            if remaining <= 0:
                raise JobError(f"timed out waiting for {waiting_for} (from {self.name})")
            self.sock.settimeout(remaining)
            try:
                chunk = self.sock.recv(min(size, 1 << 16))
            except socket.timeout:
                continue
            except OSError as exc:
                reason = _reason(exc)
                raise JobError(
                    f"lost {self.name} ({reason}) while waiting for {waiting_for}"
                ) from None
            if not chunk:
                raise JobError(
                    f"lost {self.name} (connection closed) while waiting for {waiting_for}"
                )
            chunks.append(chunk)
            size -= len(chunk)
        return b"".join(chunks)

    def close(self) -> None:
        self.sock.close()


def _reason(exc: OSError) -> str:
    return exc.strerror or type(exc).__name__


def receive(
    expect: Link, watch: Sequence[Link], timeout_s: float, waiting_for: str
) -> dict[str, Any]:
    """Wait for the next message from `expect` while noticing at once if a watched peer dies.

    Ordinary messages that arrive early on watched links are queued; an `abort` from any
    link, or any link closing, ends the wait with a JobError.
    """
    deadline = time.monotonic() + timeout_s
    by_sock = {link.sock: link for link in (expect, *watch)}
    while not expect.inbox:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            raise JobError(f"timed out after {timeout_s:g}s waiting for {waiting_for}")
        readable, _, _ = select.select(list(by_sock), [], [], remaining)
        for sock in readable:
            link = by_sock[sock]
            # A frame has started to arrive: let it finish even if the deadline just passed.
            msg = link.read(max(deadline, time.monotonic() + 1.0), waiting_for)
            if msg["op"] == "abort":
                raise JobError(f"{link.name} aborted the job: {msg.get('reason', '?')}")
            link.inbox.append(msg)
    return expect.inbox.popleft()


@contextlib.contextmanager
def abort_on_error(peers: Iterable[Link]) -> Iterator[None]:
    """On failure, tell these peers why before exiting, so each log says what went wrong first."""
    try:
        yield
    except JobError as exc:
        for link in peers:
            with contextlib.suppress(JobError):
                link.send({"op": "abort", "reason": str(exc)}, 1.0)
        raise


def expect_op(msg: Mapping[str, Any], op: str, link: Link, **fields: Any) -> None:
    """Refuse out-of-protocol messages loudly rather than training on garbage."""
    wrong = msg["op"] != op or any(msg.get(k) != v for k, v in fields.items())
    if wrong:
        raise JobError(f"{link.name} sent {msg['op']!r} {_brief(msg)}, expected {op!r} {fields}")


def _brief(msg: Mapping[str, Any]) -> str:
    return json.dumps({k: v for k, v in msg.items() if not isinstance(v, list)})[:200]


def connect(host: str, port: int, timeout_s: float, what: str, *, retry: bool) -> socket.socket:
    """Connect, retrying refusals until the deadline when the peer may simply start later."""
    deadline = time.monotonic() + timeout_s
    while True:
        remaining = deadline - time.monotonic()
        try:
            return socket.create_connection((host, port), timeout=max(0.1, min(remaining, 5.0)))
        except (ConnectionRefusedError, socket.timeout) as exc:
            problem = "connection refused" if isinstance(exc, ConnectionRefusedError) else "timeout"
            if not retry or remaining <= 0.2:
                raise JobError(
                    f"could not connect to {what} at {host}:{port} within {timeout_s:g}s "
                    f"({problem})"
                ) from None
            time.sleep(0.2)
        except OSError as exc:
            raise JobError(f"cannot connect to {what} at {host}:{port}: {_reason(exc)}") from None


def listen(host: str, port: int, what: str) -> socket.socket:
    try:
        listener = socket.socket(socket.AF_INET6 if ":" in host else socket.AF_INET)
        listener.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
        listener.bind((host, port))
        listener.listen(128)
    except OSError as exc:
        raise JobError(f"cannot listen on {host}:{port} for {what}: {_reason(exc)}") from None
    return listener


# ---------------------------------------------------------------- the model


@dataclass(frozen=True)
class Problem:
    """Synthetic linear regression, identical on every node because the seed is shared."""

    features: list[list[float]]
    targets: list[float]
    true_weights: list[float]


def make_problem(samples: int, dim: int, seed: int) -> Problem:
    rng = random.Random(seed)
    true_weights = [round(rng.uniform(-1.0, 1.0), 3) for _ in range(dim + 1)]
    features, targets = [], []
    for _ in range(samples):
        row = [rng.gauss(0.0, 1.0) for _ in range(dim)] + [1.0]  # last key is the bias
        features.append(row)
        targets.append(sum(x * w for x, w in zip(row, true_weights)) + rng.gauss(0.0, 0.01))
    return Problem(features, targets, true_weights)


def loss_and_gradient(
    features: Sequence[Sequence[float]], targets: Sequence[float], weights: Sequence[float]
) -> tuple[float, list[float]]:
    """Mean squared error of this shard and its gradient."""
    gradient = [0.0] * len(weights)
    loss = 0.0
    for row, target in zip(features, targets):
        residual = sum(x * w for x, w in zip(row, weights)) - target
        loss += residual * residual
        for k, x in enumerate(row):
            gradient[k] += 2.0 * residual * x
    n = len(targets)
    return loss / n, [g / n for g in gradient]


def shard_bounds(num_keys: int, num_server: int, server_id: int) -> tuple[int, int]:
    return server_id * num_keys // num_server, (server_id + 1) * num_keys // num_server


def checksum(weights: Sequence[float]) -> str:
    """Bit-exact fingerprint: equal only if every worker holds exactly the same floats."""
    return hashlib.sha256(struct.pack(f"<{len(weights)}d", *weights)).hexdigest()[:16]


def job_config(args: argparse.Namespace, env: NodeEnv) -> dict[str, Any]:
    """What every node must agree on; the scheduler compares it at registration."""
    return {
        "rounds": args.rounds,
        "dim": args.dim,
        "samples": args.samples,
        "lr": args.lr,
        "seed": args.seed,
        "num_worker": env.num_worker,
        "num_server": env.num_server,
    }


def log_this_round(round_no: int, rounds: int) -> bool:
    return round_no in (1, rounds) or round_no % max(1, rounds // 5) == 0


# ---------------------------------------------------------------- roles


def roster_timeout_s(args: argparse.Namespace) -> float:
    """Outlast the scheduler's own registration deadline, so its abort (naming who is missing)
    arrives before this node gives up on its own."""
    return float(args.timeout) + 5.0


def round_wait_s(args: argparse.Namespace, role: str) -> float:
    """How long `role` waits for one round's message: workers may sleep between rounds."""
    return float(args.timeout + args.sleep) + ROUND_MARGIN_S[role]


def register(env: NodeEnv, args: argparse.Namespace, extra: Mapping[str, Any]) -> Link:
    """Connect to the scheduler (which may start later than us) and announce this node."""
    what = f"the scheduler (DMLC_PS_ROOT_URI={env.root_host}, DMLC_PS_ROOT_PORT={env.root_port})"
    say(env, f"connecting to the scheduler at {env.root_host}:{env.root_port}")
    sock = connect(env.root_host, env.root_port, args.timeout, what, retry=True)
    sched = Link(sock, "the scheduler")
    hello = {"op": "register", "role": env.role, "id": env.node_id, "task": env.task}
    sched.send({**hello, "config": job_config(args, env), **extra}, args.timeout)
    return sched


def run_scheduler(env: NodeEnv, args: argparse.Namespace) -> None:
    listener = listen(env.root_host, env.root_port, "the servers and workers to register")
    total = env.num_server + env.num_worker
    say(env, f"listening on {env.root_host}:{env.root_port} for {total} nodes")
    links: dict[tuple[str, int], Link] = {}
    with abort_on_error(links.values()):  # a live view: whoever has registered so far
        addresses = accept_registrations(env, args, listener, links)
        listener.close()
        servers = [links["server", s] for s in range(env.num_server)]
        workers = [links["worker", w] for w in range(env.num_worker)]
        shown = ", ".join(f"{h}:{p}" for h, p in addresses)
        say(env, f"all {total} nodes registered; servers at {shown}")
        for link in (*servers, *workers):
            link.send({"op": "roster", "servers": addresses}, args.timeout)
        follow_training(env, args, servers, workers)


def accept_registrations(
    env: NodeEnv,
    args: argparse.Namespace,
    listener: socket.socket,
    links: dict[tuple[str, int], Link],
) -> list[tuple[str, int]]:
    """Accept one registration per expected node; return the servers' addresses by id."""
    expected = {("server", s) for s in range(env.num_server)}
    expected |= {("worker", w) for w in range(env.num_worker)}
    addresses: dict[int, tuple[str, int]] = {}
    deadline = time.monotonic() + args.timeout
    while len(links) < len(expected):
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = ", ".join(f"{r} {i}" for r, i in sorted(expected - set(links)))
            raise JobError(f"timed out after {args.timeout:g}s waiting for {missing} to register")
        readable, _, _ = select.select(
            [listener, *(k.sock for k in links.values())], [], [], remaining
        )
        for sock in readable:
            if sock is not listener:
                # A registered node may only speak after the roster: EOF raises, data is wrong.
                link = next(k for k in links.values() if k.sock is sock)
                msg = link.read(deadline, "the other nodes to register")
                if msg["op"] == "abort":
                    raise JobError(f"{link.name} aborted the job: {msg.get('reason', '?')}")
                raise JobError(f"{link.name} spoke out of turn during registration")
            conn, peer = listener.accept()
            link = Link(conn, f"a connection from {peer[0]}:{peer[1]}")
            try:
                msg = link.read(time.monotonic() + HELLO_TIMEOUT_S, "its registration")
                expect_op(msg, "register", link)
            except JobError as exc:  # a port probe or a stray client must not sink the job
                print(
                    f"{PROG}: scheduler: warning: ignored a stray connection: {exc}",
                    file=sys.stderr,
                    flush=True,
                )
                link.close()
                continue
            key = (str(msg.get("role")), msg.get("id"))
            if key not in expected:
                raise JobError(f"{link.name} registered as {key[0]} {key[1]}, which this job lacks")
            if key in links:
                raise JobError(f"two nodes registered as {key[0]} {key[1]}; check DMLC_*_ID")
            link.name = f"{key[0]} {key[1]} ({msg.get('task')})"
            links[key] = link
            for name, value in job_config(args, env).items():
                if msg["config"].get(name) != value:
                    raise JobError(
                        f"{link.name} runs with {name}={msg['config'].get(name)} but the scheduler "
                        f"with {name}={value}; every task must get the same arguments and DMLC_*"
                    )
            if key[0] == "server":
                addresses[int(msg["id"])] = (str(msg["host"]), int(msg["port"]))
            say(env, f"{link.name} registered ({len(links)}/{len(expected)})")
    return [addresses[s] for s in range(env.num_server)]


def follow_training(
    env: NodeEnv, args: argparse.Namespace, servers: list[Link], workers: list[Link]
) -> None:
    """Watch every node each round, then verify the workers' checksums and stop the servers."""
    everyone = [*servers, *workers]
    round_timeout_s = round_wait_s(args, "scheduler")
    for round_no in range(1, args.rounds + 1):
        losses = []
        for worker_id, link in enumerate(workers):
            others = [k for k in everyone if k is not link]
            waiting_for = f"worker {worker_id} to finish round {round_no}"
            msg = receive(link, others, round_timeout_s, waiting_for)
            expect_op(msg, "progress", link, round=round_no)
            losses.append(float(msg["loss"]))
        if log_this_round(round_no, args.rounds):
            mean = sum(losses) / len(losses)
            say(env, f"round {round_no}/{args.rounds} done by all workers, mean loss {mean:.6f}")
    sums = []
    for worker_id, link in enumerate(workers):
        others = [k for k in everyone if k is not link]
        msg = receive(link, others, args.timeout, f"worker {worker_id}'s final checksum")
        expect_op(msg, "result", link)
        sums.append(str(msg["checksum"]))
    agreed = len(set(sums)) == 1
    verdict = f"all {len(sums)} workers agree on checksum {sums[0]}"
    if len(sums) == 1:
        verdict = f"the only worker reported checksum {sums[0]}"
    if not agreed:
        verdict = "workers disagree: " + ", ".join(f"worker {i}={c}" for i, c in enumerate(sums))
    for link in workers:
        link.send({"op": "verdict", "ok": agreed, "text": verdict}, args.timeout)
    for link in servers:
        link.send({"op": "shutdown"}, args.timeout)
    if not agreed:
        raise JobError(verdict)
    say(env, f"{verdict}; servers told to shut down; job done")


def run_server(env: NodeEnv, args: argparse.Namespace) -> None:
    listener = listen(env.node_host, 0, "workers")
    port = listener.getsockname()[1]
    sched = register(env, args, {"host": env.node_host, "port": port})
    with abort_on_error([sched]):
        serve(env, args, listener, sched)


def serve(env: NodeEnv, args: argparse.Namespace, listener: socket.socket, sched: Link) -> None:
    """Hold this server's keys and apply one averaged update per round (dist_sync)."""
    port = listener.getsockname()[1]
    roster = receive(sched, [], roster_timeout_s(args), "the roster from the scheduler")
    expect_op(roster, "roster", sched)
    lo, hi = shard_bounds(args.dim + 1, env.num_server, env.node_id)
    say(env, f"listening on {env.node_host}:{port}; holding keys {lo}..{hi - 1} of 0..{args.dim}")
    workers = accept_workers(env, args, listener, sched)
    listener.close()
    weights = [0.0] * (hi - lo)
    for link in workers:  # the initial pull
        link.send({"op": "weights", "round": 0, "w": weights}, args.timeout)
    for round_no in range(1, args.rounds + 1):
        pushes = []
        for worker_id, link in enumerate(workers):
            others = [sched, *(k for k in workers if k is not link)]
            waiting_for = f"worker {worker_id}'s push for round {round_no}"
            msg = receive(link, others, round_wait_s(args, "server"), waiting_for)
            expect_op(msg, "push", link, round=round_no)
            pushes.append(msg["grad"])
        # dist_sync: apply only once every worker has pushed, always summing in worker order.
        mean = [sum(column) / len(pushes) for column in zip(*pushes)]
        weights = [w - args.lr * g for w, g in zip(weights, mean)]
        for link in workers:
            link.send({"op": "weights", "round": round_no, "w": weights}, args.timeout)
        if log_this_round(round_no, args.rounds):
            say(env, f"round {round_no}/{args.rounds}: averaged {len(pushes)} pushes, updated")
    # Workers hang up first; closing here could race with a worker still reading other servers.
    msg = receive(sched, [], args.timeout, "the scheduler to end the job")
    expect_op(msg, "shutdown", sched)
    for link in workers:
        link.close()
    say(env, "shut down by the scheduler")


def accept_workers(
    env: NodeEnv, args: argparse.Namespace, listener: socket.socket, sched: Link
) -> list[Link]:
    """Accept every worker's connection, ordered by worker id so reductions are deterministic."""
    links: dict[int, Link] = {}
    deadline = time.monotonic() + args.timeout
    while len(links) < env.num_worker:
        remaining = deadline - time.monotonic()
        if remaining <= 0:
            missing = [w for w in range(env.num_worker) if w not in links]
            raise JobError(f"timed out after {args.timeout:g}s waiting for workers {missing}")
        readable, _, _ = select.select([listener, sched.sock], [], [], remaining)
        if sched.sock in readable:
            msg = sched.read(deadline, "the workers to connect")
            raise JobError(f"the scheduler aborted the job: {msg.get('reason', msg['op'])}")
        if listener in readable:
            conn, peer = listener.accept()
            link = Link(conn, f"a connection from {peer[0]}:{peer[1]}")
            msg = link.read(time.monotonic() + HELLO_TIMEOUT_S, "a worker's hello")
            expect_op(msg, "hello", link)
            worker_id = int(msg["id"])
            if worker_id in links or not 0 <= worker_id < env.num_worker:
                raise JobError(f"{link.name} claims to be worker {worker_id}, which is taken")
            link.name = f"worker {worker_id}"
            links[worker_id] = link
    return [links[w] for w in range(env.num_worker)]


def run_worker(env: NodeEnv, args: argparse.Namespace) -> None:
    problem = make_problem(args.samples, args.dim, args.seed)
    sched = register(env, args, {})
    with abort_on_error([sched]):
        train(env, args, problem, sched)


def train(env: NodeEnv, args: argparse.Namespace, problem: Problem, sched: Link) -> None:
    """Each round: gradient of this worker's shard -> push to servers -> pull new weights."""
    rows = range(env.node_id, args.samples, env.num_worker)  # this worker's data shard
    features = [problem.features[i] for i in rows]
    targets = [problem.targets[i] for i in rows]
    roster = receive(sched, [], roster_timeout_s(args), "the roster from the scheduler")
    expect_op(roster, "roster", sched)
    servers = []
    for server_id, (host, port) in enumerate(roster["servers"]):
        what = f"server {server_id}"
        link = Link(connect(host, port, args.timeout, what, retry=False), f"{what} ({host}:{port})")
        link.send({"op": "hello", "id": env.node_id}, args.timeout)
        servers.append(link)
    bounds = [shard_bounds(args.dim + 1, env.num_server, s) for s in range(env.num_server)]
    say(env, f"connected to {len(servers)} servers; training on {len(targets)} samples")
    weights = [0.0] * (args.dim + 1)
    pull(servers, sched, bounds, weights, 0, args.timeout)
    losses = []
    for round_no in range(1, args.rounds + 1):
        if env.node_id == args.fail_worker and round_no == args.fail_at_round:
            inject_failure(env, args.fail_mode, round_no)
        loss, gradient = loss_and_gradient(features, targets, weights)
        for link, (lo, hi) in zip(servers, bounds):
            link.send({"op": "push", "round": round_no, "grad": gradient[lo:hi]}, args.timeout)
        pull(servers, sched, bounds, weights, round_no, round_wait_s(args, "worker"))
        losses.append(loss)
        sched.send({"op": "progress", "round": round_no, "loss": loss}, args.timeout)
        if log_this_round(round_no, args.rounds):
            say(env, f"round {round_no}/{args.rounds} loss {loss:.6f}")
        if args.sleep:
            time.sleep(args.sleep)
    for link in servers:
        link.close()
    final_loss, _ = loss_and_gradient(features, targets, weights)
    digest = checksum(weights)
    sched.send({"op": "result", "checksum": digest, "loss": final_loss}, args.timeout)
    trajectory = " ".join(f"{x:.3g}" for x in losses)
    say(env, f"loss by round: {trajectory}; after training {final_loss:.3g}")
    error = max(abs(w - t) for w, t in zip(weights, problem.true_weights))
    say(env, f"final weights checksum {digest} (max |w - w_true| = {error:.4f})")
    verdict = receive(sched, [], args.timeout, "the scheduler's verdict on the checksums")
    expect_op(verdict, "verdict", sched)
    if not verdict["ok"]:
        raise JobError(str(verdict["text"]))
    say(env, f"scheduler confirms: {verdict['text']}")


def pull(
    servers: Sequence[Link],
    sched: Link,
    bounds: Sequence[tuple[int, int]],
    weights: list[float],
    round_no: int,
    timeout_s: float,
) -> None:
    """Fill `weights` in place from every server's reply for `round_no`.

    Only servers that still owe a reply are watched: one that has answered the last round
    may already have hung up.
    """
    for server_id, (link, (lo, hi)) in enumerate(zip(servers, bounds)):
        others = [sched, *servers[server_id + 1 :]]
        waiting_for = f"server {server_id}'s weights for round {round_no}"
        msg = receive(link, others, timeout_s, waiting_for)
        expect_op(msg, "weights", link, round=round_no)
        weights[lo:hi] = msg["w"]


def inject_failure(env: NodeEnv, mode: str, round_no: int) -> None:
    """Crash on purpose so tests can watch the launcher handle a dying worker."""
    say(env, f"injecting a failure at round {round_no} (--fail-mode {mode})")
    if mode == "exit":
        sys.exit(3)
    raise RuntimeError(f"injected failure in {env.label} at round {round_no}")


# ---------------------------------------------------------------- entry point


def parse_args(argv: Sequence[str] | None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(
        prog=PROG,
        description="Synchronous parameter-server SGD on a linear model, standard library only. "
        "Run it in every role with the DMLC_* variables set, e.g. via "
        "`dtrain launch -n 2 -s 2 -- python examples/ps_sum.py`.",
    )
    parser.add_argument("--rounds", type=int, default=20, help="SGD rounds (default 20)")
    parser.add_argument("--dim", type=int, default=8, help="number of features (default 8)")
    parser.add_argument("--samples", type=int, default=256, help="dataset size (default 256)")
    parser.add_argument("--lr", type=float, default=0.2, help="learning rate (default 0.2)")
    parser.add_argument("--seed", type=int, default=1234, help="data seed (default 1234)")
    parser.add_argument("--sleep", type=float, default=0.0, help="seconds workers pause per round")
    parser.add_argument(
        "--timeout", type=float, default=30.0, help="longest wait for any peer (default 30 s)"
    )
    parser.add_argument("--fail-worker", type=int, help="worker id that fails on purpose")
    parser.add_argument("--fail-at-round", type=int, help="round (1-based) at which it fails")
    parser.add_argument(
        "--fail-mode",
        choices=("exit", "raise"),
        default="exit",
        help="exit: exit code 3; raise: unhandled exception (default exit)",
    )
    args = parser.parse_args(argv)
    if not 1 <= args.rounds <= 100_000 or not 1 <= args.dim <= 10_000:
        parser.error("--rounds must be 1-100000 and --dim 1-10000")
    if args.sleep < 0 or args.timeout <= 0:
        parser.error("--sleep must be >= 0 and --timeout > 0")
    if (args.fail_worker is None) != (args.fail_at_round is None):
        parser.error("--fail-worker and --fail-at-round go together")
    if args.fail_at_round is not None and not 1 <= args.fail_at_round <= args.rounds:
        parser.error(f"--fail-at-round must be 1-{args.rounds}")
    return args


RUNNERS: dict[str, Callable[[NodeEnv, argparse.Namespace], None]] = {
    "scheduler": run_scheduler,
    "server": run_server,
    "worker": run_worker,
}


def main(argv: Sequence[str] | None = None) -> int:
    args = parse_args(argv)
    try:
        env = read_env(os.environ)
        if args.samples < env.num_worker:
            raise UsageError(
                f"--samples {args.samples} leaves some of the {env.num_worker} workers no data"
            )
        if args.fail_worker is not None and not 0 <= args.fail_worker < env.num_worker:
            raise UsageError(
                f"--fail-worker {args.fail_worker} is not a worker id (0-{env.num_worker - 1})"
            )
    except UsageError as exc:
        print(f"{PROG}: error: {exc}", file=sys.stderr, flush=True)
        return 2
    try:
        RUNNERS[env.role](env, args)
    except JobError as exc:
        print(f"{PROG}: {env.label}: error: {exc}", file=sys.stderr, flush=True)
        return 1
    except KeyboardInterrupt:
        return 130
    return 0


if __name__ == "__main__":
    sys.exit(main())
