"""The relay's heap: freed buffers are reused instead of faulted in anew, in a real process."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

GLIBC = bool(getattr(os, "confstr", None) and os.confstr("CS_GNU_LIBC_VERSION"))

# A thread that holds eight 256 KB buffers at once and frees them, 20 times over (what a relay
# does with frames and packets), and the page faults it took. Thresholds are once per process:
# each case runs in its own interpreter.
CHURN = """
import json, resource, sys, threading
from dtrain.remote import heap
kept = heap.keep_freed() if sys.argv[1] == "keep" else None
again = heap.keep_freed() if sys.argv[1] == "keep" else None
faults = []
def churn():
    before = resource.getrusage(resource.RUSAGE_THREAD).ru_minflt
    for _ in range(20):
        held = [bytes(256 << 10) for _ in range(8)]
        del held
    faults.append(resource.getrusage(resource.RUSAGE_THREAD).ru_minflt - before)
thread = threading.Thread(target=churn)
thread.start()
thread.join()
print(json.dumps({"kept": kept, "again": again, "faults": faults[0]}))
"""
ROUND_PAGES = 8 * (256 << 10) // 4096  # the pages one round's buffers cover


def churn(mode: str) -> dict[str, object]:
    out = subprocess.run(
        [sys.executable, "-c", CHURN, mode],
        capture_output=True,
        text=True,
        timeout=60,
        check=True,
    )
    result: dict[str, object] = json.loads(out.stdout)
    return result


@pytest.mark.skipif(not GLIBC, reason="the thresholds are glibc's")
def test_a_relay_thread_reuses_its_freed_buffers_once_the_heap_is_kept() -> None:
    plain = churn("plain")
    kept = churn("keep")
    assert kept["kept"] is True and kept["again"] is True
    assert isinstance(kept["faults"], int) and isinstance(plain["faults"], int)
    # Kept: the first round's pages fault in once, and are reused after that.
    assert kept["faults"] < 2 * ROUND_PAGES
    # glibc's own thresholds give most rounds' pages back and fault them in again: the
    # difference this module makes, measured the same way.
    assert plain["faults"] > 8 * ROUND_PAGES


def test_without_glibc_nothing_is_set_and_nothing_fails(monkeypatch: pytest.MonkeyPatch) -> None:
    from dtrain.remote import heap

    monkeypatch.setattr(heap, "_state", {})

    def no_such_name(name: str) -> str:
        raise ValueError(f"unrecognized configuration name {name!r}")  # as on musl or macOS

    monkeypatch.setattr(os, "confstr", no_such_name)
    assert heap.keep_freed() is False
    assert heap.keep_freed() is False
