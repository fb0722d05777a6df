"""Run `dtrain` with a timestamp on each launch phase, to show where launch latency goes.

Wraps, at run time and without changing dtrain, the steps `Launch.run` takes in order, and
writes their start and end (seconds since this interpreter began running Python code) as JSON
to the file named by the first argument. Usage: timeline.py OUT.json launch ARGS...
"""

import time

T0 = time.time()

import atexit  # noqa: E402 - T0 must be taken first
import functools  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable  # noqa: E402
from pathlib import Path  # noqa: E402
from typing import Any  # noqa: E402

Namer = str | Callable[[tuple[Any, ...]], str]


# Launch steps (from the launcher's phase records) the timeline shows, under its own names.
PHASES = {
    "tasks checked on every host": "launch request (check tasks)",
    "log dir and job.json": "log dir",
}


def listen_for_phases(lifecycle: Any, mark: Callable[[str, float, float], None]) -> None:
    """Mark each launch step the launcher logs a phase record for (no monkeypatching)."""

    class PhaseHandler(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            step = getattr(record, lifecycle.PHASE_RECORD, None)
            if step is not None and step[0] in PHASES:
                mark(PHASES[step[0]], step[1], step[2])

    log = logging.getLogger(lifecycle.__name__)
    log.setLevel(logging.DEBUG)
    log.propagate = False  # the records are ours; the console shows them only with --debug
    log.addHandler(PhaseHandler())


def main() -> None:
    out, argv = Path(sys.argv[1]), sys.argv[2:]
    events: list[dict[str, Any]] = []

    def mark(name: str, start: float, end: float) -> None:
        events.append({"phase": name, "start_s": start - T0, "end_s": end - T0})

    started = time.time()
    import dtrain.cli

    mark("import dtrain (click, dtrain.cli)", started, time.time())
    started = time.time()
    import dtrain.transport.ssh

    mark("import paramiko (dtrain.transport.ssh)", started, time.time())
    from dtrain.agents import group, ops
    from dtrain.launch import lifecycle, supervise
    from dtrain.plan import planner

    def wrap(owner: Any, attr: str, name: Namer) -> None:
        original = getattr(owner, attr)

        @functools.wraps(original)
        def timed(*args: Any, **kwargs: Any) -> Any:
            begin = time.time()
            try:
                return original(*args, **kwargs)
            finally:
                mark(name if isinstance(name, str) else name(args), begin, time.time())

        setattr(owner, attr, timed)

    wrap(
        dtrain.transport.ssh.SshTransport,
        "try_connect_all",
        "ssh connect+auth and agents, all hosts (pool)",
    )
    wrap(group.AgentGroup, "open", "connect + open agent channels")
    wrap(lifecycle, "gather_facts", "agents boot and answer hello")
    wrap(planner, "plan_job", "plan")
    listen_for_phases(lifecycle, mark)
    for op, wire in (("hello", "hello"), ("stage", "launch"), ("start", "start")):
        wrap(ops, op, f"request {wire!r} on all hosts")
    wrap(supervise.Supervisor, "run", "supervise until every task ended")
    atexit.register(lambda: out.write_text(json.dumps({"t0": T0, "events": events})))
    dtrain.cli.main(argv)


if __name__ == "__main__":
    main()
