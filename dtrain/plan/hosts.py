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
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field, replace

from dtrain.errors import HostsFileError, UsageError


def bracketed(address: str) -> str:
    """An IPv6 address in brackets (`[::1]`), so that a port after it reads as a port."""
    return f"[{address}]" if ":" in address else address


def address_port(address: str, port: int | str) -> str:
    """`node1:22`, `[::1]:2421`: as ssh and URLs write an address with its port."""
    return f"{bracketed(address)}:{port}"


FORMAT_HINT = "write one host per line as [user@]host[:port] [slots=N]; see hosts.example"
DUPLICATE_HINT = "list each host once; use slots=N to run several tasks on it"
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
    show_port: bool = field(default=False, compare=False)

    @property
    def slot_count(self) -> int:
        return self.slots if self.slots is not None else 1

    @property
    def key(self) -> str:
        """The host's identity, which every map of hosts is keyed by: its name (any case) and
        its port, so two sshds on one machine (`node1:2201`, `node1:2202`) are two hosts."""
        name = self.name.lower()
        if self.port is None:
            return name
        return address_port(name, self.port)

    @property
    def display(self) -> str:
        """How the host appears to people (`worker.1@node2`): its name, with the port only
        where another host of the job has the same name (`worker.1@node1:2202`)."""
        if not self.show_port or self.port is None:
            return self.name
        return address_port(self.name, self.port)

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
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    if isinstance(ip, ipaddress.IPv6Address) and ip.ipv4_mapped is not None:
        return ip.ipv4_mapped.is_loopback  # ::ffff:127.0.0.1
    return ip.is_loopback


def local_host(name: str) -> Host:
    """The launching machine, named as its hostname."""
    return Host(name=name, is_local=True)


def named(hosts: Iterable[Host], wanted: str) -> Host | None:
    """The host a flag names (`--scheduler-host`): as shown (`node1:2202`) or by name."""
    return next((host for host in hosts if wanted in (host.display, host.name)), None)


def require_named(hosts: Sequence[Host], wanted: str, flag: str) -> Host:
    """The host `flag` names, or a UsageError that lists the ones it could name."""
    host = named(hosts, wanted)
    if host is None:
        listed = ", ".join(h.display for h in hosts) if hosts else "none (no -H given)"
        raise UsageError(
            f'{flag} "{wanted}" is not in the hosts file', hint=f"name one of the hosts: {listed}"
        )
    return host


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
                hint=DUPLICATE_HINT,
            )
        first_seen[key] = number
        hosts.append(host)
    if not hosts:
        raise HostsFileError(
            "no hosts in this file (only blank lines or comments)",
            location=path,
            hint=FORMAT_HINT,
        )
    return with_ports_shown(hosts)


def with_ports_shown(hosts: Iterable[Host]) -> tuple[Host, ...]:
    """The hosts, each showing its port where another host has the same name."""
    hosts = tuple(hosts)
    counts: dict[str, int] = {}
    for host in hosts:
        counts[host.name.lower()] = counts.get(host.name.lower(), 0) + 1
    return tuple(replace(h, show_port=counts[h.name.lower()] > 1) for h in hosts)


def check_same_targets(hosts: Sequence[Host], targets: Sequence[tuple[str, int, str]]) -> None:
    """Two lines that ssh resolves to one (hostname, port, user) are one host listed twice:
    `node1` and `node1:22`, or an alias and its address. Raised before any connection."""
    first: dict[tuple[str, int, str], Host] = {}
    for host, (hostname, port, user) in zip(hosts, targets, strict=True):
        target = (hostname.lower(), port, user)
        seen = first.setdefault(target, host)
        if seen is host:
            continue
        where = f" on line {seen.origin.line}" if seen.origin is not None else ""
        raise HostsFileError(
            f'duplicate host: "{_spec_text(host)}" and "{_spec_text(seen)}"{where} both reach '
            f"{user}@{address_port(hostname, port)}",
            location=str(host.origin) if host.origin is not None else None,
            hint=DUPLICATE_HINT,
        )


def parse_host_line(content: str, origin: Origin) -> Host:
    """One non-blank, comment-free line: `[user@]host[:port] [slots=N]`."""
    spec, *options = content.split()
    for char, what, fix in _INVISIBLE:
        if char in content:
            raise HostsFileError(
                f"{_shown(spec)} is not a valid host name or address: the hosts file has a {what}",
                location=str(origin),
                hint=fix,
            )
    user, name, port = _parse_spec(spec, origin)
    slots: int | None = None
    for option in options:
        key, sep, value = option.partition("=")
        if key != "slots" or not sep:
            raise HostsFileError(
                f"unknown option {_shown(option)} (the only option is slots=N)",
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
                f"{_shown(user)} is not a valid user name",
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
        address, _, last = spec.rpartition(":")
        if last.isascii() and last.isdigit() and _is_ipv6(address):
            raise HostsFileError(
                f'"{spec}" is ambiguous: the address {spec}, or {address} port {last}?',
                location=str(origin),
                hint=f"write [{address}]:{last} for a port, or [{spec}] for the address",
            )
        return user, spec, None
    name, sep, port_text = spec.partition(":")
    if not name or not _NAME_RE.match(name):
        raise HostsFileError(
            f"{_shown(name)} is not a valid host name or address",
            location=str(origin),
            hint="use letters, digits, '.', '-' and '_' (an address or an ssh config alias)",
        )
    port = _parse_int(port_text, "port", 1, 65535, origin) if sep else None
    return user, name, port


def _is_ipv6(address: str) -> bool:
    try:
        ipaddress.IPv6Address(address)
    except ValueError:
        return False
    return True


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
            f"{_shown(text)} is not a valid {what} (expected {low}-{high})",
            location=str(origin),
            hint=FORMAT_HINT,
        )
    return int(text)


_INVISIBLE = (
    ("\ufeff", "byte-order mark", "save the hosts file as UTF-8 without a byte-order mark"),
    ("\x00", "NUL byte", "the hosts file must be plain text: remove the NUL bytes"),
)


def _shown(text: str) -> str:
    """`text` in quotes, with what a terminal would not show escaped: "\ufefflocalhost"."""
    escaped = "".join(
        c if c.isprintable() else c.encode("unicode_escape").decode("ascii") for c in text
    )
    return f'"{escaped}"'


def _spec_text(host: Host) -> str:
    name = bracketed(host.name)
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
