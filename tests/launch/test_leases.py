"""Each host's lease: the flag, else what the host's ssh config tells OpenSSH, else 15 s."""

from __future__ import annotations

from typing import cast

import pytest

from dtrain.agents.group import AgentGroup
from dtrain.agents.session import AgentSession
from dtrain.launch.lifecycle import DEFAULT_LEASE_S, MIN_LEASE_S, host_leases
from dtrain.plan.hosts import Host


class Group:
    """The one thing host_leases asks of an AgentGroup."""

    def __init__(self, limits: dict[str, float | None]) -> None:
        self.limits = limits

    def silence_limit_s(self, host: Host) -> float | None:
        return self.limits[host.name]


class Session:
    def __init__(self, name: str) -> None:
        self.host = Host(name=name)


LIMITS: dict[str, float | None] = {"a": None, "b": 6.0, "c": 0.5}


def leases(lease_s: float | None) -> dict[str, float]:
    sessions = {name: cast(AgentSession, Session(name)) for name in LIMITS}
    return host_leases(cast(AgentGroup, Group(LIMITS)), sessions, lease_s)


def test_without_the_flag_each_host_gets_its_ssh_limit_bounded_below() -> None:
    assert leases(None) == {"a": DEFAULT_LEASE_S, "b": 6.0, "c": MIN_LEASE_S}


@pytest.mark.parametrize("flag", [2.0, 30.0])
def test_the_flag_wins_for_every_host(flag: float) -> None:
    assert leases(flag) == {"a": flag, "b": flag, "c": flag}
