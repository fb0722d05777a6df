"""Facts about this machine: interfaces, cores and free ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from dtrain.transport.machine import (
    local_free_ports,
    local_interfaces,
    usable_cores,
)


def test_this_machines_interfaces_are_the_ones_every_hosts_agent_reads() -> None:
    """psutil here; the agent's own ioctl reader (on every host) as the oracle."""
    from dtrain.remote.facts import interfaces

    assert local_interfaces() == interfaces()
    assert local_interfaces()["lo"] == "127.0.0.1"


def test_usable_cores_are_this_process_affinity() -> None:
    code = (
        "import os\n"
        "from dtrain.transport.machine import usable_cores\n"
        "print(usable_cores(), len(os.sched_getaffinity(0)))\n"
    )
    result = subprocess.run(
        ["taskset", "-c", "0", sys.executable, "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    assert result.stdout.split() == ["1", "1"]
    assert usable_cores() == len(os.sched_getaffinity(0))


def test_free_ports_are_distinct_and_free() -> None:
    ports = local_free_ports(8)
    assert len(set(ports)) == 8
    for port in ports:
        with socket.socket() as sock:
            sock.bind(("", port))
