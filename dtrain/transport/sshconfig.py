"""Each host's ssh settings as OpenSSH itself resolves them: `ssh -G`.

Include, Match (exec too), wildcards, negation, tokens and CanonicalizeHostname are then
exactly what `ssh host` would use; dtrain only reads the result. Hosts are resolved in
parallel, once per run; nothing is kept between runs. The parse of `ssh -G`'s output and the
judgement of what dtrain can honour are pure; running ssh is at the edge. The user's config
is only read, never written.
"""

from __future__ import annotations

import contextlib
import getpass
import hashlib
import os
import re
import shutil
import signal
import socket
import subprocess
from collections.abc import Callable, Mapping, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path

from dtrain.errors import DtrainError, UsageError
from dtrain.inputfiles import special_kind
from dtrain.transport.options import DEFAULT_CONNECT_TIMEOUT_S

SSH_G_TIMEOUT_S = 20.0
MAX_PARALLEL = 16

Settings = Mapping[str, tuple[str, ...]]
# keywords `ssh -G` may print more than once: every value counts
MULTI = frozenset({"identityfile", "certificatefile", "localforward", "remoteforward", "sendenv"})


def parse_ssh_g(text: str) -> dict[str, tuple[str, ...]]:
    """`ssh -G` output as keyword -> values (lower-case keyword; a repeated keyword keeps
    every value in order, others their one value)."""
    found: dict[str, list[str]] = {}
    for line in text.splitlines():
        keyword, _, value = line.strip().partition(" ")
        if not keyword:
            continue
        found.setdefault(keyword.lower(), []).append(value.strip())
    return {k: tuple(v) for k, v in found.items()}


@dataclass(frozen=True)
class Local:
    """Facts about this side that OpenSSH's tokens refer to (%u %d %l %L %i)."""

    user: str
    home: str
    hostname: str
    uid: int

    @classmethod
    def here(cls) -> Local:
        return cls(getpass.getuser(), os.path.expanduser("~"), socket.gethostname(), os.getuid())


def expand_tokens(text: str, settings: Settings, original: str, local: Local) -> str:
    """OpenSSH's %-tokens and a leading ~ in IdentityFile, CertificateFile, ProxyCommand."""
    host = one(settings, "hostname", original)
    port = one(settings, "port", "22")
    user = one(settings, "user", local.user)
    short = local.hostname.split(".")[0]
    conn = hashlib.sha1(f"{local.hostname}{host}{port}{user}".encode()).hexdigest()
    tokens = {
        "h": host,
        "p": port,
        "r": user,
        "n": original,
        "u": local.user,
        "d": local.home,
        "l": local.hostname,
        "L": short,
        "i": str(local.uid),
        "C": conn,
        "k": one(settings, "hostkeyalias", original),
        "%": "%",
    }

    def token(match: re.Match[str]) -> str:
        return tokens.get(match.group(1), match.group(0))

    expanded = re.sub(r"%(.)", token, text)
    if expanded.startswith("~/"):
        expanded = local.home + expanded[1:]
    return expanded


def one(settings: Settings, key: str, default: str) -> str:
    values = settings.get(key)
    return values[0] if values else default


def endpoint(settings: Settings, name: str) -> tuple[str, int, str]:
    """(HostName, Port, User): where host `name` is, and who logs in there."""
    hostname, port = one(settings, "hostname", name), int(one(settings, "port", "22"))
    return hostname, port, one(settings, "user", "") or getpass.getuser()


def through_proxy(settings: Settings) -> bool:
    """Whether a connection goes through a ProxyCommand or ProxyJump (OpenSSH's "none" is
    neither), not straight to the host."""
    return any(one(settings, key, "none") != "none" for key in ("proxycommand", "proxyjump"))


def connect_timeout_s(settings: Settings, given_s: float | None) -> float:
    """The flag's timeout, else ConnectTimeout (OpenSSH's 0 or none: dtrain's default)."""
    if given_s is not None:
        return given_s
    raw = one(settings, "connecttimeout", "none")
    return float(raw) if raw.isdigit() and int(raw) > 0 else DEFAULT_CONNECT_TIMEOUT_S


