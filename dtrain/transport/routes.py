"""This machine's address towards hosts that an ssh config names: where agents that connect
back are to dial (the hosts may be ssh aliases that resolve nowhere else)."""

from __future__ import annotations

import socket
from collections.abc import Sequence

from dtrain.errors import ConnectError
from dtrain.transport import sshconfig
from dtrain.transport.machine import route_address


def address_towards(nodes: Sequence[str], ssh_config: str | None) -> str:
    """This machine's address on the route to the hosts, by the address ssh reaches them at
    (`ssh -G`: the names may be ssh aliases that resolve nowhere else): the first host's,
    else the first of the next 7 that has one (one `ssh -G` in the usual case)."""
    unresolved: list[str] = []
    for chosen in (list(nodes[:1]), list(nodes[1:8])):
        answers = sshconfig.resolve_all(
            sshconfig.openssh_client(), [(n, None, None) for n in chosen], ssh_config
        )
        for node, settings in zip(chosen, answers, strict=True):
            target = sshconfig.one(settings, "hostname", node)
            try:
                target = str(socket.getaddrinfo(target, None, socket.AF_INET)[0][4][0])
            except OSError as exc:
                unresolved.append(f"{node} ({target}: {exc.strerror or exc})")
                continue
            if (address := route_address(target)) is not None:
                return address
    raise ConnectError(
        f"no route from this machine to the hosts: {'; '.join(unresolved[:3]) or nodes[0]}",
        hint="check the host names and the ssh config's HostName for them",
    )
