"""The probe's package listing, under a real interpreter, against importlib.metadata's own view."""

from __future__ import annotations

import hashlib
import json
import os
import subprocess
import sys
import zipfile
from importlib import metadata
from pathlib import Path
from typing import Any

import pytest

from dtrain.remote import probe

# What importlib.metadata lists, first name on sys.path wins, in a fresh interpreter.
IMPORTLIB_VIEW = """
import hashlib
import json
from importlib import metadata
found = {}
for dist in metadata.distributions():
    name = dist.metadata["Name"]
    if name and name not in found:
        found[name] = dist.version
print(json.dumps(found))
"""


def test_the_listed_distributions_are_what_importlib_metadata_reports() -> None:
    found = probe.interpreter(sys.executable, os.getcwd())
    assert found.get("error") is None, found
    expected: dict[str, str] = {}
    for dist in metadata.distributions():
        name = dist.metadata["Name"]
        if name and name not in expected:
            expected[name] = dist.version
    assert found["distributions"] == expected
    assert "paramiko" in found["distributions"]


def _metadata(name: str, version: str | None, newline: str = "\n") -> str:
    lines = ["Metadata-Version: 2.1", f"Name: {name}"]
    if version is not None:
        lines.append(f"Version: {version}")
    # A long folded header and a long body: the reader must find the header's end, not a size.
    lines += ["License: " + "\n        ".join(["clause"] * 3000), "", "body " * 20000]
    return newline.join(lines)


def _layout(root: Path) -> list[Path]:
    """Two site dirs and an egg, holding every metadata shape the path finder reads."""
    first, second = root / "site-a", root / "site-b"
    (first / "good-1.0.dist-info").mkdir(parents=True)
    (first / "good-1.0.dist-info" / "METADATA").write_text(_metadata("good", "1.0"))
    (first / "Legacy-2.0.egg-info").mkdir()
    (first / "Legacy-2.0.egg-info" / "PKG-INFO").write_text(_metadata("Legacy", "2.0"))
    (first / "single-3.0-py3.11.egg-info").write_text(_metadata("single", "3.0"))
    (first / "Crlf-1.1.DIST-INFO").mkdir()
    (first / "Crlf-1.1.DIST-INFO" / "METADATA").write_bytes(
        _metadata("crlf", "1.1", "\r\n").encode()
    )
    (first / "dup-1.0.dist-info").mkdir()
    (first / "dup-1.0.dist-info" / "METADATA").write_text(_metadata("dup", "1.0"))
    (second / "dup-2.0.dist-info").mkdir(parents=True)
    (second / "dup-2.0.dist-info" / "METADATA").write_text(_metadata("dup", "2.0"))
    egg = root / "thing-4.0-py3.11.egg"
    (egg / "EGG-INFO").mkdir(parents=True)
    (egg / "EGG-INFO" / "PKG-INFO").write_text(_metadata("thing", "4.0"))
    return [first, second, egg]


def _listing(path: list[Path], cwd: Path) -> dict[str, Any]:
    """The probe's answer for this interpreter with `path` as PYTHONPATH, run in `cwd`."""
    with pytest.MonkeyPatch.context() as patch:
        patch.setenv("PYTHONPATH", os.pathsep.join(str(p) for p in path))
        found: dict[str, Any] = probe.interpreter(sys.executable, str(cwd))
    assert found.get("error") is None, found
    return found


def _both_views(path: list[Path], cwd: Path) -> tuple[dict[str, object], dict[str, str]]:
    found = _listing(path, cwd)
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(str(p) for p in path))
    out = subprocess.run(
        [sys.executable, "-c", IMPORTLIB_VIEW], env=env, cwd=cwd, capture_output=True, check=True
    ).stdout
    return found, json.loads(out)


def test_every_metadata_layout_is_read_as_importlib_metadata_reads_it(tmp_path: Path) -> None:
    path = _layout(tmp_path)
    found, expected = _both_views(path, tmp_path)
    assert found["distributions"] == expected
    listed = found["distributions"]
    assert isinstance(listed, dict)
    for name, version in [("good", "1.0"), ("Legacy", "2.0"), ("single", "3.0")]:
        assert listed[name] == version
    assert (listed["crlf"], listed["dup"], listed["thing"]) == ("1.1", "1.0", "4.0")


def test_the_working_directory_counts_as_python_c_puts_it_first(tmp_path: Path) -> None:
    (tmp_path / "here-5.0.dist-info").mkdir()
    (tmp_path / "here-5.0.dist-info" / "METADATA").write_text(_metadata("here", "5.0"))
    found, expected = _both_views([], tmp_path)
    assert found["distributions"] == expected
    assert expected["here"] == "5.0"


@pytest.mark.parametrize("odd", ["zip on sys.path", "header without a version"])
def test_a_zip_on_sys_path_and_a_header_without_a_version_are_listed_as_importlib_does(
    tmp_path: Path, odd: str
) -> None:
    path = _layout(tmp_path)
    if odd == "zip on sys.path":
        archive = tmp_path / "zipped.zip"
        with zipfile.ZipFile(archive, "w") as zipped:
            zipped.writestr("zipped-6.0.dist-info/METADATA", _metadata("zipped", "6.0"))
        path.append(archive)
    else:
        (path[0] / "bare-7.0.dist-info").mkdir()
        (path[0] / "bare-7.0.dist-info" / "METADATA").write_text(_metadata("bare", None))
    found, expected = _both_views(path, tmp_path)
    assert found["distributions"] == expected
    assert ("zipped" if odd == "zip on sys.path" else "bare") in expected


def test_metadata_importlib_cannot_read_loses_that_distribution_not_the_listing(
    tmp_path: Path,
) -> None:
    path = _layout(tmp_path)
    (path[0] / "bare-7.0.dist-info").mkdir()  # no Version: importlib.metadata decides
    (path[0] / "bare-7.0.dist-info" / "METADATA").write_text(_metadata("bare", None))
    (path[0] / "broken-8.0.dist-info").mkdir()
    (path[0] / "broken-8.0.dist-info" / "METADATA").write_bytes(b"Name: broken\xff\nVersion: 8")
    found = _listing(path, tmp_path)
    listed = found["distributions"]
    assert isinstance(listed, dict)
    assert "broken" not in listed and (listed["good"], listed["dup"]) == ("1.0", "1.0")


@pytest.mark.parametrize("kind", ["device", "fifo"])
def test_a_script_that_is_no_regular_file_is_said_so_not_read_forever(
    tmp_path: Path, kind: str
) -> None:
    """`dtrain doctor -- python /dev/zero` hashed zeros for as long as the doctor ran."""
    path = "/dev/zero"
    if kind == "fifo":  # nothing ever writes to it
        path = str(tmp_path / "fifo")
        os.mkfifo(path)
    facts_of = f"probe.file_facts('/', {path!r})"
    code = f"import json; from dtrain.remote import probe; print(json.dumps({facts_of}))"
    done = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, check=True
    )
    facts = json.loads(done.stdout)
    assert facts["sha256"] is None and facts["error"] == "not a regular file", facts


def test_a_regular_script_is_hashed_whole(tmp_path: Path) -> None:
    script = tmp_path / "train.py"
    script.write_bytes(b"x" * (3 << 20) + b"tail")
    facts = probe.file_facts(str(tmp_path), "train.py")
    assert facts["size"] == (3 << 20) + 4
    assert facts["sha256"] == hashlib.sha256(script.read_bytes()).hexdigest()
