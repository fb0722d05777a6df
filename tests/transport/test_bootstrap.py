"""The agent's boot code under a real python, and the payload it reads."""

from __future__ import annotations

import json
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
    cache_home: Path, flags: tuple[str, ...] = (), home: Path | None = None
) -> subprocess.CompletedProcess[bytes]:
    """Start the agent as the remote command does, send it its code, close its stdin: it exits."""
    env = {**os.environ, "XDG_CACHE_HOME": str(cache_home)}
    if home is not None:
        env["HOME"] = str(home)
    return subprocess.run(
        [sys.executable, "-S", *flags, "-c", boot_code()],
        input=agent_payload(),
        capture_output=True,
        env=env,
        timeout=60,
        check=False,
    )


def test_the_agent_boots_from_its_source_and_writes_nothing_on_the_host(tmp_path: Path) -> None:
    """No compiled agent kept in the host's home (shared NFS homes among them): the agent's
    source is sent and run as it is, at every start."""
    home = tmp_path / "home"
    home.mkdir()
    for _ in range(2):
        result = boot(tmp_path / "cache", flags=("-X", "importtime"), home=home)
        assert result.returncode == 0, result.stderr.decode()[-2000:]
        assert "socket" in imported_by(result.stderr.decode())  # the agent did start
    assert not (tmp_path / "cache").exists()
    assert list(home.iterdir()) == []


def test_the_remote_command_starts_python_without_site_packages() -> None:
    assert '"$p" -S -c' in remote_command()


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
