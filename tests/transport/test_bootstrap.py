"""The agent's boot code under a real python: its compiled-code cache and the ways it falls back."""

from __future__ import annotations

import hashlib
import json
import marshal
import os
import subprocess
import sys
import threading
import time
from pathlib import Path
from typing import Any

import pytest

from dtrain.transport import bootstrap
from dtrain.transport.bootstrap import agent_payload, boot_code, remote_command
from tests.conftest import imported_by


def boot(
    cache_home: Path, python: str = sys.executable, flags: tuple[str, ...] = ()
) -> subprocess.CompletedProcess[bytes]:
    """Start the agent as the remote command does, send it its code, close its stdin: it exits."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    return subprocess.run(
        [python, "-S", *flags, "-c", boot_code()],
        input=agent_payload(),
        capture_output=True,
        env=env,
        timeout=60,
        check=False,
    )


def cached_files(cache_home: Path) -> list[Path]:
    return sorted((cache_home / "dtrain").glob("agent-*.bin"))


def plant(path: Path) -> None:
    """A cache file, with a valid digest, whose agent only says where it came from."""
    source = "import sys\ndef main():\n    sys.stdout.write('from cache')\n"
    data = marshal.dumps([("agent", compile(source, "agent.py", "exec"))])
    path.write_bytes(hashlib.sha256(data).digest() + data)


def test_first_boot_writes_a_private_cache_and_the_next_uses_it(tmp_path: Path) -> None:
    assert boot(tmp_path).returncode == 0
    (found,) = cached_files(tmp_path)
    assert (tmp_path / "dtrain").stat().st_mode & 0o777 == 0o700
    assert found.stat().st_mode & 0o777 == 0o600
    # Replace the cached agent by one that says so: the next boot runs what the cache holds.
    plant(found)
    result = boot(tmp_path)
    assert (result.returncode, result.stdout) == (0, b"from cache")


def test_a_torn_or_altered_cache_file_is_ignored_and_rewritten(tmp_path: Path) -> None:
    assert boot(tmp_path).returncode == 0
    (found,) = cached_files(tmp_path)
    good = found.read_bytes()
    found.write_bytes(good[:-100])
    result = boot(tmp_path)
    assert result.returncode == 0, result.stderr
    assert found.read_bytes() == good


def test_a_cache_others_may_write_is_not_used(tmp_path: Path) -> None:
    assert boot(tmp_path).returncode == 0
    (found,) = cached_files(tmp_path)
    plant(found)
    (tmp_path / "dtrain").chmod(0o777)
    result = boot(tmp_path)
    assert (result.returncode, result.stdout) == (0, b"")
    (tmp_path / "dtrain").chmod(0o700)
    found.chmod(0o666)
    result = boot(tmp_path)
    assert (result.returncode, result.stdout) == (0, b"")


def test_an_unusable_cache_folder_still_boots(tmp_path: Path) -> None:
    (tmp_path / "dtrain").write_text("not a folder")
    result = boot(tmp_path)
    assert result.returncode == 0, result.stderr
    assert not cached_files(tmp_path)


def test_the_remote_command_starts_python_without_site_packages() -> None:
    assert '"$p" -S -c' in remote_command()


def test_the_agent_starts_without_what_only_the_doctor_or_the_type_checker_imports(
    tmp_path: Path,
) -> None:
    """typing, shutil (with bz2 and lzma), hashlib (OpenSSL) and random cost every host's
    agent start ~10 ms together: the agent imports them where the doctor uses them."""
    for _ in range(2):  # compiling the agent, then loading it from the cache
        result = boot(tmp_path, flags=("-X", "importtime"))
        assert result.returncode == 0, result.stderr.decode()[-2000:]
        imported = imported_by(result.stderr.decode())
        assert "_socket" in imported  # the agent did start
        assert not imported & {"typing", "shutil", "hashlib", "_hashlib", "random", "bz2", "lzma"}


def test_hosts_connecting_at_once_build_the_agents_payload_once(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """Each host's connection thread asks for the payload as it connects; one builds it."""
    expected = agent_payload()
    real_dumps = json.dumps

    def slow_dumps(obj: Any) -> str:
        time.sleep(0.05)  # every thread arrives while the first is still building
        return real_dumps(obj)

    monkeypatch.setattr(json, "dumps", slow_dumps)  # the json module bootstrap uses
    bootstrap._build_payload.cache_clear()
    start = threading.Barrier(8)
    got: list[bytes] = []

    def connect() -> None:
        start.wait()
        got.append(agent_payload())

    threads = [threading.Thread(target=connect) for _ in range(8)]
    for thread in threads:
        thread.start()
    for thread in threads:
        thread.join(timeout=30)
    assert got == [expected] * 8
    assert bootstrap._build_payload.cache_info().misses == 1
