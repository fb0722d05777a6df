"""`--sync-dst-dir`: copy the working directory to every host before anything starts.

Like `rsync -a` without deletions: a file is sent when its size or modification time differs
from the host's copy, over the host's existing ssh connection (the same settings, keys and host
key checks as everything else), to all hosts in parallel. Any host's failure aborts the launch
and names the host.
"""

from __future__ import annotations

import fnmatch
import os
import stat
import threading
from collections.abc import Iterator, Mapping, Sequence
from dataclasses import dataclass
from pathlib import Path

from dtrain.agents import ops
from dtrain.agents.session import AgentSession, in_parallel
from dtrain.errors import Problem, RemoteError, UsageError
from dtrain.launch import DEFAULT_EXCLUDES

CHUNK = 1 << 20


@dataclass(frozen=True)
class Manifest:
    root: Path
    dirs: tuple[str, ...]
    files: tuple[tuple[str, int, int, int], ...]  # (relative path, size, mtime_ns, mode)
    links: tuple[tuple[str, str], ...]


@dataclass
class HostSync:
    host: str
    files_sent: int = 0
    bytes_sent: int = 0
    unchanged: int = 0


def _excluded(name: str, rel: str, excludes: Sequence[str]) -> bool:
    """Whether a pattern matches the entry's name or its whole relative path. Its folders'
    names were matched when the walk entered them (an excluded folder is never entered)."""
    return any(
        fnmatch.fnmatch(name, pattern) or fnmatch.fnmatch(rel, pattern) for pattern in excludes
    )


def build_manifest(root: Path, excludes: Sequence[str] = DEFAULT_EXCLUDES) -> Manifest:
    """Everything under root except the excluded names; symlinks stay symlinks."""
    dirs: list[str] = []
    files: list[tuple[str, int, int, int]] = []
    links: list[tuple[str, str]] = []
    for current, dirnames, filenames in os.walk(root):
        base = os.path.relpath(current, root)
        kept = []
        for name in sorted(dirnames):
            rel = name if base == "." else f"{base}/{name}"
            if _excluded(name, rel, excludes):
                continue
            path = os.path.join(current, name)
            if os.path.islink(path):
                links.append((rel, os.readlink(path)))
            else:
                dirs.append(rel)
                kept.append(name)
        dirnames[:] = kept
        for name in sorted(filenames):
            rel = name if base == "." else f"{base}/{name}"
            if _excluded(name, rel, excludes):
                continue
            path = os.path.join(current, name)
            st = os.lstat(path)
            if stat.S_ISLNK(st.st_mode):
                links.append((rel, os.readlink(path)))
            elif stat.S_ISREG(st.st_mode):
                files.append((rel, st.st_size, st.st_mtime_ns, st.st_mode))
    return Manifest(Path(root), tuple(dirs), tuple(files), tuple(links))


class LocalFileError(Exception):
    """A file of the tree could not be read here: this machine's problem, not a host's."""

    def __init__(self, path: Path, why: str) -> None:
        super().__init__(f"{path}: {why}")
        self.path = path
        self.why = why


def _stream(root: Path, files: Sequence[tuple[str, int, int, int]]) -> Iterator[bytes]:
    """File contents, concatenated in order, exactly as many bytes as the manifest says."""
    for rel, size, _, _ in files:
        left = size
        try:
            with open(root / rel, "rb") as handle:
                while left > 0:
                    chunk = handle.read(min(CHUNK, left))
                    if not chunk:
                        raise LocalFileError(root / rel, "it shrank while being copied")
                    left -= len(chunk)
                    yield chunk
        except OSError as exc:
            raise LocalFileError(root / rel, exc.strerror or str(exc)) from None


def sync_host(session: AgentSession, manifest: Manifest, dst: str) -> HostSync:
    report = HostSync(host=session.host.display)
    need = ops.sync_plan(session, dst, manifest.dirs, manifest.files, manifest.links, 60)
    wanted = [manifest.files[i] for i in need]
    report.unchanged = len(manifest.files) - len(wanted)
    if wanted:
        size = sum(f[1] for f in wanted)
        ops.sync_put(
            session,
            dst,
            wanted,
            _stream(manifest.root, wanted),
            60 + size / 2e6,  # at least 2 MB/s before we call the host stuck
        )
        report.files_sent = len(wanted)
        report.bytes_sent = size
    return report


def sync_all(sessions: Mapping[str, AgentSession], manifest: Manifest, dst: str) -> list[HostSync]:
    """Sync every host in parallel; any failure raises naming each failed host."""
    reports: dict[str, HostSync] = {}
    problems: list[Problem] = []
    unread: list[LocalFileError] = []
    lock = threading.Lock()

    def one(session: AgentSession) -> None:
        try:
            report = sync_host(session, manifest, dst)
        except LocalFileError as exc:
            with lock:
                unread.append(exc)
            return
        except (RemoteError, OSError) as exc:
            what = exc.what if isinstance(exc, RemoteError) else str(exc)
            hint = exc.hint if isinstance(exc, RemoteError) else None
            with lock:
                problems.append(
                    Problem(
                        f"sync to {dst} failed: {what}",
                        host=session.host.display,
                        hint=hint,
                        code="sync",
                    )
                )
            return
        with lock:
            reports[session.host.key] = report

    in_parallel(sessions.values(), one)
    if unread:  # every host reads the same files: one line, about this machine
        first = min(unread, key=lambda e: str(e.path))
        raise UsageError(
            f"--sync-dst-dir: cannot read {first.path} on this machine: {first.why}; "
            "nothing was started",
            hint="make it readable, or leave it out with --sync-exclude PATTERN",
        )
    if problems:
        raise RemoteError(
            f"--sync-dst-dir failed on {len(problems)} host(s); nothing was started",
            problems=sorted(problems, key=lambda p: p.host or ""),
        )
    return [reports[s.host.key] for s in sessions.values()]
