"""`--setup` on a host: the shell script the agent runs, and what to make of how it ended.

The agent runs the commands in the user's shell (`$SHELL`) as a process group of its own,
tagged with the job's id, so that it can stop them (a hang, Ctrl-C, the launcher gone) and
`dtrain ps`/`kill` see them. The script notes in a result file which command it is at and
whether one failed, and at its end the environment the commands left (NUL-separated, written
by the agent's own Python), which the agent takes for the tasks it starts later.

Standard library only, Python >= 3.6: sent to remote hosts with the agent.
"""

import os
from typing import Dict, List, Optional, Tuple  # noqa: F401 - used in type comments

from . import proto

ENV_MARK = b"env\0"  # what comes after it in the result file is the environment
FAILED_MARK = b"failed"
HINT_FAILED = (
    "the setup runs in $SHELL on each host before anything starts there; run it by hand "
    "on that host to see why it fails"
)
HINT_TIMEOUT = (
    "check what it waits for (a prompt, a lock, the network) by running it by hand on that "
    "host; --setup-timeout SECONDS gives it longer"
)
_DUMP = (
    "import os,sys;sys.stdout.buffer.write("
    "b'env\\0'+b'\\0'.join(k+b'='+v for k,v in os.environb.items()))"
)


def quote(text):
    # type: (str) -> str
    """`text` as one word for any POSIX shell."""
    return "'" + text.replace("'", "'\"'\"'") + "'"


def shown(command):
    # type: (str) -> str
    """A command on one line, as messages name it."""
    return "; ".join(line.strip() for line in command.splitlines() if line.strip())


def script(commands, python, result_path):
    # type: (List[str], str, str) -> str
    """The commands in order, in the shell itself (so `source`, `conda activate` and `export`
    shape what follows); the first that fails ends the script."""
    out = quote(result_path)
    parts = []
    for number, command in enumerate(commands):
        parts.append(
            "echo %d >>%s\n{ %s\n} || { s=$?; echo %s >>%s; exit $s; }\n"
            % (number, out, command, FAILED_MARK.decode(), out)
        )
    parts.append("exec %s -E -S -c %s >>%s\n" % (quote(python), quote(_DUMP), out))
    return "".join(parts)


def shell_env(job_id, name):
    # type: (str, str) -> Dict[str, str]
    """What the setup's shell gets on top of the agent's environment: the job's tag, and a
    SHLVL that says it is not the login shell. The login shell ran the host's ~/.bashrc
    already, and bash run by sshd (SSH_CLIENT set) at level 1 would run it again: with a
    pyenv init there, ~0.1 s of each host's CPU on every launch."""
    level = os.environ.get("SHLVL", "")
    return {
        proto.JOB_ID_VAR: job_id,
        proto.TASK_VAR: name,
        "SHLVL": str(max(int(level) if level.isdigit() else 0, 1)),
    }


def new_result_file():
    # type: () -> str
    """An empty file only this user can read (the environment may hold secrets)."""
    folder = os.environ.get("TMPDIR") or "/tmp"
    for attempt in range(100):
        path = os.path.join(folder, "dtrain-setup-%d-%d" % (os.getpid(), attempt))
        try:
            fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_EXCL | os.O_NOFOLLOW, 0o600)
        except FileExistsError:
            continue
        os.close(fd)
        return path
    raise OSError("no free name for the setup's result file in %s" % folder)


def read_result(path):
    # type: (str) -> bytes
    """The result file's bytes; the file is removed."""
    try:
        with open(path, "rb") as f:
            return f.read()
    except OSError:
        return b""
    finally:
        try:
            os.unlink(path)
        except OSError:
            pass


def _reached(marks, commands):
    # type: (List[bytes], List[str]) -> Optional[str]
    """The last command the result file's marks say the script began, or None."""
    numbers = [int(m) for m in marks if m.isdigit()]
    return commands[numbers[-1]] if numbers and numbers[-1] < len(commands) else None


def current(result, commands):
    # type: (bytes, List[str]) -> str
    """The command the result file says the script is at."""
    return _reached(result.partition(ENV_MARK)[0].split(), commands) or commands[0]


def outcome(result, code, commands):
    # type: (bytes, int, List[str]) -> Tuple[Optional[Dict[str, str]], str]
    """(the environment the setup left, "") if it succeeded, else (None, what went wrong).

    `code` is the shell's exit status (negative: the signal that ended it)."""
    head, found, dump = result.partition(ENV_MARK)
    marks = head.split()
    at = _reached(marks, commands)
    named = "setup command `%s`" % shown(at) if at is not None else "the setup"
    if code == 0 and found:
        return environment(dump), ""
    if code < 0:
        return None, "%s was killed by signal %d" % (named, -code)
    if FAILED_MARK in marks:
        return None, "%s failed (exit %d)" % (named, code)
    if at is None:
        return None, "the setup shell exited with code %d before running any command" % code
    if code == 0:
        return None, (
            "%s ran `exit 0`: the setup shell ended before the commands after it, and before "
            "dtrain could take the environment it set (drop the `exit`)" % named
        )
    return None, (
        "%s exited the setup shell with code %d (an `exit %d`, or `set -e` and a command "
        "that failed), so the commands after it did not run" % (named, code, code)
    )


def environment(dump):
    # type: (bytes) -> Dict[str, str]
    """The NUL-separated `KEY=VALUE` entries, without what `shell_env` added."""
    env = {}  # type: Dict[str, str]
    for entry in dump.split(b"\0"):
        key, sep, value = entry.partition(b"=")
        if sep and key:
            env[os.fsdecode(key)] = os.fsdecode(value)
    for tag in (proto.JOB_ID_VAR, proto.TASK_VAR, "SHLVL"):
        env.pop(tag, None)
        if tag in os.environ:
            env[tag] = os.environ[tag]
    return env
