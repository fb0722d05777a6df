"""Whether a staged task can start on this host, checked before any task starts anywhere.

The working directory, the program (found as execvp finds it from there), whether the kernel
would run it, the script a python or shell command names, and the GPUs its
CUDA_VISIBLE_DEVICES asks for. Each problem comes with what to do. Standard library only,
Python >= 3.6.
"""

import os
from typing import Any, Mapping, Optional, Tuple  # noqa: F401 - used in type comments

from . import procs

BINFMT_MISC = "/proc/sys/fs/binfmt_misc"  # the kernel's extra executable formats, if mounted
NVIDIA_GPUS = "/proc/driver/nvidia/gpus"  # one entry per GPU the driver sees
AMD_KFD = "/dev/kfd"  # ROCm reads CUDA_VISIBLE_DEVICES too, and its GPUs are not counted here


def check_runnable(task):
    # type: (Any) -> Optional[Tuple[str, str]]
    """(problem, hint) if the task cannot start here, before anything starts anywhere."""
    if not os.path.isdir(task.cwd):
        return (
            "working directory %s does not exist" % task.cwd,
            "pass --workdir DIR that exists on every host, or --sync-dst-dir DIR to copy it there",
        )
    program = task.argv[0] if task.argv else ""
    if "/" in program:
        path = os.path.join(task.cwd, program)
        if os.path.isdir(path):
            return (
                "%s is a directory, not a program" % program,
                "name the program to run in it, e.g. -- python %s/train.py" % program.rstrip("/"),
            )
        if not os.path.isfile(path):
            return ("%s: no such file" % program, "check the path; it is resolved in --workdir")
        if not os.access(path, os.X_OK):
            return (
                "%s: not executable" % program,
                "chmod +x it, or run it through its interpreter",
            )
    else:
        env_path = task.env.get("PATH", os.environ.get("PATH", os.defpath))
        found = procs.which(program, env_path, task.cwd)
        if found is None:
            return (
                "command not found: %s (PATH=%s)" % (program, env_path),
                "install it on this host, or give its absolute path in the command",
            )
        path = found
    if exec_format_problem(path):
        return (
            "%s has no #! line and is not a program this host can run" % program,
            "add a #! line naming its interpreter, or put the interpreter first: "
            "-- python3 %s (or -- sh %s)" % (program, program),
        )
    if task.script and script_missing(task):
        return (
            "%s: no such file in %s" % (task.script, task.cwd),
            "check the script's path (it is resolved in the task's working directory), "
            "or copy it there with --sync-dst-dir",
        )
    return None


def script_missing(task):
    # type: (Any) -> bool
    """Whether the task's script is in neither its working directory nor, where its program
    looks there too (bash given a bare name), a directory of its PATH."""
    if os.path.exists(os.path.join(task.cwd, task.script)):
        return False
    if not task.script_on_path:
        return True
    env_path = task.env.get("PATH", os.environ.get("PATH", os.defpath))
    return not any(
        os.path.isfile(os.path.join(task.cwd, folder, task.script))
        for folder in env_path.split(os.pathsep)
    )


def exec_format_problem(path, binfmt_misc=BINFMT_MISC):
    # type: (str, str) -> bool
    """Whether the kernel would refuse to run `path` (ENOEXEC): no `#!` line, no ELF header,
    and no binfmt_misc handler that might take it. execvp, and so setpriv (see `spawn`),
    would then hand it to /bin/sh, which must not read a Python file as a shell script."""
    try:
        with open(path, "rb") as f:
            head = f.read(4)
    except OSError:
        return False  # unreadable: the exec itself says why
    if head[:2] == b"#!" or head == b"\x7fELF":
        return False
    try:
        with open(os.path.join(binfmt_misc, "status")) as f:
            enabled = f.read().strip() == "enabled"
        handlers = [n for n in os.listdir(binfmt_misc) if n not in ("register", "status")]
    except OSError:
        enabled, handlers = False, []
    return not (enabled and handlers)


def gpu_note(env, gpus_dir=NVIDIA_GPUS, kfd=AMD_KFD):
    # type: (Mapping[str, str], str, str) -> Optional[str]
    """What the person should know when the task's CUDA_VISIBLE_DEVICES (--gpus) names a GPU
    index this host does not have: CUDA then sees fewer GPUs, or none. None when all are
    here, or when it cannot tell (UUIDs, an AMD host)."""
    wanted = env.get("CUDA_VISIBLE_DEVICES") or ""
    indexes = [int(part) for part in wanted.split(",") if part.strip().isdigit()]
    if not indexes:
        return None
    try:
        count = len(os.listdir(gpus_dir))
    except OSError:
        count = 0
    missing = [str(index) for index in indexes if index >= count]
    if not missing or (count == 0 and os.path.exists(kfd)):
        return None
    shown = {0: "no GPU", 1: "GPU 0"}.get(count, "GPUs 0-%d" % (count - 1))
    return "CUDA_VISIBLE_DEVICES=%s, but this host has no GPU %s (the NVIDIA driver shows %s)" % (
        wanted,
        ",".join(missing),
        shown,
    )
