"""Facts about this machine: names looked up without the idna codec; interfaces, cores and
free ports."""

from __future__ import annotations

import os
import socket
import subprocess
import sys

from dtrain.transport.machine import (
    local_free_ports,
    local_interfaces,
    lookup_name,
    usable_cores,
)


def test_an_ascii_name_is_looked_up_as_bytes_and_any_other_as_it_is() -> None:
    assert lookup_name("h1.example") == b"h1.example"
    assert lookup_name("198.18.0.11") == b"198.18.0.11"
    assert lookup_name("bücher.example") == "bücher.example"  # getaddrinfo's idna then


def test_resolving_and_connecting_by_name_loads_no_idna_codec() -> None:
    """getaddrinfo given a str encodes it by the idna codec, whose import (~2 ms) came on a
    launch's way to its first connection."""
    code = (
        "import socket, sys\n"
        "from dtrain.transport.machine import lookup_name, resolve_address\n"
        "server = socket.socket()\n"
        "server.bind(('127.0.0.1', 0))\n"
        "server.listen(1)\n"
        "port = server.getsockname()[1]\n"
        "socket.create_connection((lookup_name('localhost'), port), timeout=10).close()\n"
        "print(resolve_address('localhost'), 'encodings.idna' in sys.modules)\n"
    )
    result = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    assert result.stdout.split()[1] == "False", result.stdout


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
