"""The agent's PATH search, against shutil.which."""

from __future__ import annotations

import os
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtrain.remote import procs

# What each name on a PATH entry is: absent, a file that may run, one that may not, a folder.
KINDS = st.sampled_from(["absent", "executable", "plain", "folder"])


def make(folder: Path, kind: str) -> None:
    """Make `folder/prog` of `kind` (parents included)."""
    folder.mkdir(parents=True, exist_ok=True)
    path = folder / "prog"
    if kind == "folder":
        path.mkdir()
    elif kind != "absent":
        path.write_text("#!/bin/sh\n")
        path.chmod(0o755 if kind == "executable" else 0o644)


@settings(max_examples=60, deadline=None)
@given(kinds=st.lists(KINDS, min_size=0, max_size=5), repeat=st.booleans())
def test_which_finds_what_shutil_which_finds(
    tmp_path_factory: pytest.TempPathFactory, kinds: list[str], repeat: bool
) -> None:
    root = Path(os.path.realpath(tmp_path_factory.mktemp("path")))
    folders = [root / f"d{i}" for i in range(len(kinds))]
    for folder, kind in zip(folders, kinds, strict=True):
        make(folder, kind)
    entries = [str(f) for f in folders] + ([str(folders[0])] if repeat and folders else [])
    path = os.pathsep.join(entries)
    assert procs.which("prog", path) == shutil.which("prog", path=path)


def test_which_takes_relative_entries_and_paths_from_the_given_cwd(tmp_path: Path) -> None:
    make(tmp_path / "bin", "executable")
    found = str(tmp_path / "bin" / "prog")
    assert procs.which("prog", "bin", str(tmp_path)) == found
    assert procs.which("prog", "elsewhere", str(tmp_path)) is None
    assert procs.which("bin/prog", "", str(tmp_path)) == found  # a `/`: PATH is not asked
    assert procs.which(found) == found
    assert procs.which("prog", "", str(tmp_path / "bin")) == found  # empty entry: the cwd
