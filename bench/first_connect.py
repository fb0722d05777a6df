"""Run `dtrain` and record when it starts its first ssh connection, and what it spent by then.

Until then nothing can run on any remote host: the launcher's interpreter, its imports and its
reading of the hosts and ssh config are a serial part of every multi-host command, however
many cores the hosts have. Writes JSON to the file named by the first argument: the wall time
(`time.time()`) of the first `SshTransport.try_connect_all` call and the CPU seconds of this
process and its live children (the local agent) at that moment. Wraps only that method, at
run time; it imports paramiko (through dtrain.transport.ssh) before the command would, which
moves that part of the serial work, not its amount. Usage: first_connect.py OUT.json doctor
ARGS...
"""

import json
import os
import sys
import time
from pathlib import Path
from typing import Any


def live_cpu_s(pid: int) -> float:
    """CPU seconds of `pid` and its live descendants (utime + stime from /proc)."""
    ticks = os.sysconf("SC_CLK_TCK")
    total = 0.0
    try:
        fields = Path(f"/proc/{pid}/stat").read_text().rsplit(")", 1)[1].split()
        total += (int(fields[11]) + int(fields[12])) / ticks
        for task in os.listdir(f"/proc/{pid}/task"):
            for child in Path(f"/proc/{pid}/task/{task}/children").read_text().split():
                total += live_cpu_s(int(child))
    except (OSError, IndexError, ValueError):  # gone meanwhile
        pass
    return total


def main() -> None:
    out, argv = Path(sys.argv[1]), sys.argv[2:]
    import dtrain.cli
    from dtrain.transport import ssh

    original = ssh.SshTransport.try_connect_all
    stamp: dict[str, float] = {}

    def first(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not stamp:
            stamp.update(at=time.time(), cpu_s=live_cpu_s(os.getpid()))
            out.write_text(json.dumps(stamp))
        return original(self, *args, **kwargs)

    ssh.SshTransport.try_connect_all = first  # type: ignore[method-assign]
    dtrain.cli.main(argv)


if __name__ == "__main__":
    main()
