"""`ssh -G` answers kept between runs: a launch need not start one OpenSSH process per host
(~8 ms of CPU each, 8 s at 1024 hosts) to learn again what the last run learned.

An answer is reused only while everything `ssh -G` reads is as it was: the client (its file),
the command line (host, user, port, -F), who and where dtrain runs (the tokens %u %d %l %i),
and every config file it reads, Includes followed, with their owners and modes (OpenSSH
refuses a file others may write). A config whose answer can change with none of that changing
is never cached: `Match exec` (runs a command), `Match localnetwork`, `Match canonical`/`final`
and `CanonicalizeHostname` (DNS), and `${VAR}` (the environment). Answers live in the user's
cache folder, private to the user, checked before each use as the agent's compiled code is;
`rm -r ~/.cache/dtrain/ssh-G` forgets them all. The reading of config text is pure; the files,
the glob and the folder are at the edges.
"""

from __future__ import annotations

import contextlib
import hashlib
import logging
import os
import re
import shlex
import stat
import time
from collections.abc import Callable
from pathlib import Path
from typing import NamedTuple

from dtrain import usercache
from dtrain.errors import UsageError

logger = logging.getLogger(__name__)

MAX_DEPTH = 16  # OpenSSH's own limit on nested Includes
MAX_FILES = 256
MAX_FILE_BYTES = 1 << 20
STALE_S = 7 * 86400.0  # answers not used for a week are removed
SWEEP_EVERY_S = 86400.0  # ... by a sweep at most once a day
SWEPT = ".swept"  # its mtime: when the folder was last swept
SYSTEM_FOLDER = (
    "/etc/ssh"  # where a relative Include of the system's config is (~/.ssh: the user's)
)
SYSTEM_CONFIG = "/etc/ssh/ssh_config"

# Match criteria whose outcome depends on more than the config: a command, the local network,
# DNS (canonical, final re-parse after canonicalization). `all`, `canonical`, `final` take no
# argument; every other criterion takes one.
_UNCACHEABLE_CRITERIA = frozenset({"exec", "localnetwork", "canonical", "final"})
_NO_ARGUMENT = frozenset({"all", "canonical", "final"})
_KEYWORD = re.compile(r"\s*([A-Za-z][A-Za-z0-9]*)\s*(?:=\s*|\s+|$)(.*)")


class ConfigText(NamedTuple):
    """What one config file says that matters to the cache: the Include patterns it names, in
    order, and why its answers cannot be cached (None: they can). A NamedTuple: this module
    loads before a launch's first connection, where a dataclass costs ~1 ms."""

    includes: tuple[str, ...]
    uncacheable: str | None


def read_config_text(text: str) -> ConfigText:
    """The Includes and the cacheability of one config file's text (pure)."""
    includes: list[str] = []
    for number, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith("#"):
            continue
        if "${" in line:
            return ConfigText((), f"line {number} expands an environment variable")
        found = _KEYWORD.match(line)
        if found is None:
            continue
        keyword, rest = found.group(1).lower(), found.group(2)
        if keyword == "match" and _match_is_uncacheable(rest):
            return ConfigText((), f"line {number} matches on a command, network or DNS")
        if keyword == "canonicalizehostname" and rest.split()[:1] not in (["no"], ["false"]):
            return ConfigText((), f"line {number} canonicalizes host names (DNS)")
        if keyword == "include":
            try:
                patterns = shlex.split(rest)
            except ValueError:
                return ConfigText((), f"line {number} has an Include dtrain cannot read")
            if any("%" in p or "$" in p for p in patterns):
                return ConfigText((), f"line {number} has an Include with tokens")
            includes += patterns
    return ConfigText(tuple(includes), None)


def _match_is_uncacheable(criteria: str) -> bool:
    """Whether a Match line's criteria include one whose outcome the cache cannot see."""
    try:
        words = shlex.split(criteria)
    except ValueError:
        return True
    at = 0
    while at < len(words):
        criterion = words[at].lower().lstrip("!")
        if criterion in _UNCACHEABLE_CRITERIA:
            return True
        at += 1 if criterion in _NO_ARGUMENT else 2
    return False


def include_path(pattern: str, home: str, system: bool) -> str:
    """An Include pattern as OpenSSH resolves it: `~` is the home folder, and a relative one is
    under ~/.ssh for the user's config (and -F), under /etc/ssh for the system's (pure)."""
    if pattern.startswith("~/") or pattern == "~":
        return home + pattern[1:]
    if os.path.isabs(pattern):
        return pattern
    return os.path.join(SYSTEM_FOLDER if system else os.path.join(home, ".ssh"), pattern)


def answer_key(fingerprint: str, name: str, user: str | None, port: int | None) -> str:
    """The cache key of one host's answer under one config fingerprint (pure)."""
    text = "\0".join((fingerprint, name, user or "", str(port or "")))
    return hashlib.sha256(text.encode("utf-8", "surrogateescape")).hexdigest()


# ---- the files `ssh -G` reads ----------------------------------------------------------------


