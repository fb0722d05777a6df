"""Facts about this machine (addresses, routes, hostname, free ports, cores) and its open-file
limit."""

from __future__ import annotations

import contextlib
import socket
import sys
from collections.abc import Mapping, Sequence


def route_address(destination: str) -> str | None:
    """The local address the kernel would use to reach `destination` (no packet is sent)."""
    family = socket.AF_INET6 if ":" in destination else socket.AF_INET
    try:
        with socket.socket(family, socket.SOCK_DGRAM) as sock:
            sock.connect((destination, 9))
            address: str = sock.getsockname()[0]
            return address
    except OSError:
        return None


def local_address(toward: Sequence[str], here: Mapping[str, str] | None = None) -> str:
    """The address other hosts reach this machine at (what tasks here advertise).

    The one on the route to the first of `toward` (the other hosts' addresses); with none,
    127.0.0.1 (everything is local), or, given `here` (this machine's interfaces) because the
    other hosts' addresses are not known, its first address outside 127/8.
    """
    if toward:
        return route_address(toward[0]) or "127.0.0.1"
    if here is not None:
        return next((a for a in here.values() if not a.startswith("127.")), "127.0.0.1")
    return "127.0.0.1"


def resolve_address(name: str) -> str | None:
    """The first address a name resolves to, or None."""
    try:
        infos = socket.getaddrinfo(name, None, type=socket.SOCK_STREAM)
    except OSError:
        return None
    return str(infos[0][4][0]) if infos else None


def local_hostname() -> str:
    return socket.gethostname().split(".")[0] or "localhost"


def local_interfaces() -> dict[str, str]:
    """Each interface's (first) IPv4 address here."""
    import psutil

    return {
        name: next(a.address for a in addresses if a.family == socket.AF_INET)
        for name, addresses in psutil.net_if_addrs().items()
        if any(a.family == socket.AF_INET for a in addresses)
    }


def usable_cores() -> int:
    """The CPU cores this process may run on: its affinity (taskset, a cgroup's cpuset)
    where the system has one, else every core (macOS)."""
    import psutil

    me = psutil.Process()
    if hasattr(me, "cpu_affinity"):
        return len(me.cpu_affinity() or ()) or 1
    return psutil.cpu_count() or 1


def raise_open_file_limit() -> None:
    """Up to the hard limit: a socket per host and a log per task pass the usual soft limit of
    1024 at 256 hosts x 4 tasks."""
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    want = hard if hard != resource.RLIM_INFINITY else 1 << 16
    if soft != resource.RLIM_INFINITY and soft < want:
        with contextlib.suppress(ValueError, OSError):
            resource.setrlimit(resource.RLIMIT_NOFILE, (want, hard))


def local_free_ports(count: int) -> list[int]:
    """`count` ports free here right now (bound together, so distinct)."""
    with contextlib.ExitStack() as bound:
        sockets = [bound.enter_context(socket.socket()) for _ in range(count)]
        for sock in sockets:
            sock.bind(("", 0))
        return [sock.getsockname()[1] for sock in sockets]


TASKS_ELSEWHERE_HINT = (
    "run the tasks on Linux hosts: -H HOSTS, with --scheduler-host HOST for dmlc's scheduler "
    "(it runs on this machine otherwise); or run dtrain on Linux"
)


def tasks_here_refused() -> str | None:
    """Why this machine cannot run tasks, or None: dtrain's agent, which runs them (and what
    ps, kill, stacks and doctor ask of this machine), reads /proc and is its tasks' subreaper:
    Linux only. Launching from elsewhere is for tasks on Linux hosts."""
    if sys.platform.startswith("linux"):
        return None
    return f"dtrain's agent needs Linux (this machine runs {sys.platform})"
