"""Keep freed memory in this process's heap once it relays a stream of task output.

glibc's malloc serves an allocation above its mmap threshold (128 KB at first, then adjusted)
with a fresh mapping, and hands the free top of a heap back to the kernel once it exceeds the
trim threshold. A relay allocates and frees 64-256 KB buffers for every chunk it passes on (a
pipe read, a frame, a decrypted packet, a prefixed console write), from several threads, so
without fixed thresholds the kernel faulted in and zeroed fresh pages for most bytes relayed:
4 tasks streaming 100 MB from `yes` cost the launcher 65,000 page faults and 0.34 s of system
time (7,000 and 0.15 s with them fixed). Slower streams, in smaller frames, churn less.

The launcher and the agent each set them once they have relayed `AFTER_BYTES` of output
(ctypes takes 3-5 ms to load: a job that prints a line now and then never pays it, and the
agent's start request never waits for it). Standard library only, Python >= 3.6: the agent
runs it too.
"""

import os

# For the type checker only: importing typing would cost every agent's start ~3 ms.
TYPE_CHECKING = False
if TYPE_CHECKING:
    from typing import Dict  # noqa: F401 - used in type comments

AFTER_BYTES = 1 << 20  # output relayed before a process fixes its thresholds
M_TRIM_THRESHOLD = -1  # mallopt parameters, from glibc's malloc.h
M_MMAP_THRESHOLD = -3
MMAP_THRESHOLD = 1 << 20  # above every buffer a relay reuses (frames: 256 KB + prefixes)
TRIM_THRESHOLD = 8 << 20  # the free memory a heap may keep: a few frames per thread

_state = {}  # type: Dict[str, bool]  # "kept": the outcome, once tried


def keep_freed():
    # type: () -> bool
    """Fix glibc's thresholds so a relay's buffers are reused, not faulted in anew. Once per
    process; True if they are set (False: not glibc, or no ctypes, which changes nothing)."""
    if "kept" not in _state:
        _state["kept"] = _set_thresholds()
    return _state["kept"]


def _set_thresholds():
    # type: () -> bool
    try:
        if not os.confstr("CS_GNU_LIBC_VERSION"):
            return False
        import ctypes

        mallopt = ctypes.CDLL(None).mallopt
    except (ValueError, OSError, ImportError, AttributeError):  # musl, macOS, no libffi
        return False
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
