"""The hosts file: one machine per line, shared by every dtrain command.

Format (a superset of the dmlc tracker's `host[:port]` and DeepSpeed's `host slots=N`)::

    # comment
    node1
    node2:2222 slots=4
    alice@node3
    [fd00::7]:22 slots=2

Pure: the caller reads the file; this module turns its text into `Host` values or a
`HostsFileError` that names the file and line.
"""

from __future__ import annotations

import ipaddress
import re
from collections.abc import Iterable
from dataclasses import dataclass, field

from dtrain.errors import HostsFileError

FORMAT_HINT = "write one host per line as [user@]host[:port] [slots=N]; see hosts.example"
MAX_SLOTS = 4096

_NAME_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")
_USER_RE = re.compile(r"[A-Za-z0-9_][A-Za-z0-9_.-]*\Z")


@dataclass(frozen=True, slots=True)
class Origin:
    path: str
    line: int

    def __str__(self) -> str:
        return f"{self.path}:{self.line}"


@dataclass(frozen=True, slots=True)
class Host:
    """A machine to run tasks on, as the user named it.

    `name` is the ssh target (an address or an ssh config alias), never the address tasks bind:
    that is looked up at launch. `port`/`user` are None when the line leaves them to ssh config.
    `is_local` marks the launching machine, which runs its tasks without ssh.
    """

    name: str
    port: int | None = None
    user: str | None = None
    slots: int | None = None
    origin: Origin | None = field(default=None, compare=False)
    is_local: bool = False

    @property
    def slot_count(self) -> int:
        return self.slots if self.slots is not None else 1

    @property
    def display(self) -> str:
        """How the host appears in task labels: `worker.1@node2`."""
        return self.name

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "port": self.port,
            "user": self.user,
            "slots": self.slot_count,
            "local": self.is_local,
        }


def is_loopback(address: str) -> bool:
    """Whether `address` is a loopback IP (127.0.0.0/8, ::1); False for names."""
    try:
        return ipaddress.ip_address(address).is_loopback
    except ValueError:
        return False


def local_host(name: str) -> Host:
    """The launching machine, named as its hostname."""
    return Host(name=name, is_local=True)


def parse_hosts(text: str, path: str) -> tuple[Host, ...]:
    """Parse a hosts file's text; every error names `path:line`."""
    hosts: list[Host] = []
    first_seen: dict[tuple[str, int | None], int] = {}
    for number, raw in enumerate(text.splitlines(), start=1):
        origin = Origin(path, number)
        content = raw.split("#", 1)[0].strip()
        if not content:
            continue
        host = parse_host_line(content, origin)
        key = (host.name.lower(), host.port)
        if key in first_seen:
            raise HostsFileError(
                f'duplicate host "{_spec_text(host)}" (first listed on line {first_seen[key]})',
                location=str(origin),
                hint="list each host once; use slots=N to run several tasks on it",
            )
        first_seen[key] = number
        hosts.append(host)
    if not hosts:
        raise HostsFileError(
            "no hosts in this file (only blank lines or comments)",
            location=path,
            hint=FORMAT_HINT,
        )
    return tuple(hosts)


def parse_host_line(content: str, origin: Origin) -> Host:
    """One non-blank, comment-free line: `[user@]host[:port] [slots=N]`."""
    spec, *options = content.split()
    user, name, port = _parse_spec(spec, origin)
    slots: int | None = None
    for option in options:
        key, sep, value = option.partition("=")
        if key != "slots" or not sep:
            raise HostsFileError(
                f'unknown option "{option}" (the only option is slots=N)',
                location=str(origin),
                hint=FORMAT_HINT,
            )
        if slots is not None:
            raise HostsFileError(
                "slots given twice", location=str(origin), hint="keep one slots=N per line"
            )
        slots = _parse_int(value, "slots", 1, MAX_SLOTS, origin)
    return Host(name=name, port=port, user=user, slots=slots, origin=origin)


def _parse_spec(spec: str, origin: Origin) -> tuple[str | None, str, int | None]:
    user: str | None = None
    if "@" in spec:
        user, _, spec = spec.rpartition("@")
        if not _USER_RE.match(user):
            raise HostsFileError(
                f'"{user}" is not a valid user name',
                location=str(origin),
                hint=FORMAT_HINT,
            )
    if spec.startswith("["):
        address, sep, rest = spec[1:].partition("]")
        if not sep:
            raise HostsFileError(
                f'"{spec}" has no closing "]"',
                location=str(origin),
                hint="write IPv6 addresses as [addr] or [addr]:port",
            )
        _check_ipv6(address, origin)
        if rest and not rest.startswith(":"):
            raise HostsFileError(
                f'unexpected "{rest}" after "]"',
                location=str(origin),
                hint="write IPv6 addresses as [addr] or [addr]:port",
            )
        port = _parse_int(rest[1:], "port", 1, 65535, origin) if rest else None
        return user, address, port
    if spec.count(":") >= 2:
        _check_ipv6(spec, origin)
        return user, spec, None
    name, sep, port_text = spec.partition(":")
    if not name or not _NAME_RE.match(name):
        raise HostsFileError(
            f'"{name}" is not a valid host name or address',
            location=str(origin),
            hint="use letters, digits, '.', '-' and '_' (an address or an ssh config alias)",
        )
    port = _parse_int(port_text, "port", 1, 65535, origin) if sep else None
    return user, name, port


def _check_ipv6(address: str, origin: Origin) -> None:
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        raise HostsFileError(
            f'"{address}" is not a valid IPv6 address',
            location=str(origin),
            hint="write IPv6 addresses as [addr] or [addr]:port",
        ) from None


def _parse_int(text: str, what: str, low: int, high: int, origin: Origin) -> int:
    if not (text.isascii() and text.isdigit()) or not low <= int(text) <= high:
        raise HostsFileError(
            f'"{text}" is not a valid {what} (expected {low}-{high})',
            location=str(origin),
            hint=FORMAT_HINT,
        )
    return int(text)


def _spec_text(host: Host) -> str:
    name = f"[{host.name}]" if ":" in host.name and host.port is not None else host.name
    text = f"{host.user}@{name}" if host.user else name
    return f"{text}:{host.port}" if host.port is not None else text


def format_hosts(hosts: Iterable[Host]) -> str:
    """Hosts back to hosts-file text: parse(format(h)) == h."""
    lines = []
    for host in hosts:
        line = _spec_text(host)
        if host.slots is not None:
            line += f" slots={host.slots}"
        lines.append(line)
    return "".join(line + "\n" for line in lines)
