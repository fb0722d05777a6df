"""The least a launcher written in Python does: the yardstick for what dtrain's own layers cost.

    python bench/pyfloor.py CONFIG HOST[,HOST...] COMMAND

One paramiko connection per host, tuned as dtrain tunes its own (`_Transport`: AES-GCM, one
read for many packets, the post-auth ACK sent at once; the host name looked up as bytes), one
exec channel on each running COMMAND (the benchmark gives it what pdsh runs on a host: the
tasks, started by the login shell), every exit status waited for, and out without the
interpreter's teardown, as dtrain leaves. Nothing else: no `ssh -G`, no agent, no plan or
environment, no logs, no teardown of the others when a task fails, no signal handling. The
benchmark runs it beside dtrain and pdsh on the trivial job only, so the page can split
dtrain's distance from pdsh into what any Python launcher pays and what dtrain adds. Host keys
are checked against the config's known_hosts; a host that does not match, or cannot be reached,
fails the run (exit 255), never prompts.
"""

from __future__ import annotations

import os
import socket
import sys
import threading

from dtrain.transport.machine import lookup_name
from dtrain.transport.ssh import _Transport
from dtrain.transport.sshlib import paramiko

TIMEOUT_S = 10.0


def run_host(settings: paramiko.SSHConfigDict, command: str, codes: list[int]) -> None:
    """Connect, check the host key, authenticate, run `command`, wait for it."""
    hostname, port = settings["hostname"], int(settings.get("port", 22))
    known = paramiko.HostKeys(os.path.expanduser(settings["userknownhostsfile"].split()[0]))
    address = (lookup_name(hostname), port)  # as dtrain: no idna codec
    sock = socket.create_connection(address, timeout=TIMEOUT_S)  # type: ignore[arg-type]
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    transport = _Transport(sock)
    try:
        transport.start_client(timeout=TIMEOUT_S)
        name = hostname if port == 22 else f"[{hostname}]:{port}"
        if not known.check(name, transport.get_remote_server_key()):
            raise paramiko.SSHException(f"{name}: host key not in known_hosts")
        key = paramiko.PKey.from_path(os.path.expanduser(settings["identityfile"][0]))
        transport.auth_publickey(settings.get("user") or "root", key)
        channel = transport.open_session(timeout=TIMEOUT_S)
        channel.exec_command(command)
        codes.append(channel.recv_exit_status())
    finally:
        transport.close()


def main(argv: list[str]) -> int:
    config_path, hosts, command = argv
    config = paramiko.SSHConfig.from_path(config_path)
    codes: list[int] = []
    failed: list[str] = []

    def one(host: str) -> None:
        try:
            run_host(config.lookup(host), command, codes)
        except Exception as exc:
            failed.append(f"pyfloor: {host}: {type(exc).__name__}: {exc}")

    threads = [threading.Thread(target=one, args=(h,)) for h in hosts.split(",")]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join()
    for line in failed:
        print(line, file=sys.stderr)
    return 255 if failed else max(codes, default=0)


if __name__ == "__main__":
    code = main(sys.argv[1:])
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(code)
