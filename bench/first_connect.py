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


def main() -> None:
    out, argv = Path(sys.argv[1]), sys.argv[2:]
    import dtrain.cli
    from dtrain.transport import ssh

    original = ssh.SshTransport.try_connect_all
    stamp: dict[str, float] = {}

    def first(self: Any, *args: Any, **kwargs: Any) -> Any:
        if not stamp:
            stamp["at"] = time.time()
            # Imported only now, so it does not add to the serial part's wall time (its few ms
            # of CPU count as serial: the floor comes out lower, never higher, for it). The
            # bench package from the checkout; dtrain from wherever it is installed.
            sys.path.append(str(Path(__file__).resolve().parents[1]))
            from bench.hostprocs import cpu_of_live_tree

            stamp["cpu_s"] = cpu_of_live_tree(os.getpid())
            out.write_text(json.dumps(stamp))
        return original(self, *args, **kwargs)

    ssh.SshTransport.try_connect_all = first  # type: ignore[method-assign]
    dtrain.cli.main(argv)


if __name__ == "__main__":
    main()
