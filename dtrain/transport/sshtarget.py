"""What to connect to: one host's ssh settings, as OpenSSH resolves them (`ssh -G`), checked.

`ssh -G` answers for every host (with `-F FILE` for `--ssh-config FILE`); this module turns
that answer into an `SshTarget`, splits ProxyJump hops, and refuses what dtrain cannot honour
or must not read (a setting it would not follow, an unreadable key or known_hosts file), before
any connection. No sockets, no paramiko.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path

from dtrain.errors import UsageError
from dtrain.inputfiles import MAX_INPUT_BYTES, InputFile, check_input
from dtrain.plan.hosts import Host, address_port
from dtrain.transport import sshconfig
from dtrain.transport.options import DEFAULT_CONNECT_TIMEOUT_S, SshOptions

MAX_KNOWN_HOSTS_BYTES = 256 * 1024 * 1024  # a site-wide known_hosts may list many hosts
DEFAULT_KEY_NAMES = ("id_rsa", "id_dsa", "id_ecdsa", "id_ed25519")  # paramiko's look_for_keys


@dataclass(frozen=True)
class SshTarget:
    """One host's ssh settings, resolved the way OpenSSH would resolve them."""

    hostname: str
    port: int
    user: str
    identity_files: tuple[str, ...] = ()
    identities_only: bool = False
    known_hosts_files: tuple[str, ...] = ()
    strict_host_keys: str = "yes"
    connect_timeout_s: float = DEFAULT_CONNECT_TIMEOUT_S
    proxy_jump: str | None = None
    proxy_command: str | None = None  # tokens already expanded
    certificate_files: tuple[str, ...] = ()
    host_key_alias: str | None = None
    use_agent: bool = True
    agent_socket: str | None = None  # IdentityAgent's socket; None: the one SSH_AUTH_SOCK names
    server_alive_s: float = 0.0
    server_alive_count: int = 3

    @property
    def display(self) -> str:
        return address_port(self.hostname, self.port)

    @property
    def silence_limit_s(self) -> float | None:
        """How long this host may stay silent before it is lost, as the user's config tells
        OpenSSH (ServerAliveInterval * ServerAliveCountMax); None when the config is silent."""
        if self.server_alive_s <= 0:
            return None
        return self.server_alive_s * max(self.server_alive_count, 1)


def _config_paths(options: SshOptions) -> list[str]:
    """`--ssh-config FILE` alone (like `ssh -F`), else the user's then the system's config."""
    if options.config_file is not None:
        return [str(options.config_file)]
    return [os.path.join(options.user_config_dir, "config"), "/etc/ssh/ssh_config"]


def split_jump_hop(hop: str) -> tuple[str, str, str]:
    """(user, host, port) of one ProxyJump hop, `[user@]host[:port]` or `[user@][v6addr][:port]`."""
    user, _, rest = hop.rpartition("@")
    if rest.startswith("[") and "]" in rest:
        name, _, tail = rest[1:].partition("]")
        return user, name, tail.removeprefix(":")
    name, _, port = rest.partition(":")
    return user, name, port


def jump_hops(jump: str, name: str, options: SshOptions) -> list[tuple[str, str, str]]:
    """The hops of the ProxyJump `jump` set for host `name`, or an error naming the bad one."""
    hops = []
    for hop in jump.split(","):
        user, hop_name, port_text = split_jump_hop(hop)
        address = hop.rpartition("@")[2]
        problem = None
        if address.startswith("[") and "]" not in address:
            problem = f'"{hop}" lacks the "]" that closes its address'
        elif not hop_name:
            problem = f'"{hop}" names no host'
        elif port_text and not (port_text.isdigit() and 0 < int(port_text) < 65536):
            problem = f'"{port_text}" is not a port'
        if problem is not None:
            raise UsageError(
                f'ssh config {config_name(options)} sets ProxyJump "{jump}" for host '
                f"{name}: {problem}",
                hint="write each hop as [user@]host[:port] ([addr]:port for an IPv6 address), "
                "separated by commas",
            )
        hops.append((user, hop_name, port_text))
    return hops


def config_name(options: SshOptions) -> str:
    return " or ".join(_config_paths(options))


def strictness(value: str) -> str:
    """StrictHostKeyChecking as one word: yes, no, accept-new or ask (`ssh -G` prints yes and
    no as true and false; OpenSSH also takes off)."""
    value = value.lower()
    return {"true": "yes", "false": "no", "off": "no"}.get(value, value)