def config_fingerprint(
    ssh: str,
    config_file: str | None,
    home: str,
    facts: tuple[str, ...],
    options: tuple[str, ...] = (),
) -> str | None:
    """A digest of everything `ssh -G` reads, or None when its answers must not be cached (the
    config says so, or a file could not be read as OpenSSH would). `facts`: this side's user,
    uid and host name (with `home`, what the tokens expand to); `options`: what dtrain adds to
    every `ssh -G` command line (an answer asked without them is not one asked with them)."""
    digest = hashlib.sha256()

    def add(*parts: object) -> None:
        for part in parts:
            digest.update(str(part).encode("utf-8", "surrogateescape") + b"\0")

    try:
        binary = os.stat(ssh)
    except OSError:
        return None
    add(os.path.realpath(ssh), binary.st_dev, binary.st_ino, binary.st_size, binary.st_mtime_ns)
    add(config_file or "", home, *facts)
    add("options", *options)
    if config_file is not None:
        tops = [(os.path.abspath(config_file), False)]
    else:
        tops = [(os.path.join(home, ".ssh", "config"), False), (SYSTEM_CONFIG, True)]
    pending = [(path, system, 0) for path, system in reversed(tops)]
    read = 0
    while pending:
        path, system, depth = pending.pop()
        read += 1
        if depth > MAX_DEPTH or read > MAX_FILES:
            return None
        text = _file_text(path, add)
        if text is None:
            continue
        seen = read_config_text(text)
        if seen.uncacheable is not None:
            logger.debug("ssh -G answers not cached: %s %s", path, seen.uncacheable)
            return None
        nested = []
        for pattern in seen.includes:
            full = include_path(pattern, home, system)
            matches = sorted(_glob(full)) if any(c in full for c in "*?[") else [full]
            add("include", full, *matches)
            nested += [(m, system, depth + 1) for m in matches]
        pending += reversed(nested)
    return digest.hexdigest()


def _glob(pattern: str) -> list[str]:
    import glob  # only for configs that Include a wildcard

    return glob.glob(pattern)


def _file_text(path: str, add: Callable[..., None]) -> str | None:
    """One config file's text, its identity added to the digest; None where there is no file
    (that absence is added too: a file created later changes the fingerprint)."""
    try:
        info = os.stat(path)
    except FileNotFoundError:
        add("absent", path)
        return None
    if stat.S_ISFIFO(info.st_mode):  # `ssh -G` would wait on it until its timeout
        raise UsageError(
            f"ssh config {path} is a FIFO, not a regular file: `ssh -G` would wait on it",
            hint="point that Include (or --ssh-config) at a regular file",
        )
    if info.st_size > MAX_FILE_BYTES or not stat.S_ISREG(info.st_mode):
        add("other", path, info.st_mode, info.st_size)
        return None
    with open(path, "rb") as f:
        data = f.read(MAX_FILE_BYTES + 1)
    add("file", path, info.st_uid, info.st_mode, hashlib.sha256(data).hexdigest())
    return data.decode("utf-8", "replace")


# ---- the answers, in the user's cache folder ---------------------------------------------------


def cache_folder() -> Path | None:
    """~/.cache/dtrain/ssh-G, private to this user (`usercache.folder`); None when it cannot be."""
    folder = usercache.folder("ssh-G")
    return Path(folder) if folder is not None else None


class Answers:
    """`ssh -G` answers under one config fingerprint: `get` before running it, `put` after."""

    def __init__(self, folder: Path, fingerprint: str) -> None:
        self.folder = folder
        self.fingerprint = fingerprint
        self.stored = 0

    @classmethod
    def for_config(
        cls,
        ssh: str,
        config_file: str | None,
        home: str,
        facts: tuple[str, ...],
        options: tuple[str, ...] = (),
    ) -> Answers | None:
        """The answers for this client and config, or None when they must be asked each time."""
        try:
            fingerprint = config_fingerprint(ssh, config_file, home, facts, options)
        except OSError as exc:  # a config OpenSSH may not read either: let it say so
            logger.debug("ssh -G answers not cached: %s", exc)
            return None
        folder = cache_folder() if fingerprint is not None else None
        return cls(folder, fingerprint) if folder is not None and fingerprint else None

    def _path(self, name: str, user: str | None, port: int | None) -> Path:
        return self.folder / f"{answer_key(self.fingerprint, name, user, port)}.txt"

    def get(self, name: str, user: str | None, port: int | None) -> str | None:
        path = self._path(name, user, port)
        data = usercache.read(str(path), MAX_FILE_BYTES)
        # Answers are written whole and renamed into place: anything else is not one.
        if data is None or not data.startswith(b"host ") or not data.endswith(b"\n"):
            return None
        with contextlib.suppress(OSError):
            os.utime(path, follow_symlinks=False)  # in use: not stale
        return data.decode("utf-8", "surrogateescape")

    def put(self, name: str, user: str | None, port: int | None, text: str) -> None:
        path = self._path(name, user, port)
        try:
            usercache.write(str(path), text.encode("utf-8", "surrogateescape"))
            self.stored += 1
        except OSError as exc:
            logger.debug("cannot keep the ssh -G answer for %s: %s", name, exc)

    def prune(self, now: float | None = None) -> None:
        """Remove answers unused for a week (a config that changed leaves its old ones), at
        most once a day: a sweep stats every answer kept, and the first run of each new config
        paid it (50 ms for the 5,600 answers two days of dtrain's test suite left on a machine)."""
        now = time.time() if now is None else now
        swept = self.folder / SWEPT
        try:
            if 0 <= now - swept.stat(follow_symlinks=False).st_mtime < SWEEP_EVERY_S:
                return  # (a stamp from the future does not stop the sweeps)
        except FileNotFoundError:
            pass
        except OSError:
            return
        try:
            usercache.write(str(swept), b"")
            os.utime(swept, (now, now), follow_symlinks=False)
            entries = list(os.scandir(self.folder))
        except OSError:
            return
        limit = now - STALE_S
        for entry in entries:
            if entry.name == SWEPT:
                continue
            try:
                if entry.stat(follow_symlinks=False).st_mtime < limit:
                    os.unlink(entry.path)
            except OSError:
                continue
