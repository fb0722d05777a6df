"""The least a launcher written in Python does: the yardstick for what dtrain's own layers cost.

    python bench/pyfloor.py CONFIG HOST[,HOST...] COMMAND

One paramiko connection per host, tuned as dtrain tunes its own (`TunedTransport`, from
dtrain's paramiko module alone, without the rest of dtrain: AES-GCM, one read for many packets,
the post-auth ACK sent at once; the host name looked up as bytes; each
host's TCP connection opened before paramiko is imported, its HostName and Port read from the
config's first matching `Host` block, which is all the benchmark's configs need), one
exec channel on each running COMMAND (the benchmark gives it what pdsh runs on a host: the
tasks, started by the login shell), every exit status waited for, and out without the
interpreter's teardown, as dtrain leaves. Nothing else: no `ssh -G`, no agent, no plan or
environment, no logs, no teardown of the others when a task fails, no signal handling. The
benchmark runs it beside dtrain and pdsh on the trivial job only, so the page can split
dtrain's distance from pdsh into what any Python launcher pays and what dtrain adds. Host keys
are checked against the config's known_hosts; a host that does not match, or cannot be reached,
fails the run (exit 255), never prompts.

With PYFLOOR_STAMPS set to a file name, it writes there, at its end, when each step started
and ended, as bench/timeline.py does for dtrain, so the two can be laid side by side.
"""

from __future__ import annotations

import time

T0 = time.time()

import fnmatch  # noqa: E402 - T0 must be taken first
import os  # noqa: E402
import socket  # noqa: E402
import sys  # noqa: E402
import threading  # noqa: E402
from concurrent.futures import Future  # noqa: E402
from typing import TYPE_CHECKING  # noqa: E402

from dtrain.transport.machine import lookup_name  # noqa: E402 - socket only: no paramiko

if TYPE_CHECKING:
    import paramiko

TIMEOUT_S = 10.0
STAMPS: list[dict[str, object]] = []  # each step: its name, start and end (s since T0)


def stamp(phase: str, start: float) -> None:
    STAMPS.append({"phase": phase, "start_s": start - T0, "end_s": time.time() - T0})


def address(config_path: str, host: str) -> tuple[str, int]:
    """HostName and Port from the first `Host` block whose patterns match `host`, each
    keyword's first value winning as in OpenSSH; the host itself and 22 otherwise."""
    found: dict[str, str] = {}
    matching = True
    with open(config_path) as config:
        for line in config:
            keyword, _, value = line.strip().partition(" ")
            keyword, value = keyword.lower(), value.strip()
            if keyword == "host":
                matching = any(fnmatch.fnmatch(host, p) for p in value.split())
            elif matching and keyword in ("hostname", "port"):
                found.setdefault(keyword, value)
    return found.get("hostname", host), int(found.get("port", "22"))


def dial_ahead(hostname: str, port: int) -> Future[socket.socket]:
    """The connection, opened in a thread of its own while paramiko imports."""
    dialled: Future[socket.socket] = Future()

    def run() -> None:
        try:
            start = time.time()
            address = (lookup_name(hostname), port)  # as dtrain: no idna codec
            sock = socket.create_connection(address, timeout=TIMEOUT_S)  # type: ignore[arg-type]
            sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
            stamp("TCP connect, dialled ahead (each host)", start)
            dialled.set_result(sock)
        except Exception as exc:
            dialled.set_exception(exc)

    threading.Thread(target=run, daemon=True).start()
    return dialled


def run_host(
    settings: paramiko.SSHConfigDict, sock: socket.socket, command: str, codes: list[int]
) -> None:
    """Check the host key, authenticate, run `command`, wait for it."""
    import paramiko

    from dtrain.transport.sshlib import TunedTransport

    start = time.time()
    hostname, port = settings["hostname"], int(settings.get("port", 22))
    known = paramiko.HostKeys(os.path.expanduser(settings["userknownhostsfile"].split()[0]))
    transport = TunedTransport(sock)
    try:
        transport.start_client(timeout=TIMEOUT_S)
        name = hostname if port == 22 else f"[{hostname}]:{port}"
        if not known.check(name, transport.get_remote_server_key()):
            raise paramiko.SSHException(f"{name}: host key not in known_hosts")
        key = paramiko.PKey.from_path(os.path.expanduser(settings["identityfile"][0]))
        transport.auth_publickey(settings.get("user") or "root", key)
        channel = transport.open_session(timeout=TIMEOUT_S)
        channel.exec_command(command)
        stamp("ssh handshake, auth and exec (each host)", start)
        codes.append(channel.recv_exit_status())
    finally:
        transport.close()


def main(argv: list[str]) -> int:
    config_path, hosts, command = argv
    names = hosts.split(",")
    dialled = {host: dial_ahead(*address(config_path, host)) for host in names}
    start = time.time()
    import paramiko  # while the connections open

    stamp("import paramiko (dtrain.transport.sshlib)", start)

    config = paramiko.SSHConfig.from_path(config_path)
    codes: list[int] = []
    failed: list[str] = []

    def one(host: str) -> None:
        try:
            run_host(config.lookup(host), dialled[host].result(), command, codes)
        except Exception as exc:
            failed.append(f"pyfloor: {host}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(h,)) for h in names]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for line in failed:
        print(line, file=sys.stderr)
    if out := os.environ.get("PYFLOOR_STAMPS"):
        import json  # only here: the floor's ordinary runs do not load it

        with open(out, "w") as stamps:
            json.dump({"t0": T0, "events": STAMPS}, stamps)
    return 255 if failed else max(codes, default=0)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
