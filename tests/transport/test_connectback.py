"""The connect-back seam with a per-host starter: one host's starter failing is that host's
problem at once, while the others' agents connect as usual."""

from __future__ import annotations

import sys
import threading
from collections.abc import Sequence

from dtrain.errors import Problem
from dtrain.transport.connectback import (
    ORDER_VAR,
    AgentIdentity,
    ConnectBack,
    StarterProcess,
    agent_command,
)

HOST_VAR = "DTRAIN_TEST_AGENT_HOST"
IDENTITY = AgentIdentity(name_vars=(HOST_VAR,), order_vars=(ORDER_VAR,))


class PerHostStandIn:
    """A stand-in for qrsh/pbsdsh: one process per host, here on this machine; the host named
    `bad` refuses as `qrsh -inherit` does on a host the job was not granted."""

    name = "stand-in"
    identity = IDENTITY
    names_by_order = False

    def processes(
        self, command: Sequence[str], nodes: Sequence[str] | None, count: int, address: str
    ) -> list[StarterProcess]:
        assert nodes is not None
        refuse = ["sh", "-c", "echo 'error: host did not accept task' >&2; exit 1"]
        return [
            StarterProcess(
                refuse if node == "bad" else list(command),
                {HOST_VAR: node, ORDER_VAR: str(order)},
                node,
            )
            for order, node in enumerate(nodes)
        ]

    def note(self, line: str) -> str | None:
        return None

    def quiet_note(self, nodes: Sequence[str] | None, timeout_s: float | None) -> str | None:
        return None

    def ended_why(self, job_id: str, returncodes: Sequence[int | None]) -> str | None:
        return None


def test_a_host_whose_own_starter_ended_is_missing_at_once_not_after_the_wait() -> None:
    step = ConnectBack(PerHostStandIn(), ["good", "bad"], 2, pythons=[sys.executable])
    assert agent_command([sys.executable], IDENTITY)  # the command every good host runs
    step.start("127.0.0.1")
    problems: dict[str, Problem] = {}
    # No deadline of its own (a starter may sit in a queue): only the failed starter ends it.
    accepting = threading.Thread(target=lambda: problems.update(step.accept(None)), daemon=True)
    try:
        accepting.start()
        accepting.join(60)
        assert not accepting.is_alive(), "still waiting for a host whose starter had ended"
        assert sorted(step.agents) == ["good"]
        assert list(problems) == ["bad"]
        assert (problems["bad"].host, problems["bad"].message) == ("bad", "stand-in exited with 1")
        assert "did not accept task" in (problems["bad"].hint or "")
    finally:
        step.stop()
