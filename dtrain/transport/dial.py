"""TCP connections to the ssh servers, opened before paramiko has loaded.

A launch knows where each host is (`ssh -G`'s answer, most often one kept from an earlier run)
60-70 ms of imports before paramiko, which the handshake needs, is ready. Connecting then lets
each host's sshd start the process that serves the connection and send its banner (~10 ms
here) while this side still imports; the handshake takes the open socket (`Dialling.take`),
or dials as it would have. Nothing is dialled where the transport could still stop before
connecting (a bad answer, a refused setting, a proxy chain to check, a host listed twice):
bad input still fails before any connection. At most as many as the handshakes open at
once; what nobody takes is closed with the transport. No paramiko here.
"""

from __future__ import annotations

import socket
import threading
from collections.abc import Collection, Sequence
from concurrent.futures import Future

from dtrain.transport import sshconfig
from dtrain.transport.machine import lookup_name

MAX_PARALLEL_CONNECTS = 32  # handshakes at once, and connections dialled ahead

Answer = Future[dict[str, tuple[str, ...]]]  # a host's `ssh -G` settings, to come
DECISION_WAIT_S = 5.0  # how long the transport waits for the answers' verdict (~0: it has them)


def dial(hostname: str, port: int, timeout_s: float) -> socket.socket:
    """A TCP connection to an ssh server, ready for its handshake."""
    sock = socket.create_connection(
        (lookup_name(hostname), port),  # type: ignore[arg-type]  # bytes: no idna codec
        timeout=timeout_s,
    )
    # paramiko sets no socket options: Nagle + delayed ACK cost ~40 ms per round trip.
    sock.setsockopt(socket.IPPROTO_TCP, socket.TCP_NODELAY, 1)
    return sock


def addresses_ahead(
    answers: Sequence[tuple[str, sshconfig.Settings | None]],
) -> list[tuple[str, int]]:
    """Each host's (HostName, Port) to dial ahead, given every host's name and `ssh -G`
    settings (None: `ssh -G` failed); none at all where the transport might stop before any
    connection: a failed answer, a setting dtrain refuses, a proxy (whose chain is checked
    first), a Port that is not a number, two hosts that reach one (hostname, port, user)."""
    endpoints = []
    for name, settings in answers:
        if settings is None or sshconfig.through_proxy(settings):
            return []
        if sshconfig.refused_settings(settings):
            return []
        try:
            hostname, port, user = sshconfig.endpoint(settings, name)
        except ValueError:
            return []
        endpoints.append((hostname, port, user))
    if len({(hostname.lower(), port, user) for hostname, port, user in endpoints}) < len(endpoints):
        return []
    return [(hostname, port) for hostname, port, _ in endpoints]


def _close_unused(dialled: Future[socket.socket]) -> None:
    if dialled.exception() is None:
        dialled.result().close()


class Dialling:
    """A connection to each of the hosts to connect, opened once every host's `ssh -G` has
    answered and nothing stands in the way (`addresses_ahead`).

    `take` hands the transport the connection to an address, to wait for: its socket, or
    the very error its own dial would have raised (refused, unreachable, timed out), so a
    host's failure reads the same either way. The dials run in daemon threads: one still
    waiting for its host when dtrain ends (an early error) cannot hold the exit up.
    """

    def __init__(
        self,
        answers: Sequence[tuple[sshconfig.HostKey, Answer]],
        to_dial: Collection[sshconfig.HostKey],
        given_timeout_s: float | None,
    ) -> None:
        self._lock = threading.Lock()
        self._closed = False
        self._decided = threading.Event()
        self._given_timeout_s = given_timeout_s
        self._untaken: dict[tuple[str, int], list[Future[socket.socket]]] = {}
        self.taken = 0  # connections the transport took (for --debug and the tests)
        threading.Thread(
            target=self._decide, args=(answers, to_dial), name="dtrain-dial", daemon=True
        ).start()

    def _decide(
        self,
        answers: Sequence[tuple[sshconfig.HostKey, Answer]],
        to_dial: Collection[sshconfig.HostKey],
    ) -> None:
        try:
            settings = [(key[0], None if a.exception() else a.result()) for key, a in answers]
            found = addresses_ahead(settings)
            pairs = zip(answers, found, strict=True) if found else ()
            chosen = [(address, a.result()) for (key, a), address in pairs if key in to_dial]
            with self._lock:
                if self._closed:
                    return
                for address, host_settings in chosen[:MAX_PARALLEL_CONNECTS]:
                    dialled: Future[socket.socket] = Future()
                    self._untaken.setdefault(address, []).append(dialled)
                    timeout_s = sshconfig.connect_timeout_s(host_settings, self._given_timeout_s)
                    threading.Thread(
                        target=self._dial,
                        args=(address, timeout_s, dialled),
                        name="dtrain-dial",
                        daemon=True,
                    ).start()
        finally:
            self._decided.set()

    @staticmethod
    def _dial(address: tuple[str, int], timeout_s: float, dialled: Future[socket.socket]) -> None:
        try:
            dialled.set_result(dial(*address, timeout_s))
        except BaseException as exc:  # the transport raises it as its own dial's
            dialled.set_exception(exc)

    def take(self, hostname: str, port: int) -> Future[socket.socket] | None:
        """The connection dialled ahead to (hostname, port), once; None if there is none."""
        self._decided.wait(DECISION_WAIT_S)
        with self._lock:
            waiting = self._untaken.get((hostname, port))
            if not waiting:
                return None
            self.taken += 1
            return waiting.pop(0)

    def close(self) -> None:
        """Close every connection not taken, now or as soon as its dial ends; dial no more."""
        with self._lock:
            self._closed = True
            untaken, self._untaken = self._untaken, {}
        for waiting in untaken.values():
            for dialled in waiting:
                dialled.add_done_callback(_close_unused)
