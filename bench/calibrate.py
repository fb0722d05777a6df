"""Per-connection costs of dtrain's own ssh path, measured in-process, to calibrate the model.

Uses dtrain's SshTransport and AgentSession exactly as `dtrain launch` does (one connection
per host, the agent on one exec channel), timing each step on its own: connect+auth, a bare
channel open, an exec of `true` through the login shell, and the agent's bootstrap up to its
first reply. Wall time is what a host adds on the critical path; CPU time (this process, all
threads) is what each host costs the launcher, which is what serializes at scale.
"""

from __future__ import annotations

import queue
import statistics
import subprocess
import time
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any


def _timed(step: Any) -> tuple[float, float, Any]:
    """(wall s, launcher CPU s, result) of calling `step`."""
    cpu, wall = time.process_time(), time.perf_counter()
    result = step()
    return time.perf_counter() - wall, time.process_time() - cpu, result


def per_connection(hosts: Sequence[str], ssh_config: Path, reps: int) -> dict[str, Any]:
    """Median wall and CPU of each step against the first host, and parallel connects."""
    from dtrain.plan.hosts import Host
    from dtrain.transport.bootstrap import agent_payload
    from dtrain.transport.options import SshOptions

    agent_payload()  # compressed once per process; not a per-host cost
    options = SshOptions(config_file=str(ssh_config))
    samples: dict[str, list[float]] = {}

    def add(name: str, wall: float, cpu: float) -> None:
        samples.setdefault(f"{name}_s", []).append(wall)
        samples.setdefault(f"{name}_cpu_s", []).append(cpu)

    for _ in range(reps):
        _one_round(Host(hosts[0]), options, add)
        _one_round(Host(hosts[0]), options, add, tuned=True)
        wall, _, _ = _timed(
            lambda: subprocess.run(
                ["ssh", "-F", str(ssh_config), hosts[0], "true"],
                stdin=subprocess.DEVNULL,
                capture_output=True,
                timeout=20,
                check=True,
            )
        )
        samples.setdefault("openssh_true_s", []).append(wall)
    result: dict[str, Any] = {k: statistics.median(v) for k, v in samples.items()}
    result["parallel_connect"] = parallel_connects(hosts, options, reps)
    return result


def _one_round(
    host: Any, options: Any, add: Callable[[str, float, float], None], tuned: bool = False
) -> None:
    """One fresh connection to `host`, then each step on it, as dtrain takes them.

    `tuned` waits 0.1 s before the first channel (if the first channel's ~40 ms disappears,
    it is the server's Nagle waiting for our delayed ACK of its post-auth messages, not work),
    and runs the agent under /usr/bin/python3 instead of `python3` from the login PATH (which
    with pyenv is a shim that runs `pyenv exec`).
    """
    from dtrain.agents.session import AgentSession, Event
    from dtrain.remote import proto
    from dtrain.transport.ssh import SshTransport

    transport = SshTransport(options)
    try:
        wall, cpu, problems = _timed(lambda: transport.try_connect_all([host]))
        if problems:
            raise RuntimeError(f"calibration could not connect: {problems}")
        suffix = "_tuned" if tuned else ""
        add("connect" + suffix, wall, cpu)
        client = transport.clients[host.name].get_transport()
        assert client is not None
        if tuned:
            time.sleep(0.1)
        wall, cpu, channel = _timed(lambda: client.open_session(timeout=10))
        channel.close()
        add("channel" + suffix, wall, cpu)  # the first channel on a fresh connection
        wall, cpu, channel = _timed(lambda: client.open_session(timeout=10))
        channel.close()
        add("channel_again" + suffix, wall, cpu)

        def exec_true() -> int:
            channel = client.open_session(timeout=10)
            channel.exec_command("true")
            status = channel.recv_exit_status()
            channel.close()
            return status

        wall, cpu, _ = _timed(exec_true)
        add("exec_true" + suffix, wall, cpu)
        events: queue.SimpleQueue[Event] = queue.SimpleQueue()

        def agent_hello() -> AgentSession:
            python = "/usr/bin/python3" if tuned else "python3"
            session = AgentSession(host, transport.open_link(host, python=python), events)
            session.request(
                proto.OP_HELLO, 30.0, ports=0, heartbeat_s=1.0, lease_s=15.0, grace_s=1.0
            )
            return session

        wall, cpu, session = _timed(agent_hello)
        add("agent" + suffix, wall, cpu)
        session.close()
        session.wait_closed(5.0)
    finally:
        transport.close()


def parallel_connects(hosts: Sequence[str], options: Any, reps: int) -> dict[int, dict[str, float]]:
    """Connect+auth to 1, 2, 4... hosts at once with dtrain's bounded pool: wall and CPU."""
    from dtrain.plan.hosts import Host
    from dtrain.transport.ssh import SshTransport

    counts = sorted({n for n in (1, 2, 4, 8, 16, 32, len(hosts)) if n <= len(hosts)})
    found: dict[int, dict[str, float]] = {}
    for count in counts:
        walls, cpus = [], []
        for _ in range(reps):
            transport = SshTransport(options)
            try:
                wall, cpu, problems = _timed(
                    lambda t=transport, n=count: t.try_connect_all([Host(h) for h in hosts[:n]])
                )
                if problems:
                    raise RuntimeError(f"calibration could not connect: {problems}")
            finally:
                transport.close()
            walls.append(wall)
            cpus.append(cpu)
        found[count] = {"wall_s": statistics.median(walls), "cpu_s": statistics.median(cpus)}
    return found
