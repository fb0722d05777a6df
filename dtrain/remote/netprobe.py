"""TCP probes between hosts: a listener here, connects from here, each bounded in time.

Doctor and launch's preflight ask whether every host reaches the scheduler's port; this is the
part of the agent that answers, kept apart from `probe` so a launch loads only this. It never
changes the host beyond the listeners it opens, which close on request, after `LISTEN_TTL_S`,
or with the agent. Standard library only, Python >= 3.6.
"""

import errno
import random
import socket
import time
from typing import Any, Dict, List  # noqa: F401 - used in type comments

from . import spawn

PORT_RANGE = (10000, 49999)  # where ps-lite's servers and workers bind
MAX_BIND_TRIES = 20
MAX_TARGETS = 1024
MAX_PARALLEL_CONNECTS = 64
LISTEN_TTL_S = 120.0

_listeners = {}  # type: Dict[int, Any]  # port -> (socket, closes at)


def _expire(now):
    for port, (sock, closes_at) in list(_listeners.items()):
        if now >= closes_at:
            sock.close()
            del _listeners[port]


def _random_port():
    """A port in ps-lite's range."""
    return random.randint(*PORT_RANGE)


def listen(address, port=0):
    """Listen on address:port (port 0: a random free one in ps-lite's range) until closed.

    Binding `address` itself, as ps-lite binds DMLC_NODE_HOST, also proves the address is this
    host's. The kernel completes the connects of probes without an accept.
    """
    _expire(time.monotonic())
    tries = [port] if port else [_random_port() for _ in range(MAX_BIND_TRIES)]
    last = None
    for candidate in tries:
        sock = socket.socket(socket.AF_INET6 if ":" in address else socket.AF_INET)
        try:
            sock.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
            sock.bind((address, candidate))
            sock.listen(min(socket.SOMAXCONN, MAX_TARGETS))
        except OSError as exc:
            sock.close()
            last = exc
            if exc.errno != errno.EADDRINUSE:
                break
            continue
        _listeners[candidate] = (sock, time.monotonic() + LISTEN_TTL_S)
        return {"address": address, "port": candidate}
    return {
        "address": address,
        "port": port or None,
        "error": describe_errno(last),
        "errno": errno_name(last),
    }


def unlisten(ports=None):
    """Close the listeners on `ports` (all when None)."""
    for port in list(_listeners) if ports is None else ports:
        entry = _listeners.pop(int(port), None)
        if entry is not None:
            entry[0].close()
    return sorted(_listeners)


def describe_errno(exc):
    if exc is None:
        return "unknown error"
    if isinstance(exc, socket.timeout):
        return "timed out"
    names = {
        errno.ECONNREFUSED: "refused",
        errno.EHOSTUNREACH: "no route to host",
        errno.ENETUNREACH: "network unreachable",
        errno.EADDRNOTAVAIL: "cannot assign requested address",
        errno.EADDRINUSE: "address already in use",
        errno.ETIMEDOUT: "timed out",
        errno.EACCES: "permission denied",
    }
    return names.get(exc.errno, exc.strerror or str(exc))


def errno_name(exc):
    """The symbolic errno of a failed socket call ("ECONNREFUSED"), or "" when it has none."""
    if isinstance(exc, socket.timeout):
        return "ETIMEDOUT"
    code = getattr(exc, "errno", None)
    return errno.errorcode.get(code, "") if code else ""


def connect_one(target, timeout_s):
    started = time.monotonic()
    result = dict(target)
    sock = socket.socket(socket.AF_INET6 if ":" in target["address"] else socket.AF_INET)
    sock.settimeout(timeout_s)
    try:
        sock.connect((target["address"], int(target["port"])))
        result["ok"] = True
    except OSError as exc:  # socket.timeout is one (3.6-3.9) or an alias of one
        result["ok"] = False
        result["error"] = describe_errno(exc)
        result["errno"] = errno_name(exc)
    finally:
        sock.close()
    result["elapsed_s"] = round(time.monotonic() - started, 4)
    return result


def connect_all(targets, timeout_s):
    """Open (and close) a TCP connection to every target at once; each bounded by `timeout_s`."""
    targets = list(targets)[:MAX_TARGETS]
    results = [None] * len(targets)  # type: List[Any]

    def one(index):
        results[index] = connect_one(targets[index], timeout_s)

    rounds = len(targets) // MAX_PARALLEL_CONNECTS + 1
    spawn.for_each(range(len(targets)), one, MAX_PARALLEL_CONNECTS, rounds * (timeout_s + 1.0))
    for index, target in enumerate(targets):
        if results[index] is None:
            results[index] = dict(target, ok=False, error="timed out", errno="ETIMEDOUT")
    return results
