"""Files a user names on the command line (-H, --setup-file, --ssh-config), read with bounds;
the hosts file's hosts (parsed by the pure `plan/hosts`) and --setup's commands.

One guard for all of them: a regular file of at most `MAX_INPUT_BYTES`, opened without
blocking. `/dev/zero` would otherwise be read until the OOM killer came, a FIFO with no writer
waited on forever, and a file another program reads (`ssh -G -F FILE`) would do the same to
that program. Imports only the standard library, `errors` and `plan/hosts`.
"""

from __future__ import annotations

import os
import stat
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path

from dtrain.errors import UsageError
from dtrain.plan.hosts import Host, parse_hosts

MAX_INPUT_BYTES = 16 * 1024 * 1024  # far beyond any real hosts file, setup script or ssh config

NOT_REGULAR = (
    (stat.S_ISDIR, "a directory"),
    (stat.S_ISFIFO, "a FIFO"),
    (stat.S_ISCHR, "a character device"),
    (stat.S_ISBLK, "a block device"),
    (stat.S_ISSOCK, "a socket"),
)


def special_kind(path: str | Path) -> str | None:
    """What `path` is when it is no regular file ("a FIFO"), or None; a stat, never an open."""
    try:
        mode = os.stat(path).st_mode
    except OSError:
        return None
    return next((name for test, name in NOT_REGULAR if test(mode)), None)


class InputFileError(UsageError):
    """A file named by a flag is missing, unreadable, not a regular file, or too large."""

    code = "input_file"


@dataclass(frozen=True)
class InputFile:
    """A file a flag names: how the user calls it, and what to do when it is wrong."""

    path: Path
    flag: str  # "-H"
    what: str  # "hosts file"
    hint: str

    def error(self, problem: str) -> InputFileError:
        """`hosts file X (-H) is a FIFO, not a regular file`: the file, its flag, the fault."""
        return InputFileError(f"{self.what} {self.path} ({self.flag}) {problem}", hint=self.hint)


def _open(source: InputFile, max_bytes: int) -> int:
    """A descriptor on `source`, checked to be a regular file of at most `max_bytes`."""
    try:
        # O_NONBLOCK: opening a FIFO with no writer would otherwise wait forever.
        fd = os.open(source.path, os.O_RDONLY | os.O_NONBLOCK | os.O_CLOEXEC)
    except FileNotFoundError:
        raise source.error("does not exist") from None
    except OSError as exc:
        raise source.error(f"cannot be read: {exc.strerror or exc}") from None
    try:
        info = os.fstat(fd)
        if not stat.S_ISREG(info.st_mode) and not _is_dev_null(info):
            kind = next((name for test, name in NOT_REGULAR if test(info.st_mode)), "special")
            raise source.error(f"is {kind}, not a regular file")
        if info.st_size > max_bytes:  # a sparse file can claim any size: look before reading
            raise source.error(f"is larger than {max_bytes // (1024 * 1024)} MiB")
    except BaseException:
        os.close(fd)
        raise
    return fd


def _is_dev_null(info: os.stat_result) -> bool:
    """/dev/null reads as an empty file: `--ssh-config /dev/null` is `ssh -F /dev/null`."""
    if not stat.S_ISCHR(info.st_mode):
        return False
    null = os.stat(os.devnull)
    return info.st_rdev == null.st_rdev and stat.S_ISCHR(null.st_mode)


def check_input(source: InputFile, max_bytes: int = MAX_INPUT_BYTES) -> None:
    """Refuse what another program (`ssh -G -F`) would hang on or read forever."""
    os.close(_open(source, max_bytes))


def read_input(source: InputFile, max_bytes: int = MAX_INPUT_BYTES) -> bytes:
    """The file's bytes, never more than `max_bytes` read (it may grow after the check)."""
    with os.fdopen(_open(source, max_bytes), "rb") as stream:
        try:
            data = stream.read(max_bytes + 1)
        except OSError as exc:
            raise source.error(f"cannot be read: {exc.strerror or exc}") from None
    if len(data) > max_bytes:
        raise source.error(f"is larger than {max_bytes // (1024 * 1024)} MiB")
    return data


def read_text_input(source: InputFile, max_bytes: int = MAX_INPUT_BYTES) -> str:
    """The file as UTF-8 text."""
    data = read_input(source, max_bytes)
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise source.error(f"is not UTF-8 text ({exc.reason})") from None


def read_setup(setup: Sequence[str], setup_file: Path | None) -> tuple[str, ...]:
    """--setup commands, then --setup-file's text as one more (its lines run as a script)."""
    commands = [c for c in setup if c.strip()]
    if setup_file is not None:
        hint = "pass --setup-file FILE with the shell commands to run, or use --setup 'SHELL'"
        text = read_text_input(InputFile(setup_file, "--setup-file", "setup file", hint))
        if text.strip():
            commands.append(text.rstrip("\n"))
    return tuple(commands)


def read_hosts(path: Path | None) -> tuple[Host, ...]:
    """The hosts file's hosts; a FIFO, a device or a huge file is refused, never read forever."""
    if path is None:
        return ()
    hint = (
        "pass -H FILE, a text file with one host per line (see hosts.example), "
        "or leave -H out to run everything on this machine"
    )
    text = read_text_input(InputFile(path, "-H", "hosts file", hint))
    return parse_hosts(text, str(path))
