"""The agent's PATH search against shutil.which, and what the agent's start does not import."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from dtrain.remote import procs
from dtrain.transport import bootstrap

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
    assert procs.which("prog", "bin", str(tmp_path)) == "bin/prog"
    assert procs.which("prog", "elsewhere", str(tmp_path)) is None
    assert procs.which("bin/prog", "", str(tmp_path)) == "bin/prog"  # a `/`: PATH is not asked
    assert procs.which(str(tmp_path / "bin" / "prog")) == str(tmp_path / "bin" / "prog")
    assert procs.which("prog", "", str(tmp_path / "bin")) == "prog"  # empty entry: the cwd


def test_the_agent_starts_without_the_modules_only_the_doctor_or_the_type_checker_needs() -> None:
    """typing, shutil (with bz2 and lzma), hashlib (OpenSSL) and random cost every host's
    agent start ~10 ms together: the agent imports them only where the doctor needs them."""
    python = "/usr/bin/python3" if os.path.exists("/usr/bin/python3") else sys.executable
    boot = "import sys,base64,zlib;exec(zlib.decompress(base64.b64decode(sys.argv[1])))"
    done = subprocess.run(
        [python, "-S", "-X", "importtime", "-c", boot, bootstrap._packed_boot_code()],
        input=bootstrap.agent_payload(),  # then end of stream: the agent exits
        capture_output=True,
        timeout=60,
    )
    assert done.returncode == 0, done.stderr.decode()[-2000:]
    imported = {line.rsplit("|", 1)[-1].strip() for line in done.stderr.decode().splitlines()}
    assert "selectors" in imported  # the agent did start
    assert not imported & {"typing", "shutil", "hashlib", "_hashlib", "random", "bz2", "lzma"}