def agent_socket(identity_agent: str) -> str | None:
    """The socket an IdentityAgent value names (`~` and `$VAR` expanded, as OpenSSH does), or
    None for `none`, `SSH_AUTH_SOCK` and the very socket SSH_AUTH_SOCK names."""
    if identity_agent in ("none", "SSH_AUTH_SOCK"):
        return None
    path = os.path.expanduser(os.path.expandvars(identity_agent))
    return None if path == os.environ.get("SSH_AUTH_SOCK") else path


def openssh_target(
    host: Host, settings: sshconfig.Settings, options: SshOptions, local: sshconfig.Local
) -> SshTarget:
    """A target from `ssh -G`'s settings for `host` (asked with the hosts file's user and
    port, so they already win); tokens in files and ProxyCommand expanded as OpenSSH does."""

    def get(key: str, default: str) -> str:
        return sshconfig.one(settings, key, default)

    def paths(key: str) -> tuple[str, ...]:
        return tuple(
            sshconfig.expand_tokens(value, settings, host.name, local)
            for line in settings.get(key, ())
            for value in line.split()
        )

    known = (*paths("userknownhostsfile"), *paths("globalknownhostsfile"))
    proxy = get("proxycommand", "none")
    jump = get("proxyjump", "none")
    alive = get("serveraliveinterval", "0")
    alive_count = get("serveralivecountmax", "3")
    hostname, port, user = sshconfig.endpoint(settings, host.name)
    return SshTarget(
        hostname=hostname,
        port=port,
        user=user,
        identity_files=paths("identityfile"),
        identities_only=get("identitiesonly", "no") in ("yes", "true"),
        known_hosts_files=known or (os.path.join(options.user_config_dir, "known_hosts"),),
        strict_host_keys=strictness(get("stricthostkeychecking", "ask")),
        connect_timeout_s=sshconfig.connect_timeout_s(settings, options.connect_timeout_s),
        proxy_jump=None if jump == "none" else jump,
        proxy_command=None
        if proxy == "none"
        else sshconfig.expand_tokens(proxy, settings, host.name, local),
        certificate_files=paths("certificatefile"),
        host_key_alias=get("hostkeyalias", "none") if "hostkeyalias" in settings else None,
        use_agent=get("identityagent", "SSH_AUTH_SOCK") != "none",
        agent_socket=agent_socket(
            sshconfig.expand_tokens(
                get("identityagent", "SSH_AUTH_SOCK"), settings, host.name, local
            )
        ),
        server_alive_s=float(alive) if alive.isdigit() else 0.0,
        server_alive_count=int(alive_count) if alive_count.isdigit() else 3,
    )


def refuse_unhonoured(
    host: Host, settings: sshconfig.Settings, options: SshOptions, ssh: str
) -> None:
    """An error naming the setting, its file:line and the host when the config asks for a
    way of connecting dtrain cannot follow: never silently connect some other way."""
    refused = sshconfig.refused_settings(settings)
    if not refused:
        return
    keyword, value, why = refused[0]
    where = sshconfig.where_set(ssh, host.name, options.config_file, keyword)
    raise UsageError(
        f"ssh config {where} sets {keyword} {value} for host {host.name}: {why}",
        hint=f"give {host.name} a way in by key (IdentityFile, CertificateFile, ssh-agent) in "
        f"a Host block dtrain reads first, or use --ssh-config FILE without {keyword}",
    )


def hop_host(user: str, name: str, port: str) -> Host:
    return Host(name=name, user=user or None, port=int(port) if port else None)


def refuse_unreadable_files(host: Host, target: SshTarget) -> None:
    """Keys, certificates and known_hosts files that paramiko would read are regular files of
    a sane size: an `IdentityFile /dev/zero` would fill memory, a FIFO wait forever. A file
    that is not there is skipped, as OpenSSH skips it."""
    keys = target.identity_files or tuple(
        os.path.expanduser(f"~/.ssh/{name}") for name in DEFAULT_KEY_NAMES
    )
    hint = f"point it at a regular file in the ssh config for {host.name}, or remove the line"
    named = (
        *((path, "IdentityFile", MAX_INPUT_BYTES) for path in keys),
        *((path, "CertificateFile", MAX_INPUT_BYTES) for path in target.certificate_files),
        *((path, "UserKnownHostsFile", MAX_KNOWN_HOSTS_BYTES) for path in target.known_hosts_files),
    )
    for path, setting, limit in named:
        if os.path.exists(path):
            flag = f"{setting} for host {host.name}"
            check_input(InputFile(Path(path), flag, "ssh file", hint), limit)
