"""`python -m bench`: dtrain against pdsh, ssh per task and the dmlc tracker on real sshd hosts.

Brings up the namespaced sshd test cluster (tests/cluster/netcluster.py) itself, runs every
launcher on the same hosts in the same session, interleaved (the launcher order rotates with
each repetition), tears the cluster down, and writes docs/benchmarks.md and its plot. Only
ratios between launchers measured side by side mean anything on a shared 2-core machine.

The cluster is held in short sessions (one per group of measurements and bashrc mode), and
released in between, so other users of the machine-wide cluster lock are not starved.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import logging
import os
import platform
import resource
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable, Iterator, Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

REPO = Path(__file__).resolve().parent.parent
if str(REPO) not in sys.path:
    sys.path.insert(0, str(REPO))  # tests.cluster.netcluster lives in the repo, not the package

from bench import calibrate, launchers, profile, report, scenarios  # noqa: E402

PEERS = ("pdsh", "ssh", "tracker")
LAUNCHERS = ("dtrain", *PEERS)
BASHRC_MODES = ("as-is", "blank")
LOCK_BREATHER_S = 1.0  # between cluster sessions: lets a waiting user of the lock in

logger = logging.getLogger("bench")


@dataclass(frozen=True)
class Settings:
    """What one run measures; `--quick` and the full run differ only in these numbers."""

    host_counts: tuple[int, ...] = (1, 2, 4, 8)
    per_host: tuple[int, ...] = (1, 4)
    reps: int = 4
    # up to 4 hosts dtrain and pdsh are within a few percent, where 4 runs' median moves by
    # more than that from run to run (x1.01 to x1.14 at 1x1 in three runs; x0.85 and x1.03 at
    # 4x1): more runs there, where each costs a fraction of a second, enough for the run-by-run
    # ratio's 95% interval (bench/stats.py: 16 runs put it between the 4th and the 13th)
    small_reps: int = 16
    small_hosts: int = 4
    teardown_reps: int = 3
    log_reps: int = 3
    log_mb_per_host: float = 40.0  # split over the host's tasks: 40 MB, or 4 x 10 MB
    log_headline_only: bool = False  # else the smallest and largest host counts
    peers_at_headline_only: bool = False  # their teardown (never) at every host count, or one
    one_session: bool = False  # hold the cluster once per bashrc mode (short runs only)
    signal_reps: int = 1
    teardown_bound_s: float = 5.0
    orphan_window_s: float = 5.0
    calibration_reps: int = 5
    local_reps: int = 10
    doctor_reps: int = 6
    profile: bool = True
    step_reps: int = 8  # launches of each at 1x1, every step stamped: dtrain, floor, pdsh
    bashrc_modes: tuple[str, ...] = BASHRC_MODES
    scale_hosts: tuple[int, ...] = (8, 16, 32, 48)  # x the largest per_host, against the peers
    scale_reps: int = 2
    scale_modes: tuple[str, ...] = ("blank",)

    def reps_at(self, hosts: int) -> int:
        """The trivial job's repetitions at this host count."""
        return max(self.reps, self.small_reps) if hosts <= self.small_hosts else self.reps

    @property
    def max_hosts(self) -> int:
        return max(self.host_counts)

    @property
    def headline(self) -> tuple[int, int]:
        return (max(self.host_counts), max(self.per_host))

    @property
    def configs(self) -> list[tuple[int, int]]:
        return [(h, k) for k in self.per_host for h in self.host_counts]

    @property
    def log_configs(self) -> list[tuple[int, int]]:
        if self.log_headline_only:
            return [self.headline]
        ends = sorted({min(self.host_counts), max(self.host_counts)})
        return [(h, k) for k in self.per_host for h in ends]


