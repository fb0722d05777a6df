"""What a host's agent says about its host in the hello: addresses, free ports, user, python.

The planner needs every host's addresses and free ports before any task starts; the launcher
reads its own machine's the same way. Standard library only, Python >= 3.6.
"""

import fcntl
import os
import socket
import stat
import struct
import sys
import time
from typing import Any, Dict, List  # noqa: F401 - used in type comments

from . import procs

SIOCGIFADDR = 0x8915  # the ioctl that reads an interface's IPv4 address (Linux)


def free_ports(count):
    # type: (int) -> List[int]
    """Ports free right now (bound together, so distinct); shared by the launcher."""
    sockets = []
    try:
        for _ in range(count):
            sock = socket.socket(socket.AF_INET, socket.SOCK_STREAM)
            sock.bind(("", 0))
            sockets.append(sock)
        return [sock.getsockname()[1] for sock in sockets]
    finally:
        for sock in sockets:
            sock.close()


def interfaces():
    # type: () -> Dict[str, str]
    """IPv4 address of every interface that has one (Linux ioctl; stdlib has no getifaddrs);
    shared by the launcher."""
    result = {}  # type: Dict[str, str]
    try:
        names = [name for _, name in socket.if_nameindex()]
    except OSError:
        return result
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as sock:
        for name in names:
            try:
                packed = fcntl.ioctl(
                    sock.fileno(), SIOCGIFADDR, struct.pack("256s", name.encode()[:15])
                )
            except OSError:
                continue
            result[name] = socket.inet_ntoa(packed[20:24])
    return result


def reached_at():
    # type: () -> List[str]
    """SSH_CONNECTION's four fields for the stream the launcher reached us by: a socket on
    stdin when Slurm started us (the agent connected back), else what sshd recorded."""
    try:
        is_socket = stat.S_ISSOCK(os.fstat(0).st_mode)
    except OSError:
        is_socket = False
    if is_socket and sys.version_info >= (3, 7):  # socket(fileno=) learns the family from 3.7
        fd = os.dup(0)
        try:
            sock = socket.socket(fileno=fd)
        except OSError:
            os.close(fd)
        else:
            with sock:
                if sock.family in (socket.AF_INET, socket.AF_INET6):
                    return [sock.getpeername()[0], "-", sock.getsockname()[0], "-"]
    return os.environ.get("SSH_CONNECTION", "").split()


def host_facts(ports):
    # type: (int) -> Dict[str, Any]
    """The hello's answer: this host as the planner and doctor need it, with `ports` free
    ports."""
    connection = reached_at()
    return {
        "hostname": socket.gethostname(),
        "pid": os.getpid(),
        "uid": os.getuid(),
        "user": procs.user_name(),
        "python": "%d.%d.%d" % sys.version_info[:3],
        "executable": sys.executable,
        "ssh_server_address": connection[2] if len(connection) == 4 else None,
        "ssh_client_address": connection[0] if len(connection) == 4 else None,
        "interfaces": interfaces(),
        "free_ports": free_ports(ports),
        "cwd": os.getcwd(),
        "time": time.time(),
    }