# What dtrain cannot do, by setting: (is it set so that it matters, why, what to do).
def refused_settings(settings: Settings) -> list[tuple[str, str, str]]:
    """The settings that change where or how to connect and that dtrain cannot honour:
    (keyword as OpenSSH spells it, value, why). Empty when dtrain connects as `ssh` would."""
    refused = []
    pubkey = one(settings, "pubkeyauthentication", "yes").lower() in ("yes", "true")
    if one(settings, "pkcs11provider", "none").lower() != "none":
        refused.append(
            ("PKCS11Provider", one(settings, "pkcs11provider", ""), "dtrain cannot use PKCS#11")
        )
    if not pubkey:
        methods = "GSSAPIAuthentication" if _yes(settings, "gssapiauthentication") else None
        why = "dtrain logs in with keys or certificates only"
        if methods:
            refused.append(("GSSAPIAuthentication", "yes", why + " (no Kerberos/GSSAPI)"))
        else:
            refused.append(("PubkeyAuthentication", "no", why))
    if _yes(settings, "proxyusefdpass"):
        refused.append(("ProxyUseFdpass", "yes", "dtrain carries a ProxyCommand over its pipes"))
    control = one(settings, "controlpath", "none")
    if control.lower() != "none" and one(settings, "controlmaster", "false") in ("false", "no"):
        refused.append(
            (
                "ControlPath",
                control,
                "with ControlMaster no the connection is meant to reuse a master dtrain cannot use",
            )
        )
    return refused


def _yes(settings: Settings, key: str) -> bool:
    return one(settings, key, "no").lower() in ("yes", "true")


def openssh_client() -> str:
    """The OpenSSH client's path: every host's settings come from `ssh -G`. Missing, it is
    this machine's setup, not the user's flags: exit 3, as a missing srun."""
    path = shutil.which("ssh")
    if path is None:
        raise DtrainError(
            NO_OPENSSH,
            hint="install the OpenSSH client (Debian/Ubuntu: apt-get install openssh-client; "
            "RHEL: dnf install openssh-clients) so that `ssh -G HOST` works",
        )
    return path


NO_OPENSSH = "no OpenSSH client (ssh) on PATH: dtrain reads each host's ssh config with `ssh -G`"


# Asked of every `ssh -G`, so its answer holds the ServerAliveInterval the user chose, never
# one OpenSSH derives. Its only derived interval is BatchMode's: with BatchMode yes and no
# ServerAliveInterval, it fills in 300 s (readconf.c, fill_default_options), which `ssh -G`
# prints like a value the config set, and 300 x 3 would let a silent host keep its tasks for
# 15 minutes. An option on the command line is the first value OpenSSH obtains, so it wins
# over the config's BatchMode, and the answer then says the config's own interval, or 0 (off)
# when none is set; the two answers differ in nothing else. dtrain never prompts either way,
# so the `batchmode` line of the answer is not read.
SSH_G_OPTIONS = ("-o", "BatchMode=no")


def ssh_g_argv(
    ssh: str, name: str, config_file: str | None, user: str | None, port: int | None
) -> list[str]:
    argv = [ssh, "-G", *SSH_G_OPTIONS]
    if config_file is not None:
        argv += ["-F", config_file]
    if user:
        argv += ["-l", user]
    if port:
        argv += ["-p", str(port)]
    return [*argv, "--", name]