QUICK = Settings(
    host_counts=(1, 4),
    per_host=(4,),
    reps=1,
    small_reps=1,
    teardown_reps=1,
    log_reps=1,
    log_mb_per_host=16.0,
    log_headline_only=True,
    peers_at_headline_only=True,
    one_session=True,
    signal_reps=1,
    teardown_bound_s=2.0,
    orphan_window_s=5.0,
    calibration_reps=2,
    local_reps=3,
    doctor_reps=1,
    profile=False,
    bashrc_modes=("as-is",),
    scale_hosts=(),
)


# ---- recording ------------------------------------------------------------------------------


class Results:
    """Records appended to records.jsonl as they come, so a crash keeps what was measured."""

    def __init__(self, folder: Path) -> None:
        self.folder = folder
        folder.mkdir(parents=True, exist_ok=True)
        self.path = folder / "records.jsonl"
        self.path.write_text("")

    def add(self, record: dict[str, Any]) -> None:
        with self.path.open("a") as out:
            out.write(json.dumps(record) + "\n")
        say(describe(record))

    def meta(self, data: dict[str, Any]) -> None:
        (self.folder / "meta.json").write_text(json.dumps(data, indent=2))


def say(text: str) -> None:
    print(f"bench: {text}", file=sys.stderr, flush=True)


def describe(record: dict[str, Any]) -> str:
    """One progress line per record."""
    parts = [
        f"[{record.get('bashrc', 'local')}]",
        record.get("scenario", "?"),
        f"{record.get('hosts', '')}x{record.get('per_host', '')}",
        record.get("launcher", ""),
    ]
    for key in ("launch_s", "e2e_s", "teardown_s", "gone_s", "orphans", "exit_code", "wall_s"):
        if key in record:
            value = record[key]
            parts.append(f"{key}={value:.3f}" if isinstance(value, float) else f"{key}={value}")
    if not record.get("ok", True):
        parts.append(f"FAILED: {'; '.join(record.get('errors', []))}")
    return " ".join(str(p) for p in parts)


# ---- the cluster ----------------------------------------------------------------------------


@contextlib.contextmanager
def cluster_session(
    settings: Settings, bashrc: str, scratch: Path, n_hosts: int | None = None
) -> Iterator[scenarios.Context]:
    """A fresh cluster with the bashrc mode applied; always torn down."""
    from tests.cluster.netcluster import Cluster

    cluster = Cluster(n_hosts or settings.max_hosts)
    cluster.start()  # waits (bounded) for the machine-wide cluster lock
    started = time.monotonic()
    try:
        if bashrc == "blank":
            for host in cluster.hosts:
                cluster.blank_bashrc(host)
        folder = Path(tempfile.mkdtemp(prefix="s-", dir=scratch))
        setup = launchers.Setup(ssh_config=cluster.ssh_config, scratch=folder)
        hosts = tuple(h.name for h in cluster.hosts)
        say(f"cluster {cluster.prefix} up ({len(hosts)} hosts, bashrc {bashrc})")
        yield scenarios.Context(cluster=cluster, setup=setup, bashrc=bashrc, hosts=hosts)
    finally:
        cluster.stop()
        say(f"cluster down after {time.monotonic() - started:.0f}s")
        time.sleep(LOCK_BREATHER_S)


# ---- the phases -----------------------------------------------------------------------------


def phase_launch(ctx: scenarios.Context, settings: Settings, results: Results) -> None:
    """Calibration, then the first half of the trivial-job repetitions."""
    costs = calibrate.per_connection(ctx.hosts, ctx.setup.ssh_config, settings.calibration_reps)
    results.add({"scenario": "calibration", "bashrc": ctx.bashrc, **jsonable(costs)})
    trivial_jobs(ctx, settings, results, first_half=True)


