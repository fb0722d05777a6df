"""`--sync-dst-dir`'s copy, through a real local agent (the cluster tests cover ssh)."""

from __future__ import annotations

import os
import queue
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest

from dtrain.agents.session import AgentSession
from dtrain.errors import RemoteError, UsageError
from dtrain.launch.sync import build_manifest, sync_all, sync_host
from dtrain.plan.hosts import local_host
from dtrain.transport.local import LocalLink


@pytest.fixture
def session() -> Iterator[AgentSession]:
    events: queue.SimpleQueue[Any] = queue.SimpleQueue()
    s = AgentSession(local_host("here"), LocalLink(), events)
    yield s
    s.close()


def make_tree(root: Path) -> None:
    (root / "pkg" / "sub").mkdir(parents=True)
    (root / "train.py").write_text("print('hi')\n")
    (root / "pkg" / "__init__.py").write_text("")
    (root / "pkg" / "sub" / "data.bin").write_bytes(os.urandom(3_000_000))
    (root / "run.sh").write_text("#!/bin/sh\necho run\n")
    (root / "run.sh").chmod(0o755)
    (root / "link.py").symlink_to("train.py")
    (root / "empty").mkdir()
    (root / "__pycache__").mkdir()
    (root / "__pycache__" / "x.pyc").write_bytes(b"junk")
    (root / "dtrain-logs").mkdir()


def test_copies_the_tree_then_only_what_changed(tmp_path: Path, session: AgentSession) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    make_tree(src)
    manifest = build_manifest(src)
    assert {f[0] for f in manifest.files} == {
        "train.py",
        "pkg/__init__.py",
        "pkg/sub/data.bin",
        "run.sh",
    }
    first = sync_host(session, manifest, str(dst))
    assert first.files_sent == 4 and first.unchanged == 0
    for rel in ("train.py", "pkg/sub/data.bin", "run.sh"):
        assert (dst / rel).read_bytes() == (src / rel).read_bytes()
        assert (dst / rel).stat().st_mtime_ns == (src / rel).stat().st_mtime_ns
    assert os.access(dst / "run.sh", os.X_OK)
    assert os.readlink(dst / "link.py") == "train.py"
    assert (dst / "empty").is_dir()
    assert not (dst / "__pycache__").exists() and not (dst / "dtrain-logs").exists()

    (src / "train.py").write_text("print('changed')\n")
    second = sync_host(session, build_manifest(src), str(dst))
    assert second.files_sent == 1 and second.unchanged == 3
    assert (dst / "train.py").read_text() == "print('changed')\n"


def test_an_unwritable_destination_names_the_host(tmp_path: Path, session: AgentSession) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("x")
    blocker = tmp_path / "file"
    blocker.write_text("not a dir")
    with pytest.raises(RemoteError) as caught:
        sync_all({"here": session}, build_manifest(src), str(blocker / "dst"))
    text = str(caught.value)
    assert "--sync-dst-dir failed on 1 host(s); nothing was started" in text
    assert "here: sync to" in text and "Not a directory" in text


def leftovers(root: Path) -> list[str]:
    return sorted(str(p.relative_to(root)) for p in root.rglob("*.tmp"))


def test_a_file_that_cannot_be_read_here_is_blamed_on_this_machine_and_leaves_no_tmp_file(
    tmp_path: Path, session: AgentSession
) -> None:
    src, dst = tmp_path / "src", tmp_path / "dst"
    src.mkdir()
    (src / "a.bin").write_bytes(os.urandom(3_000_000))
    (src / "b.py").write_text("print('b')\n")
    manifest = build_manifest(src)
    (src / "b.py").unlink()  # gone after the manifest: a.bin is sent, then b.py cannot be read
    with pytest.raises(UsageError) as caught:
        sync_all({"here": session}, manifest, str(dst))
    text = str(caught.value)
    assert f"cannot read {src / 'b.py'} on this machine: No such file or directory" in text
    assert "failed on 1 host(s)" not in text and "here: sync to" not in text
    session.close()  # as the launch does after any error: the agent sees its stream end
    assert (dst / "a.bin").read_bytes() == (src / "a.bin").read_bytes()
    assert leftovers(dst) == []  # b.py's half-made file went with the agent


def test_a_file_where_the_destination_should_be_is_refused_before_anything_is_made(
    tmp_path: Path, session: AgentSession
) -> None:
    src = tmp_path / "src"
    src.mkdir()
    (src / "a.py").write_text("x")
    (tmp_path / "file").write_text("in the way")
    with pytest.raises(RemoteError) as caught:
        sync_all({"here": session}, build_manifest(src), str(tmp_path / "file" / "deeper" / "dst"))
    assert f"Not a directory: {tmp_path / 'file'}" in str(caught.value)