def run_ssh_g(
    ssh: str,
    name: str,
    config_file: str | None,
    user: str | None,
    port: int | None,
    started: Callable[[subprocess.Popen[str]], None] | None = None,
) -> str:
    """One host's `ssh -G` answer; an error naming the host and OpenSSH's own words when it
    refuses the config (a bad line, a Match exec that hangs). It runs in a session of its own,
    so a Match exec's command ends with it (`end_session`); `started` is given the process."""
    argv = ssh_g_argv(ssh, name, config_file, user, port)
    process = subprocess.Popen(
        argv,
        stdin=subprocess.DEVNULL,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    if started is not None:
        started(process)
    try:
        stdout, stderr = process.communicate(timeout=SSH_G_TIMEOUT_S)
    except subprocess.TimeoutExpired:
        end_session(process)
        stuck = waited_on(argv)
        if stuck is not None:
            raise UsageError(
                f"ssh config {stuck}, not a regular file: `ssh -G` waits on it forever",
                hint="point that Include at a regular file",
            ) from None
        raise UsageError(
            f"`ssh -G {name}` took more than {SSH_G_TIMEOUT_S:g} s (a Match exec that hangs?)",
            hint="fix the ssh config until `ssh -G HOST` answers at once",
        ) from None
    finally:
        end_session(process)  # what a Match exec left behind
    if process.returncode != 0:
        words = " ".join(
            line for line in stderr.splitlines() if not line.startswith("Pseudo-terminal")
        )
        words = words or f"exit {process.returncode}"
        raise UsageError(
            f"OpenSSH refuses the ssh config for host {name}: {words}",
            hint=f"`{' '.join(argv)}` shows the same; fix the line it names",
        )
    return stdout


INCLUDING = re.compile(r"Including file (.+) depth \d+$", re.MULTILINE)  # `ssh -vvv` says


def waited_on(argv: Sequence[str], timeout_s: float = 2.0) -> str | None:
    """What a hanging `ssh -G` waits on, when it is a file no config can be (`a.conf is a
    FIFO`), or None: asked again with -vvv, which names each file it includes before opening
    it. Only when `ssh -G` already hung: dtrain does not read Includes itself."""
    process = subprocess.Popen(
        [argv[0], "-vvv", *argv[1:]],
        stdin=subprocess.DEVNULL,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )
    try:
        stderr = process.communicate(timeout=timeout_s)[1]
    except subprocess.TimeoutExpired:
        end_session(process, reap=False)
        stderr = process.communicate()[1]
    included = INCLUDING.findall(stderr)
    kind = special_kind(included[-1]) if included else None
    return f"{included[-1]} is {kind}" if kind else None


def end_session(process: subprocess.Popen[str], reap: bool = True) -> None:
    """Kill an `ssh -G` and every command its Match exec started (its session), and reap it
    (`reap` False: the thread that runs it reaps it). The session's id is the process's own,
    still reserved while it is not reaped."""
    if process.returncode is None:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(process.pid, signal.SIGKILL)
        if reap:
            process.communicate()


HostKey = tuple[str, str | None, int | None]  # (name, user, port), as a hosts file gives them


def resolve_all(
    ssh: str, hosts: Sequence[HostKey], config_file: str | None
) -> list[dict[str, tuple[str, ...]]]:
    """`ssh -G` for every (name, user, port), in parallel; the first host's error (in order)
    wins, raised once every `ssh -G` has ended, so none outlives dtrain (a hanging `Match
    exec` is killed at its timeout; Ctrl-C kills them all at once)."""
    if not hosts:
        return []
    running: list[subprocess.Popen[str]] = []

    def ask(key: HostKey) -> dict[str, tuple[str, ...]]:
        name, user, port = key
        return parse_ssh_g(run_ssh_g(ssh, name, config_file, user, port, running.append))

    pool = ThreadPoolExecutor(min(MAX_PARALLEL, len(hosts)), thread_name_prefix="dtrain-ssh-G")
    futures = [pool.submit(ask, key) for key in hosts]
    try:
        pool.shutdown(wait=True)
    except BaseException:  # Ctrl-C while waiting: no `ssh -G` (nor its Match exec) stays
        for process in list(running):
            end_session(process, reap=False)
        pool.shutdown(wait=False, cancel_futures=True)
        raise
    return [f.result() for f in futures]


def where_set(ssh: str, name: str, config_file: str | None, keyword: str) -> str:
    """`file:line` of the line that sets `keyword` for `name` (from the files `ssh -G -v`
    reads, Includes too), or the files read when no line says it literally."""
    argv = [ssh, "-G", "-vvv", *(["-F", config_file] if config_file else []), "--", name]
    try:
        done = subprocess.run(
            argv, capture_output=True, text=True, timeout=SSH_G_TIMEOUT_S, check=False
        )
    except subprocess.TimeoutExpired:
        return config_file or "your ssh config"
    files = re.findall(r"Reading configuration data (\S+)", done.stderr)
    pattern = re.compile(rf"^\s*{keyword}\b", re.IGNORECASE)
    for path in files:
        try:
            lines = Path(path).read_text(encoding="utf-8", errors="replace").splitlines()
        except OSError:
            continue
        for number, line in enumerate(lines, 1):
            if pattern.match(line):
                return f"{path}:{number}"
    return " or ".join(files) or config_file or "your ssh config"