def phase_launch_more(ctx: scenarios.Context, settings: Settings, results: Results) -> None:
    """The other half of the trivial-job repetitions (a separate cluster session, so the
    cluster lock is released in between), then the timeline and the profile."""
    trivial_jobs(ctx, settings, results, first_half=False)
    hosts, per_host = settings.headline
    for rep in range(settings.reps):  # a candidate fix, measured beside what it would change
        for launcher in scenarios.rotated(["dtrain", "dtrain-pathpy", "pdsh"], rep):
            record = scenarios.job(ctx, launcher, hosts, per_host, "trivial", rep)
            results.add({**record, "scenario": "variant"})
    if settings.profile:
        hosts, per_host = settings.headline
        results.add(profile.timeline(ctx, hosts, per_host))
        results.add(profile.sampled(ctx, hosts, per_host))
        for record in profile.steps(ctx, 1, 1, settings.step_reps):
            results.add(record)


def trivial_jobs(
    ctx: scenarios.Context, settings: Settings, results: Results, first_half: bool
) -> None:
    """The trivial job (launch latency, end to end, CPU, RSS): every launcher and the Python
    floor, interleaved; the first or the second half of each size's repetitions."""
    most = max(settings.reps_at(hosts) for hosts, _ in settings.configs)
    for rep in range(most):
        for hosts, per_host in settings.configs:
            count = settings.reps_at(hosts)
            if rep >= count or (rep < (count + 1) // 2) != first_half:
                continue
            for launcher in scenarios.rotated(
                [*LAUNCHERS, launchers.FLOOR], rep + hosts + per_host
            ):
                results.add(scenarios.job(ctx, launcher, hosts, per_host, "trivial", rep))


def phase_teardown(ctx: scenarios.Context, settings: Settings, results: Results) -> None:
    """dtrain's teardown, repeated; the peers once per host count (they never tear down)."""
    bound = settings.teardown_bound_s
    for rep in range(settings.teardown_reps):
        for hosts, per_host in settings.configs:
            run = scenarios.Run(ctx, "dtrain", hosts, per_host, "teardown", rep)
            for record in scenarios.teardown([run], bound):
                results.add(record)
    peer_hosts = settings.host_counts
    if settings.peers_at_headline_only:
        peer_hosts = (settings.max_hosts,)
    for hosts in peer_hosts:
        per_host = max(settings.per_host)
        runs = [scenarios.Run(ctx, p, hosts, per_host, "teardown", 0) for p in PEERS]
        for record in scenarios.teardown(runs, bound):
            results.add(record)


def phase_signals(ctx: scenarios.Context, settings: Settings, results: Results) -> None:
    """Orphans after SIGINT and SIGKILL: all launchers at once at the headline size, counted
    after the window; then dtrain alone at every size, for its time to clean every host."""
    hosts, per_host = settings.headline
    window = settings.orphan_window_s
    for signum in (signal.SIGINT, signal.SIGKILL):
        scenario = "sigint" if signum == signal.SIGINT else "sigkill"
        runs = [scenarios.Run(ctx, name, hosts, per_host, scenario, 0) for name in LAUNCHERS]
        for record in scenarios.interrupt(runs, signum, window):
            results.add({**record, "group": "all"})
    for rep in range(settings.signal_reps):
        for hosts, per_host in settings.configs:
            for signum in (signal.SIGINT, signal.SIGKILL):
                scenario = "sigint" if signum == signal.SIGINT else "sigkill"
                run = scenarios.Run(ctx, "dtrain", hosts, per_host, scenario, rep + 1)
                for record in scenarios.interrupt([run], signum, window):
                    results.add({**record, "group": "alone"})


def phase_log(ctx: scenarios.Context, settings: Settings, results: Results) -> None:
    """Log throughput: each host's tasks write log_mb_per_host MB of lines between them (more
    than the relays buffer, so the stream, not the start, is timed); the launcher's stdout is
    a file. Shapes with more hosts than one also run as two dtrain launchers of half the
    hosts each, started together (is one interpreter what holds the relay back?). With
    profiling, py-spy then watches dtrain stream one host's output."""
    for rep in range(settings.log_reps):
        for hosts, per_host in settings.log_configs:
            megabytes = settings.log_mb_per_host / per_host
            # the same hosts, two launchers at once
            split = (launchers.SPLIT,) if hosts >= 2 else ()
            for launcher in scenarios.rotated([*LAUNCHERS, *split], rep + hosts):
                if launcher == launchers.SPLIT:
                    record = scenarios.split_log(ctx, 2, hosts, per_host, rep, megabytes)
                else:
                    record = scenarios.job(
                        ctx, launcher, hosts, per_host, "log", rep, megabytes=megabytes
                    )
                results.add(record)
    if settings.profile:
        megabytes = settings.log_mb_per_host * 2.5  # long enough to sample the stream itself
        results.add(profile.sampled(ctx, 1, 1, scenario="log", megabytes=megabytes))


SCALE_LAUNCHERS = ("dtrain", "pdsh", "ssh")


def phase_scale(ctx: scenarios.Context, settings: Settings, results: Results) -> None:
    """dtrain, pdsh (-f at least the host count) and ssh per task at every scale size: the
    trivial job (launch, launcher CPU and RSS, host CPU), teardown after one failure (dtrain
    alone, then the peers together) and orphans after SIGKILL (all at once)."""
    per_host = max(settings.per_host)
    for rep in range(settings.scale_reps):
        for hosts in settings.scale_hosts:
            for launcher in scenarios.rotated(SCALE_LAUNCHERS, rep + hosts):
                record = scenarios.job(ctx, launcher, hosts, per_host, "trivial", rep)
                results.add({**record, "group": "scale"})
    for hosts in settings.scale_hosts:
        solo = [scenarios.Run(ctx, "dtrain", hosts, per_host, "teardown", 0)]
        peers = [scenarios.Run(ctx, p, hosts, per_host, "teardown", 0) for p in SCALE_LAUNCHERS[1:]]
        for runs in (solo, peers):
            for record in scenarios.teardown(runs, settings.teardown_bound_s):
                results.add({**record, "group": "scale"})
        runs = [scenarios.Run(ctx, x, hosts, per_host, "sigkill", 0) for x in SCALE_LAUNCHERS]
        for record in scenarios.interrupt(runs, signal.SIGKILL, settings.orphan_window_s):
            results.add({**record, "group": "scale"})


def doctor_available() -> bool:
    """`dtrain doctor` is being built elsewhere; measured as soon as `doctor --help` works."""
    result = subprocess.run(
        [str(launchers.VENV_BIN / "dtrain"), "doctor", "--help"],
        capture_output=True,
        text=True,
        timeout=30,
        check=False,
    )
    return result.returncode == 0 and "--ssh-config" in result.stdout


def phase_doctor(ctx: scenarios.Context, settings: Settings, results: Results) -> None:
    """`dtrain doctor` wall time against host count (the hook waits for the command to exist)."""
    if not doctor_available():
        results.add({"scenario": "doctor", "bashrc": ctx.bashrc, "available": False})
        return
    for rep in range(settings.doctor_reps):
        for hosts in settings.host_counts:
            job = launchers.Job(ctx.hosts[:hosts], 1, ())
            hosts_file = ctx.setup.hosts_file(job, with_slots=False)
            argv = [str(launchers.VENV_BIN / "dtrain"), "doctor", "-H", str(hosts_file)]
            argv += ["--ssh-config", str(ctx.setup.ssh_config)]
            ctx.wait_hosts_quiet(job.hosts)
            host_cpu = ctx.host_cpu_s(job.hosts)
            own = resource.getrusage(resource.RUSAGE_CHILDREN)
            started = time.perf_counter()
            result = subprocess.run(
                argv, capture_output=True, text=True, timeout=300, check=False,
                cwd=ctx.setup.scratch, stdin=subprocess.DEVNULL,
            )  # fmt: skip
            wall = time.perf_counter() - started
            used = resource.getrusage(resource.RUSAGE_CHILDREN)
            quiet = ctx.wait_hosts_quiet(job.hosts)
            results.add(
                {
                    "scenario": "doctor",
                    "bashrc": ctx.bashrc,
                    "available": True,
                    "hosts": hosts,
                    "rep": rep,
                    "wall_s": wall,
                    # CPU that doctor cost, on this machine's cores: its own (and its ssh -G
                    # children's), and every host's (sshd's tree, once the sessions ended).
                    "cpu_s": used.ru_utime + used.ru_stime - own.ru_utime - own.ru_stime,
                    "remote_cpu_s": ctx.host_cpu_s(job.hosts) - host_cpu if quiet else None,
                    "exit_code": result.returncode,
                    "ok": True,
                    "stderr_tail": (result.stdout + result.stderr)[-1500:]
                    if result.returncode
                    else "",
                }
            )
    for hosts in (1, max(settings.host_counts)):
        results.add(doctor_serial_part(ctx, hosts))


def doctor_serial_part(ctx: scenarios.Context, hosts: int) -> dict[str, Any]:
    """One `dtrain doctor`, stamped at its first ssh connection (bench/first_connect.py): the
    launcher's part before any host can start work, for the floor doctor's CPU sets."""
    job = launchers.Job(ctx.hosts[:hosts], 1, ())
    hosts_file = ctx.setup.hosts_file(job, with_slots=False)
    stamp = ctx.setup.scratch / "first-connect.json"
    stamp.unlink(missing_ok=True)
    argv = [sys.executable, str(launchers.REPO / "bench" / "first_connect.py"), str(stamp)]
    argv += ["doctor", "-H", str(hosts_file), "--ssh-config", str(ctx.setup.ssh_config)]
    ctx.wait_hosts_quiet(job.hosts)
    started = time.time()
    result = subprocess.run(
        argv, capture_output=True, text=True, timeout=300, check=False,
        cwd=ctx.setup.scratch, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    ctx.wait_hosts_quiet(job.hosts)
    record: dict[str, Any] = {"scenario": "doctor_serial", "bashrc": ctx.bashrc, "hosts": hosts}
    if not stamp.exists():
        return {**record, "ok": False, "errors": [(result.stdout + result.stderr)[-1500:]]}
    data = json.loads(stamp.read_text())
    return {**record, "ok": True, "serial_s": data["at"] - started, "serial_cpu_s": data["cpu_s"]}


def phase_local(settings: Settings, results: Results, scratch: Path) -> None:
    """No cluster: dtrain's own overhead on a trivial local job, and its local teardown."""
    folder = Path(tempfile.mkdtemp(prefix="local-", dir=scratch))
    dtrain = str(launchers.VENV_BIN / "dtrain")
    bare = ("/usr/bin/python3", "-S", "-c", "pass")
    python = sys.executable
    commands = {
        "bare": bare,
        "venv python": (python, "-c", "pass"),
        "import dtrain.cli": (python, "-c", "import dtrain.cli"),
        "import dtrain.launch.lifecycle": (python, "-c", f"import {LAUNCH_NEEDS}"),
        "import paramiko": (python, "-c", "import dtrain.transport.sshlib"),  # as dtrain does
        "dtrain --version": (dtrain, "--version"),
        "dtrain launch": (
            dtrain, "launch", "-n", "1", "-s", "0", "--framework", "torch",
            "--log-dir", str(folder / "dtrain-logs"), "--", *bare,
        ),
    }  # fmt: skip
    # dtrain's agent as a host starts it (its command, its code on stdin, compiled code from
    # the cache after the first run), to the end of its stream; and an interpreter importing
    # the same C modules: the difference is the agent's own code.
    from dtrain.transport import bootstrap

    commands[launchers.AGENT] = ("/bin/sh", "-c", bootstrap.remote_command())
    commands[launchers.AGENT_C_ONLY] = (
        *bare[:2],
        "-c",
        f"import {', '.join(launchers.AGENT_C_MODULES)}",
    )
    inputs = {launchers.AGENT: bootstrap.agent_payload()}
    for rep in range(settings.local_reps):
        for name in scenarios.rotated(list(commands), rep):
            wall, cpu, rss, code = timed_process(commands[name], folder, inputs.get(name))
            results.add(
                {
                    "scenario": "local-overhead",
                    "launcher": name,
                    "rep": rep,
                    "wall_s": wall,
                    "cpu_s": cpu,
                    "rss_mb": rss,
                    "exit_code": code,
                    "ok": code == 0,
                }
            )
    results.add(
        {
            "scenario": "imports",
            "cli": import_times("import dtrain.cli"),
            "launch": import_times(f"import {LAUNCH_NEEDS}"),
            "complete": True,  # every import listed, not only the costly ones
            "ok": True,
        }
    )
    ctx = scenarios.Context(
        cluster=None,
        setup=launchers.Setup(ssh_config=Path("/dev/null"), scratch=folder),
        bashrc="local",
        hosts=("localhost",),
    )
    for rep in range(settings.teardown_reps):
        for per_host in (1, 4):
            tasks = max(2, per_host)
            run = scenarios.Run(ctx, "dtrain-local", 1, tasks, "teardown", rep)
            for record in scenarios.teardown([run], settings.teardown_bound_s):
                results.add(record)


# What `dtrain launch` imports before its first connection: the command line, the launcher,
# and what it prints with; the rest of `import dtrain.cli` is what other commands need.
LAUNCH_NEEDS = "click, dtrain.launch.lifecycle, dtrain.render"


def import_times(code: str) -> list[tuple[str, int, float]]:
    """(module, depth, cumulative s) of every import, from -X importtime (which inflates
    times: use it to attribute, not to add up). Every one, not only the costly: which modules
    `launch` does not need is a difference of two complete sets (a module loads once, so where
    it shows up, and how costly, depends on what imported it first)."""
    result = subprocess.run(
        [sys.executable, "-X", "importtime", "-c", code],
        capture_output=True,
        text=True,
        timeout=60,
        check=False,
    )
    found = []
    for line in result.stderr.splitlines():
        parts = line.split("|")
        if not line.startswith("import time:") or len(parts) != 3:
            continue
        try:
            cumulative_us = int(parts[1])
        except ValueError:
            continue  # the header line
        name = parts[2].rstrip()
        depth = (len(name) - len(name.lstrip())) // 2
        found.append((name.strip(), depth, cumulative_us / 1e6))
    return found


def timed_process(
    argv: Sequence[str], cwd: Path, stdin: bytes | None = None
) -> tuple[float, float, float, int]:
    """(wall s, CPU s, peak RSS MB, exit code) of one process and the children it reaped;
    `stdin`, if given, is written to a pipe it reads, then the pipe closed."""
    started = time.perf_counter()
    popen = subprocess.Popen(
        argv, cwd=cwd, stdin=subprocess.DEVNULL if stdin is None else subprocess.PIPE,
        stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL,
    )  # fmt: skip
    if popen.stdin is not None:
        with contextlib.suppress(BrokenPipeError):
            popen.stdin.write(stdin or b"")
        popen.stdin.close()
    waiter = scenarios.Waiter(popen)
    waiter.wait(60.0)
    wall = time.perf_counter() - started
    code = waiter.exit_code if waiter.exit_code is not None else -1
    return wall, waiter.cpu_s or 0.0, waiter.rss_mb or 0.0, code


# ---- machine and versions -------------------------------------------------------------------


def machine() -> dict[str, Any]:
    """The machine line of the report, and the versions of everything measured."""
    from importlib import metadata

    def text(argv: Sequence[str]) -> str:
        with contextlib.suppress(OSError, subprocess.SubprocessError):
            result = subprocess.run(argv, capture_output=True, text=True, timeout=10, check=False)
            return (result.stdout + result.stderr).strip().splitlines()[0]
        return "?"

    cpu = "?"
    with contextlib.suppress(OSError):
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                cpu = line.split(":", 1)[1].strip()
                break
    memory_gb = os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES") / 2**30
    os_name = "?"
    with contextlib.suppress(OSError):
        for line in Path("/etc/os-release").read_text().splitlines():
            if line.startswith("PRETTY_NAME="):
                os_name = line.split("=", 1)[1].strip('"')

    def version(name: str) -> str:
        try:
            return metadata.version(name)
        except metadata.PackageNotFoundError:
            return "not installed"

    commit = text(["git", "-C", str(REPO), "describe", "--always", "--dirty"])
    return {
        "cpu": cpu,
        "cores": os.cpu_count(),
        "memory_gb": round(memory_gb, 1),
        "os": os_name,
        "kernel": platform.release(),
        "python": platform.python_version(),
        "task_python": text(["/usr/bin/python3", "--version"]),
        "openssh": text(["ssh", "-V"]),
        "pdsh": text(["pdsh", "-V"]),
        "dtrain": f"{version('dtrain')} ({commit})",
        "dtrain_finder": _editable_finder(),
        "paramiko": version("paramiko"),
        "mxnet": version("mxnet"),
        "ulimit_nofile": _nofile(),
    }


def _editable_finder() -> bool:
    """Whether the launcher's Python finds dtrain through setuptools' editable finder, whose
    import at every interpreter start (~15 ms here) an installed dtrain does not pay
    (scripts/test.sh installs the checkout with editable_mode=compat: a plain path)."""
    import site

    return any(
        any(Path(folder).glob("__editable___dtrain_*finder.py"))
        for folder in site.getsitepackages()
    )


def _nofile() -> str:
    import resource

    soft, hard = resource.getrlimit(resource.RLIMIT_NOFILE)
    return f"{soft}/{hard}"


def load() -> list[float]:
    return [round(x, 2) for x in os.getloadavg()]


def jsonable(data: dict[Any, Any]) -> dict[str, Any]:
    """Keys as JSON makes them (the calibration's host counts become strings)."""
    result: dict[str, Any] = json.loads(json.dumps(data))
    return result


# ---- main -----------------------------------------------------------------------------------


PHASES: dict[str, Callable[[scenarios.Context, Settings, Results], None]] = {
    "launch": phase_launch,
    "launch-more": phase_launch_more,
    "teardown": phase_teardown,
    "signals": phase_signals,
    "log": phase_log,
    "doctor": phase_doctor,
    "scale": phase_scale,
}
SESSIONS = (("launch",), ("launch-more",), ("teardown",), ("signals",), ("log", "doctor"))


def parse_ints(text: str) -> tuple[int, ...]:
    return tuple(int(x) for x in text.split(","))


def unwind_on_sigterm() -> None:
    """SIGTERM (kill, timeout) unwinds like Ctrl-C, so a stopped run still takes its namespaced
    cluster down (the `finally` in `cluster_session`) instead of leaving it for the next."""

    def stop(signum: int, frame: object) -> None:
        raise SystemExit(128 + signum)

    signal.signal(signal.SIGTERM, stop)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(
        prog="python -m bench",
        description="Benchmark dtrain against pdsh, one ssh per task and the dmlc tracker on a "
        "namespaced sshd cluster (needs root), and write docs/benchmarks.md with its plot.",
    )
    parser.add_argument("--quick", action="store_true", help="a smoke run of about a minute")
    parser.add_argument("--hosts", type=parse_ints, help="host counts, e.g. 1,2,4,8")
    parser.add_argument("--per-host", type=parse_ints, help="tasks per host, e.g. 1,4")
    parser.add_argument("--scale-hosts", type=parse_ints, help="scale sizes, e.g. 8,16,32,48")
    parser.add_argument("--scale-reps", type=int, help="repetitions of the scale trivial job")
    parser.add_argument("--reps", type=int, help="repetitions of the trivial job")
    parser.add_argument("--log-mb", type=float, help="MB each host's tasks write in the log test")
    parser.add_argument("--phases", help=f"comma list of {','.join(['local', *PHASES])}")
    parser.add_argument("--bashrc", help="comma list of as-is,blank")
    parser.add_argument("--no-profile", action="store_true", help="skip the dtrain profile")
    parser.add_argument("--profile", action="store_true", help="profile dtrain even if --quick")
    parser.add_argument("--results", type=Path, help="where records go (default bench/results/)")
    parser.add_argument("--doc", type=Path, default=REPO / "docs" / "benchmarks.md")
    parser.add_argument("--no-doc", action="store_true", help="measure only; write no doc")
    parser.add_argument("--report", type=Path, metavar="RESULTS_DIR", help="only rewrite the doc")
    args = parser.parse_args(argv)
    logging.basicConfig(level=logging.WARNING, format="%(name)s: %(message)s")
    unwind_on_sigterm()

    if args.report is not None:
        report.write(args.report, args.doc)
        say(f"wrote {args.doc}")
        return 0
    launchers.compile_dtrain(REPO)  # once, before any phase measures dtrain
    settings = QUICK if args.quick else Settings()
    if args.hosts:
        settings = replace(settings, host_counts=args.hosts)
    if args.per_host:
        settings = replace(settings, per_host=args.per_host)
    if args.reps:
        settings = replace(settings, reps=args.reps)
    if args.scale_hosts:
        settings = replace(settings, scale_hosts=args.scale_hosts)
    if args.scale_reps:
        settings = replace(settings, scale_reps=args.scale_reps)
    if args.log_mb:
        settings = replace(settings, log_mb_per_host=args.log_mb)
    if args.bashrc:
        settings = replace(settings, bashrc_modes=tuple(args.bashrc.split(",")))
    if args.no_profile or args.profile:
        settings = replace(settings, profile=args.profile)
    wanted = set(args.phases.split(",")) if args.phases else {"local", *PHASES}
    if "launch" in wanted:
        wanted.add("launch-more")
    if shutil.which("pdsh") is None:
        parser.error("pdsh is not installed: apt-get install -y pdsh")

    stamp = time.strftime("%Y%m%d-%H%M%S")
    folder = args.results or REPO / "bench" / "results" / stamp
    results = Results(folder)
    meta = {"settings": asdict(settings), "quick": args.quick, "machine": machine()}
    meta["load_start"] = load()
    started = time.monotonic()
    scratch = Path(tempfile.mkdtemp(prefix="dtrain-bench-"))
    try:
        if "local" in wanted:
            phase_local(settings, results, scratch)
        for bashrc in settings.bashrc_modes:
            sessions = SESSIONS if not settings.one_session else (tuple(PHASES),)
            for session in sessions:
                todo = [p for p in session if p in wanted and p != "scale"]
                if not todo:
                    continue
                with cluster_session(settings, bashrc, scratch) as ctx:
                    for name in todo:
                        PHASES[name](ctx, settings, results)
        if "scale" in wanted and settings.scale_hosts:
            for bashrc in settings.scale_modes:
                with cluster_session(settings, bashrc, scratch, max(settings.scale_hosts)) as ctx:
                    phase_scale(ctx, settings, results)
    finally:
        shutil.rmtree(scratch, ignore_errors=True)
        meta["load_end"] = load()
        meta["runtime_s"] = round(time.monotonic() - started, 1)
        results.meta(meta)
    say(f"done in {meta['runtime_s']:.0f}s; records in {folder}")
    if not args.no_doc:
        report.write(folder, args.doc)
        say(f"wrote {args.doc} and {args.doc.with_suffix('.png')}")
    return 0
