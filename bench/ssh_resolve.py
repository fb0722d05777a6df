"""What resolving hosts through OpenSSH (`ssh -G`, in parallel) costs a launch, per host count.

No connection is made: `ssh -G` only reads the config. The config has an Include of a directory
glob and a wildcard block, like a real one; run once as it is (its answers are kept between runs:
the first run asks OpenSSH, the later ones read what it answered) and once with a `Match exec`
(asked every run). The answers go to a temporary cache folder. Run: python -m bench.ssh_resolve
"""

from __future__ import annotations

import os
import resource
import statistics
import tempfile
import time
from pathlib import Path

from dtrain.plan.hosts import Host
from dtrain.transport.options import SshOptions
from dtrain.transport.ssh import SshTransport

REPEATS = 5


def write_config(root: Path, hosts: int, match_exec: bool) -> Path:
    confd = root / "conf.d"
    confd.mkdir(exist_ok=True)
    for i in range(hosts):
        (confd / f"n{i}.conf").write_text(f"Host n{i}\n  HostName 198.18.0.{10 + i % 200}\n")
    config = root / "config"
    text = f"Include {confd}/*.conf\nHost n*\n  User root\n  IdentityFile ~/.ssh/id_%r\n"
    if match_exec:
        text += 'Match host 198.18.0.* exec "true"\n  Port 22\n'
    config.write_text(text)
    return config


def cpu_s() -> float:
    """CPU of this process and the `ssh -G` processes it waited for."""
    own = resource.getrusage(resource.RUSAGE_SELF)
    children = resource.getrusage(resource.RUSAGE_CHILDREN)
    return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime


def measure(hosts: int, match_exec: bool) -> tuple[float, float, float]:
    """(the first run's seconds, the later runs' median seconds, their median CPU seconds) to
    resolve `hosts` hosts with a fresh transport each run."""
    with tempfile.TemporaryDirectory() as tmp:
        os.environ["XDG_CACHE_HOME"] = str(Path(tmp) / "cache")
        config = write_config(Path(tmp), hosts, match_exec)
        names = [Host(name=f"n{i}") for i in range(hosts)]
        runs, cpu = [], []
        for _ in range(REPEATS + 1):
            transport = SshTransport(SshOptions(config_file=str(config)))
            started, used = time.monotonic(), cpu_s()
            transport.distinct_targets(names)
            runs.append(time.monotonic() - started)
            cpu.append(cpu_s() - used)
        return runs[0], statistics.median(runs[1:]), statistics.median(cpu[1:])


def main() -> None:
    for match_exec in (False, True):
        print("with a Match exec (never kept):" if match_exec else "answers kept between runs:")
        for hosts in (8, 64):
            first, later, cpu = measure(hosts, match_exec)
            print(
                f"  {hosts:3d} hosts: first run {first * 1000:7.1f} ms, later runs "
                f"{later * 1000:7.1f} ms ({later * 1000 / hosts:.2f} ms a host, "
                f"{cpu * 1000 / hosts:.2f} ms of CPU)"
            )


if __name__ == "__main__":
    main()
