"""The Slurm engine's connect-back: real agent processes on loopback, no srun.

Each agent here is the very boot code srun runs on a node, started as a local process with the
environment srun would give it; the launcher's side is the real SlurmStep.
"""

from __future__ import annotations

import os
import socket
import subprocess
import sys
import threading
from collections.abc import Iterator

import pytest

from dtrain.agents import ops
from dtrain.agents.session import AgentSession, OutputBudget
from dtrain.plan.hosts import Host
from dtrain.transport import slurm
from dtrain.transport.slurm import SlurmStep

LOOPBACK = "127.0.0.1"


@pytest.fixture
def started() -> Iterator[list[subprocess.Popen[bytes]]]:
    procs: list[subprocess.Popen[bytes]] = []
    yield procs
    for proc in procs:
        proc.kill()
        proc.wait()


def run_agent(
    env: dict[str, str], node: str, procs: list[subprocess.Popen[bytes]], **extra: str
) -> subprocess.Popen[bytes]:
    proc = subprocess.Popen(
        slurm.agent_command(["/nonexistent/python3", sys.executable]),  # the first that exists
        env={**env, "SLURMD_NODENAME": node, "SLURM_NODEID": "0", **extra},
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
    )
    procs.append(proc)
    return proc


def test_agents_that_hold_the_key_join_and_answer_like_any_agent(
    started: list[subprocess.Popen[bytes]],
) -> None:
    step = SlurmStep(["n1", "n2"], 2)
    env = step.listen(LOOPBACK)
    assert slurm.KEY_VAR in env and slurm.CONNECT_VAR in env
    for node in ("n1", "n2"):
        run_agent(env, node, started, SLURM_JOB_ID="7", SLURM_STEP_ID="3")
    try:
        assert step.accept(20) == {}
        assert step.job_id == "7" and step.step_id == "3"
        events: list[object] = []
        link = step.agents["n1"].link
        session = AgentSession(Host("n1"), link, _Sink(events), OutputBudget())
        reply = ops.hello({"n1": session}, 10, ports_for=lambda s: 1).raise_if_failed("hello")
        facts = ops.HelloFacts.from_reply(reply["n1"])
        assert facts.ssh_server_address == LOOPBACK  # the address the launcher reached it at
        assert len(facts.free_ports) == 1
        session.close()
    finally:
        step.stop()
    for proc in started:
        assert proc.wait(10) == 0  # the launcher closed: the agent exits by itself


class _Sink:
    def __init__(self, items: list[object]) -> None:
        self.items = items

    def put(self, item: object, /) -> None:
        self.items.append(item)


def test_a_wrong_key_a_second_agent_for_a_node_and_a_stranger_node_are_refused(
    started: list[subprocess.Popen[bytes]],
) -> None:
    step = SlurmStep(["n1"], 1)
    env = step.listen(LOOPBACK)
    missing: list[dict[str, object]] = []
    accepting = threading.Thread(target=lambda: missing.append(dict(step.accept(30))))
    accepting.start()
    try:
        forged = run_agent({**env, slurm.KEY_VAR: os.urandom(32).hex()}, "n1", started)
        stranger = run_agent(env, "n9", started)
        assert forged.wait(20) != 0
        assert forged.stderr is not None
        assert b"did not prove it is this job's launcher" in forged.stderr.read()
        assert stranger.wait(20) != 0
        assert step.agents == {}
        real = run_agent(env, "n1", started)
        accepting.join(30)
        twin = run_agent(env, "n1", started)
        assert twin.wait(20) != 0  # n1 has its agent, and the step stopped listening
        assert missing == [{}] and list(step.agents) == ["n1"]
    finally:
        step.stop()
        accepting.join(30)
    assert real.wait(10) == 0


def test_a_connection_that_never_speaks_cannot_hold_the_step_up(
    started: list[subprocess.Popen[bytes]],
) -> None:
    step = SlurmStep(["n1"], 1)
    env = step.listen(LOOPBACK)
    host, port = env[slurm.CONNECT_VAR].rsplit(":", 1)
    with socket.create_connection((host, int(port))):
        run_agent(env, "n1", started)
        try:
            assert step.accept(30) == {}
        finally:
            step.stop()


def test_nodes_that_never_connect_are_named_with_why() -> None:
    step = SlurmStep(["n1", "n2"], 2)
    step.listen(LOOPBACK)
    try:
        missing = step.accept(0.5)
    finally:
        step.stop()
    assert sorted(missing) == ["n1", "n2"]
    assert "did not connect back within" in missing["n1"].message
