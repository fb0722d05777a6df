"""Run `dtrain` with a timestamp on each launch phase, to show where launch latency goes.

Wraps, at run time and without changing dtrain, the steps `Launch.run` takes in order, and
writes their start and end (seconds since this interpreter began running Python code) as JSON
to the file named by the first argument. Usage: timeline.py OUT.json launch ARGS...

The modules load as the `dtrain` program loads them (the record methods' cache first, paramiko
only where the launch imports it, while its connections are dialled): the modules loaded
later are stamped, and their steps wrapped, as they are imported.
"""

import time

T0 = time.time()

import atexit  # noqa: E402 - T0 must be taken first
import functools  # noqa: E402
import importlib.machinery  # noqa: E402
import json  # noqa: E402
import logging  # noqa: E402
import sys  # noqa: E402
from collections.abc import Callable, Sequence  # noqa: E402
from pathlib import Path  # noqa: E402
from types import ModuleType  # noqa: E402
from typing import Any  # noqa: E402

Namer = str | Callable[[tuple[Any, ...]], str]
Mark = Callable[[str, float, float], None]

# Launch steps (from the launcher's phase records) the timeline shows, under its own names.
PHASES = {
    "tasks checked on every host": "launch request (check tasks)",
    "log dir and job.json": "log dir",
}
POOL = "ssh connect+auth and agents, all hosts (pool)"
PARAMIKO = "import paramiko (dtrain.transport.sshlib)"
DIAL = "TCP connect, dialled ahead (each host)"
# (module, object in it or "", attribute, step name): each step the timeline wraps
STEPS = (
    ("dtrain.transport.dial", "", "dial", DIAL),
    ("dtrain.transport.ssh", "SshTransport", "try_connect_all", POOL),
    ("dtrain.agents.group", "AgentGroup", "open", "connect + open agent channels"),
    ("dtrain.launch.lifecycle", "", "gather_facts", "agents boot and answer hello"),
    ("dtrain.plan.planner", "", "plan_job", "plan"),
    ("dtrain.agents.ops", "", "hello", "request 'hello' on all hosts"),
    ("dtrain.agents.ops", "", "stage", "request 'launch' on all hosts"),
    ("dtrain.agents.ops", "", "start", "request 'start' on all hosts"),
    ("dtrain.launch.supervise", "Supervisor", "run", "supervise until every task ended"),
)


def listen_for_phases(lifecycle: Any, mark: Mark) -> None:
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


def wrapper(mark: Mark) -> Callable[[Any, str, Namer], None]:
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

    return wrap


class OnImport:
    """Stamps the import of each module named in `stamp`, and calls each of `then[name]`
    with the module once it is loaded: steps of modules the launch imports late are wrapped
    in time. A finder by its `find_spec` alone: importlib.abc would load modules dtrain does
    not (tempfile, random: ~6 ms) before the launch starts."""

    def __init__(
        self,
        mark: Mark,
        stamp: dict[str, str],
        then: dict[str, list[Callable[[ModuleType], None]]],
    ) -> None:
        self.mark, self.stamp, self.then = mark, stamp, then

    def find_spec(
        self, fullname: str, path: Sequence[str] | None, target: ModuleType | None = None
    ) -> importlib.machinery.ModuleSpec | None:
        if fullname not in self.stamp and fullname not in self.then:
            return None
        spec = importlib.machinery.PathFinder.find_spec(fullname, path, target)
        loader = None if spec is None else spec.loader
        if loader is None or not hasattr(loader, "exec_module"):
            return spec
        run = loader.exec_module

        def exec_module(module: ModuleType) -> None:
            begin = time.time()
            run(module)
            if fullname in self.stamp:
                self.mark(self.stamp[fullname], begin, time.time())
            for then in self.then.get(fullname, ()):
                then(module)

        loader.exec_module = exec_module  # type: ignore[method-assign]
        return spec


def main() -> None:
    out, argv = Path(sys.argv[1]), sys.argv[2:]
    events: list[dict[str, Any]] = []

    def mark(name: str, start: float, end: float) -> None:
        events.append({"phase": name, "start_s": start - T0, "end_s": end - T0})

    wrap = wrapper(mark)
    later: dict[str, list[Callable[[ModuleType], None]]] = {}

    def step(module: str, owner: str, attr: str, name: str) -> None:
        """Wrap `module.owner.attr` now if the module is loaded, else once it is."""

        def apply(loaded: ModuleType) -> None:
            wrap(getattr(loaded, owner) if owner else loaded, attr, name)

        if module in sys.modules:
            apply(sys.modules[module])
        else:
            later.setdefault(module, []).append(apply)

    sys.meta_path.insert(0, OnImport(mark, {"dtrain.transport.sshlib": PARAMIKO}, later))
    started = time.time()
    import dtrain.cli

    mark("import dtrain (click, dtrain.cli)", started, time.time())
    for args in STEPS:
        step(*args)
    from dtrain.launch import lifecycle

    listen_for_phases(lifecycle, mark)
    atexit.register(lambda: out.write_text(json.dumps({"t0": T0, "events": events})))
    dtrain.cli.main(argv)


if __name__ == "__main__":
    main()
