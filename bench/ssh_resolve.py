"""What resolving hosts through OpenSSH (`ssh -G`, in parallel) costs a launch, per host count.

No connection is made: `ssh -G` only reads the config. The config has an Include of a directory
glob, a wildcard block and a Match exec, like a real one. Run: python -m bench.ssh_resolve
"""

from __future__ import annotations

import statistics
import tempfile
import time
from pathlib import Path

from dtrain.plan.hosts import Host
from dtrain.transport.options import SshOptions
from dtrain.transport.ssh import SshTransport

REPEATS = 5


def write_config(root: Path, hosts: int) -> Path:
    confd = root / "conf.d"
    confd.mkdir(exist_ok=True)
    for i in range(hosts):
        (confd / f"n{i}.conf").write_text(f"Host n{i}\n  HostName 198.18.0.{10 + i % 200}\n")
    config = root / "config"
    config.write_text(
        f"Include {confd}/*.conf\nHost n*\n  User root\n  IdentityFile ~/.ssh/id_%r\n"
        'Match host 198.18.0.* exec "true"\n  Port 22\n'
    )
    return config


def measure(hosts: int) -> float:
    """Median seconds to resolve `hosts` hosts with a fresh transport (nothing cached)."""
    with tempfile.TemporaryDirectory() as tmp:
        config = write_config(Path(tmp), hosts)
        names = [Host(name=f"n{i}") for i in range(hosts)]
        runs = []
        for _ in range(REPEATS):
            transport = SshTransport(SshOptions(config_file=str(config)))
            started = time.monotonic()
            transport.distinct_targets(names)
            runs.append(time.monotonic() - started)
        return statistics.median(runs)


def main() -> None:
    for hosts in (8, 64):
        total = measure(hosts)
        print(f"{hosts:3d} hosts: {total * 1000:7.1f} ms ({total * 1000 / hosts:.1f} ms a host)")


if __name__ == "__main__":
    main()
