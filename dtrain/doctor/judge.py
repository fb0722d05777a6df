"""What doctor's findings mean: for every host and check, PASS/WARN/FAIL, the evidence, the fix.

`checks` gathers a `Survey` (agent replies, TCP probes, process scans); `judge` turns it into
`CheckResult`s; `render` prints them. Pure: no network, no processes, no clock.
"""

from __future__ import annotations

import shlex
from collections.abc import Mapping, Sequence
from dataclasses import dataclass, field, replace
from enum import Enum
from typing import Any

from dtrain.doctor import parity
from dtrain.errors import ExitCode, Problem, one_line
from dtrain.plan.frameworks import MANAGED_VARS
from dtrain.plan.hosts import address_port, is_loopback
from dtrain.plan.planner import workdir_on
from dtrain.plan.spec import Framework
from dtrain.processes.results import HostScan, JobProcess, duration_text
from dtrain.remote.proto import JOB_ID_VAR, PROBE_STACKS, ROLE_VAR

CHECKS = (
    "ssh",
    "python",
    "packages",
    "workdir",
    "env",
    "gpu",
    "clock",
    "address",
    "scheduler",
    "firewall",
    "stale",
    "stacks",
)
QUICK_CHECKS = ("ssh", "scheduler", "stale")  # what `dtrain launch` runs before starting

SLOW_CONNECT_S = 2.0
PRIVILEGED_PORTS = 1024  # Linux's net.ipv4.ip_unprivileged_port_start, by default
CLOCK_SKEW_WARN_S = 1.0
MAX_LISTED = 8
PORT_RANGE_TEXT = "10000-49999"  # where ps-lite's servers and workers bind
MANAGED_ENV = MANAGED_VARS[Framework.DMLC]  # what dtrain sets: differences are expected


class Status(str, Enum):
    PASS = "pass"
    WARN = "warn"
    FAIL = "fail"
    SKIP = "skip"  # not applicable, or not checked because an earlier step failed


@dataclass(frozen=True, slots=True)
class CheckResult:
    """One check on one host: its verdict, the evidence, and (unless it passed) the fix."""

    check: str
    host: str
    status: Status
    detail: str
    hint: str | None = None
    problem: Problem | None = None  # the failure behind it, so hosts sharing it print together

    def to_dict(self) -> dict[str, str | None]:
        return {
            "check": self.check,
            "host": self.host,
            "status": self.status.value,
            "detail": self.detail,
            "hint": self.hint,
        }

    def to_problem(self) -> Problem:
        return Problem(self.detail, host=self.host, hint=self.hint, code=f"doctor_{self.check}")


@dataclass(frozen=True, slots=True)
class Connect:
    """One TCP probe from `src` to `dst`'s listener, as the source host saw it."""

    src: str
    dst: str
    address: str
    port: int
    is_ok: bool
    error: str | None = None
    elapsed_s: float = 0.0

    @property
    def how(self) -> str:
        """Drop and reject look different: a drop times out, a reject is refused at once."""
        if self.error == "timed out":
            return f"timed out after {self.elapsed_s:.1f}s (dropped: a firewall discards it)"
        if self.error == "refused":
            return (
                f"refused in {self.elapsed_s * 1000:.0f} ms "
                "(rejected: a firewall answers with a reset)"
            )
        return self.error or "failed"

    def text(self) -> str:
        return f"{self.src} → {address_port(self.dst, self.port)}: {self.how}"


@dataclass(frozen=True, slots=True)
class Observed:
    """What doctor learned about one host. Agent replies are kept as the agent sent them."""

    name: str
    is_local: bool = False
    problem: Problem | None = None  # why it could not be checked at all (ssh, agent)
    connect_s: float | None = None
    advertised: str | None = None
    interfaces: Mapping[str, str] = field(default_factory=dict)
    listen_error: str | None = None  # binding the advertised address failed
    probe: Mapping[str, Any] = field(default_factory=dict)
    probe_error: str | None = None
    clock_skew_s: float | None = None
    scan: HostScan | None = None
    firewall_tools: Sequence[Mapping[str, Any]] = ()

    @property
    def is_reached(self) -> bool:
        return self.problem is None


@dataclass(frozen=True, slots=True)
class Scheduler:
    """Where the scheduler would listen, and what happened when doctor listened there."""

    host: str
    address: str
    port: int
    is_port_given: bool = False
    listen_error: str | None = None
    holders: Sequence[Mapping[str, Any]] = ()
    now: float = 0.0  # the scheduler host's clock, for the holders' ages


@dataclass(frozen=True, slots=True)
class Survey:
    """Everything doctor gathered, ready to judge."""

    hosts: tuple[Observed, ...]
    connects: tuple[Connect, ...] = ()
    scheduler: Scheduler | None = None
    command: tuple[str, ...] = ()
    workdir: str = "."
    sync_dst: str | None = None
    forwarded_env: frozenset[str] = frozenset()
    kill_command: str = "dtrain kill"
    wait_s: float = 2.0
    reached_through: str | None = None  # not ssh: e.g. "Slurm job 12"

    @property
    def local(self) -> Observed | None:
        return next((h for h in self.hosts if h.is_local), None)

    @property
    def is_multi_host(self) -> bool:
        """Other machines were reached (an address that only works here matters then)."""
        return any(not h.is_local and h.is_reached for h in self.hosts)

    def workdir_of(self, host: Observed) -> str:
        """Remote tasks run in the synced copy when there is one; local tasks in the original."""
        return workdir_on(host.is_local, self.workdir, self.sync_dst)


@dataclass(frozen=True, slots=True)
class DoctorReport:
    hosts: tuple[Observed, ...]
    results: tuple[CheckResult, ...]
    checks: tuple[str, ...] = CHECKS
    elapsed_s: float = 0.0

    @property
    def failures(self) -> list[CheckResult]:
        return [r for r in self.results if r.status is Status.FAIL]

    @property
    def warnings(self) -> list[CheckResult]:
        return [r for r in self.results if r.status is Status.WARN]

    @property
    def exit_code(self) -> int:
        return int(ExitCode.ENVIRONMENT) if self.failures else int(ExitCode.OK)

    def result(self, check: str, host: str) -> CheckResult | None:
        return next((r for r in self.results if r.check == check and r.host == host), None)

    def to_dict(self) -> dict[str, object]:
        return {
            "checks": list(self.checks),
            "hosts": [{"name": h.name, "local": h.is_local} for h in self.hosts],
            "results": [r.to_dict() for r in self.results],
            "elapsed_s": round(self.elapsed_s, 3),
        }


# ---- judging ------------------------------------------------------------------------------


def judge(survey: Survey, checks: Sequence[str] = CHECKS) -> tuple[CheckResult, ...]:
    """Every check on every host, in host order then check order."""
    judges = {
        "ssh": judge_ssh,
        "python": judge_python,
        "packages": judge_packages,
        "workdir": judge_workdir,
        "env": judge_env,
        "gpu": judge_gpu,
        "clock": judge_clock,
        "address": judge_address,
        "scheduler": judge_scheduler,
        "firewall": judge_firewall,
        "stale": judge_stale,
        "stacks": judge_stacks,
    }
    by_check = {check: judges[check](survey) for check in checks}
    results = []
    for host in survey.hosts:
        for check in checks:
            result = by_check[check][host.name]  # each one line, whatever a host reported
            hint = one_line(result.hint) if result.hint is not None else None
            results.append(replace(result, detail=one_line(result.detail), hint=hint))
    return tuple(results)


Verdicts = dict[str, CheckResult]


def _unchecked(survey: Survey, check: str, verdicts: Verdicts) -> Verdicts:
    """Hosts not reached, or whose probe failed, get SKIP/FAIL here so every cell is filled."""
    for host in survey.hosts:
        if host.name in verdicts:
            continue
        if not host.is_reached:
            verdicts[host.name] = CheckResult(check, host.name, Status.SKIP, "not reached")
        else:
            verdicts[host.name] = CheckResult(
                check,
                host.name,
                Status.FAIL,
                f"could not check: {host.probe_error or 'no answer'}",
                "rerun with --debug; the agent's error is above",
            )
    return verdicts


def judge_ssh(survey: Survey) -> Verdicts:
    verdicts: Verdicts = {}
    for host in survey.hosts:
        if host.problem is not None:  # this machine's too: its agent or --setup failed
            verdicts[host.name] = CheckResult(
                "ssh", host.name, Status.FAIL, host.problem.message, host.problem.hint, host.problem
            )
        elif host.is_local:
            verdicts[host.name] = CheckResult("ssh", host.name, Status.SKIP, "this machine")
        elif survey.reached_through is not None:
            detail = f"not used: reached through {survey.reached_through}"
            verdicts[host.name] = CheckResult("ssh", host.name, Status.SKIP, detail)
        elif host.connect_s is not None and host.connect_s > SLOW_CONNECT_S:
            verdicts[host.name] = CheckResult(
                "ssh",
                host.name,
                Status.WARN,
                f"connected, but slowly: {host.connect_s:.1f}s (key accepted, host key known)",
                "a slow login is often a reverse DNS lookup (UseDNS no in sshd_config) or "
                "GSSAPI (GSSAPIAuthentication no in your ssh config)",
            )
        else:
            took = f" in {host.connect_s:.2f}s" if host.connect_s is not None else ""
            verdicts[host.name] = CheckResult(
                "ssh",
                host.name,
                Status.PASS,
                f"connected{took}: key accepted without a prompt, host key known",
            )
    return verdicts


def _probed(survey: Survey) -> list[Observed]:
    return [h for h in survey.hosts if h.is_reached and h.probe_error is None]


def _interpreter(host: Observed) -> Mapping[str, Any]:
    found: Mapping[str, Any] = host.probe.get("interpreter") or {}
    return found


def _local_name(survey: Survey) -> str | None:
    local = survey.local
    return local.name if local is not None else None


def judge_python(survey: Survey) -> Verdicts:
    verdicts: Verdicts = {}
    program = parity.interpreter_of(survey.command)
    versions: dict[str, tuple[str, str]] = {}
    for host in _probed(survey):
        facts = _interpreter(host)
        if facts.get("error"):
            verdicts[host.name] = CheckResult(
                "python",
                host.name,
                Status.FAIL,
                str(facts["error"]),
                f"install it on {host.name}, or give its absolute path in the command",
            )
        elif not facts.get("interpreter"):
            verdicts[host.name] = CheckResult(
                "python",
                host.name,
                Status.PASS,
                f"{program} is {facts.get('resolved')} (not a Python program: nothing to compare)",
            )
        else:
            versions[host.name] = (str(facts.get("version")), str(facts.get("executable")))
    verdict = parity.majority(versions, prefer=_local_name(survey))
    for name, (version, executable) in versions.items():
        if name not in verdict.odd:
            verdicts[name] = CheckResult(
                "python", name, Status.PASS, f"{program} runs {executable} {version}"
            )
            continue
        assert verdict.value is not None
        usual_version, usual_executable = verdict.value
        status = Status.FAIL if version != usual_version else Status.WARN
        verdicts[name] = CheckResult(
            "python",
            name,
            status,
            f"{program} runs {executable} {version} on {name}; {verdict.share} run "
            f"{usual_executable} {usual_version}",
            f"make the login environment of {name} find the same Python (check PATH in its "
            f"~/.bashrc or profile), or give its absolute path in the command",
        )
    return _unchecked(survey, "python", verdicts)


def judge_packages(survey: Survey) -> Verdicts:
    verdicts: Verdicts = {}
    installed: dict[str, Mapping[str, str]] = {}
    executables: dict[str, str] = {}
    for host in _probed(survey):
        facts = _interpreter(host)
        dists = facts.get("distributions")
        if facts.get("error") or not facts.get("interpreter") or dists is None:
            reason = "no Python to ask" if facts.get("error") or dists is None else "not Python"
            verdicts[host.name] = CheckResult("packages", host.name, Status.SKIP, reason)
            continue
        installed[host.name] = dists
        executables[host.name] = str(facts.get("executable"))
    diffs = parity.package_diff(installed, prefer=_local_name(survey))
    for name, dists in installed.items():
        mine = diffs.get(name, ())
        if not mine:
            others = len(installed) - 1
            against = f", same as the other {others}" if others else ""
            verdicts[name] = CheckResult(
                "packages", name, Status.PASS, f"{len(dists)} distributions{against}"
            )
            continue
        serious = [d for d in mine if d.kind != "extra"]
        wanted = [d for d in serious if d.majority is not None][:MAX_LISTED]
        pins = " ".join(shlex.quote(f"{d.name}=={d.majority}") for d in wanted)
        hint = (
            f"on {name}: {executables[name]} -m pip install {pins}"
            if pins
            else "remove the extra packages, or install them on every host"
        )
        verdicts[name] = CheckResult(
            "packages",
            name,
            Status.FAIL if serious else Status.WARN,
            f"{len(mine)} distribution{'s' if len(mine) != 1 else ''} differ from the "
            f"other hosts: {_listed([d.text() for d in mine])}",
            hint,
        )
    return _unchecked(survey, "packages", verdicts)


def judge_workdir(survey: Survey) -> Verdicts:
    verdicts: Verdicts = {}
    script = parity.script_of(survey.command)
    local = survey.local
    reference: str | None = None
    if local is not None and local.is_reached and local.probe_error is None:
        reference = (local.probe.get("files") or {}).get("sha256")
    hashes = {
        h.name: (h.probe.get("files") or {}).get("sha256")
        for h in _probed(survey)
        if (h.probe.get("files") or {}).get("sha256")
    }
    if reference is None and hashes:
        reference = parity.majority(hashes).value
    for host in _probed(survey):
        files: Mapping[str, Any] = host.probe.get("files") or {}
        directory = survey.workdir_of(host)
        synced = survey.sync_dst is not None and not host.is_local
        fix = (
            f"`dtrain launch --sync-dst-dir {survey.sync_dst}` copies this directory there "
            "before starting"
            if synced
            else f"copy it to {host.name} (rsync), or pass --sync-dst-dir DIR to have launch "
            "copy this directory to every host"
        )
        bad = Status.WARN if synced else Status.FAIL
        if synced and files.get("sync_problem"):
            verdicts[host.name] = CheckResult(
                "workdir",
                host.name,
                Status.FAIL,
                f"--sync-dst-dir {directory} cannot be made there: {files['sync_problem']}",
                "move what is in the way or make it writable, or pick another --sync-dst-dir",
            )
            continue
        if not files.get("dir_exists"):
            what = "is not there yet" if synced else "does not exist"
            verdicts[host.name] = CheckResult(
                "workdir", host.name, bad, f"working directory {directory} {what}", fix
            )
            continue
        if script is None:
            verdicts[host.name] = CheckResult(
                "workdir", host.name, Status.PASS, f"{directory} exists"
            )
            continue
        digest = files.get("sha256")
        if digest is None:
            verdicts[host.name] = CheckResult(
                "workdir",
                host.name,
                bad,
                f"{script}: {files.get('error') or 'not a file'} in {directory}",
                fix,
            )
        elif reference is not None and digest != reference:
            where = "here" if local is not None and local.probe.get("files") else "on most hosts"
            verdicts[host.name] = CheckResult(
                "workdir",
                host.name,
                bad,
                f"{script} in {directory} differs from the copy {where} "
                f"(sha256 {digest[:12]}, {files.get('size')} bytes; expected {reference[:12]})",
                fix,
            )
        else:
            verdicts[host.name] = CheckResult(
                "workdir",
                host.name,
                Status.PASS,
                f"{script} in {directory}: sha256 {digest[:12]}, same as here",
            )
    return _unchecked(survey, "workdir", verdicts)


def compared_env_keys(survey: Survey) -> list[str]:
    """Variables whose value on a host reaches its tasks: dtrain sets the managed ones, and
    the launching shell's forwarded ones override every host's."""
    keys: set[str] = set()
    for host in _probed(survey):
        keys.update((host.probe.get("env") or {}).keys())
    return sorted(keys - MANAGED_ENV - survey.forwarded_env)


def judge_env(survey: Survey) -> Verdicts:
    verdicts: Verdicts = {}
    keys = compared_env_keys(survey)
    odd: dict[str, list[str]] = {}
    probed = _probed(survey)
    local_name = _local_name(survey)
    for key in keys:
        values = {h.name: (h.probe.get("env") or {}).get(key) for h in probed}
        verdict = parity.majority(values, prefer=local_name)
        for name, value in verdict.odd.items():
            usual = "unset" if verdict.value is None else f"{key}={verdict.value}"
            mine = "unset" if value is None else f"{key}={value}"
            odd.setdefault(name, []).append(f"{mine} (others: {usual})")
    forwarded = ", ".join(sorted(survey.forwarded_env))
    for host in probed:
        found = odd.get(host.name)
        if found:
            verdicts[host.name] = CheckResult(
                "env",
                host.name,
                Status.WARN,
                "; ".join(found),
                "set it the same in every host's login environment, or pass --env KEY=VALUE "
                "to dtrain launch so every task gets one value",
            )
        else:
            note = f"; {forwarded} forwarded from this shell" if forwarded else ""
            verdicts[host.name] = CheckResult(
                "env",
                host.name,
                Status.PASS,
                f"{len(keys)} variable{'s' if len(keys) != 1 else ''} compared, same on every "
                f"host{note}",
            )
    return _unchecked(survey, "env", verdicts)


def judge_gpu(survey: Survey) -> Verdicts:
    verdicts: Verdicts = {}
    gpus = {h.name: h.probe.get("gpu") or {} for h in _probed(survey)}
    if not any(g.get("present") for g in gpus.values()):
        for name in gpus:
            verdicts[name] = CheckResult("gpu", name, Status.PASS, "no nvidia-smi on any host")
        return _unchecked(survey, "gpu", verdicts)
    shapes: dict[str, tuple[int, str]] = {}
    for name, gpu in gpus.items():
        if not gpu.get("present"):
            verdicts[name] = CheckResult(
                "gpu",
                name,
                Status.WARN,
                "no nvidia-smi here, while other hosts have one",
                f"install the NVIDIA driver on {name}, or leave it out of GPU jobs",
            )
        elif gpu.get("error"):
            verdicts[name] = CheckResult(
                "gpu",
                name,
                Status.FAIL,
                f"nvidia-smi failed: {gpu['error']}",
                f"check the NVIDIA driver on {name} (a driver/library version mismatch "
                "usually needs a reboot)",
            )
        else:
            listed = gpu.get("gpus") or []
            drivers = ",".join(sorted({str(entry[1]) for entry in listed})) or "-"
            shapes[name] = (len(listed), drivers)
    verdict = parity.majority(shapes, prefer=_local_name(survey))
    for name, (count, drivers) in shapes.items():
        text = f"{count} GPU{'s' if count != 1 else ''}, driver {drivers}"
        if name in verdict.odd and verdict.value is not None:
            usual_count, usual_drivers = verdict.value
            verdicts[name] = CheckResult(
                "gpu",
                name,
                Status.WARN,
                f"{text}; {verdict.share} have {usual_count}, driver {usual_drivers}",
                "use the same driver everywhere; give --gpus to pick GPUs per host",
            )
        else:
            verdicts[name] = CheckResult("gpu", name, Status.PASS, text)
    return _unchecked(survey, "gpu", verdicts)


def judge_clock(survey: Survey) -> Verdicts:
    verdicts: Verdicts = {}
    for host in _probed(survey):
        skew = host.clock_skew_s
        if host.is_local or skew is None:
            verdicts[host.name] = CheckResult("clock", host.name, Status.PASS, "this machine")
        elif abs(skew) > CLOCK_SKEW_WARN_S:
            side = "ahead of" if skew > 0 else "behind"
            verdicts[host.name] = CheckResult(
                "clock",
                host.name,
                Status.WARN,
                f"clock is {abs(skew):.1f}s {side} this machine",
                f"run chrony or ntpd on {host.name}: log times across hosts will not line up",
            )
        else:
            verdicts[host.name] = CheckResult(
                "clock", host.name, Status.PASS, f"within {abs(skew):.2f}s of this machine"
            )
    return _unchecked(survey, "clock", verdicts)


UNROUTABLE = ("no route to host", "network unreachable")


def judge_address(survey: Survey) -> Verdicts:
    verdicts: Verdicts = {}
    for host in survey.hosts:
        if not host.is_reached or host.advertised is None:
            continue
        address = host.advertised
        addresses = ", ".join(f"{k} {v}" for k, v in sorted(host.interfaces.items())) or "none"
        incoming = [c for c in survey.connects if c.dst == host.name]
        if survey.is_multi_host and is_loopback(address):
            verdicts[host.name] = CheckResult(
                "address",
                host.name,
                Status.FAIL,
                f"would advertise {address} (loopback): peers on other machines cannot reach it",
                "name the host in the hosts file by an address its peers reach, or pass "
                "--host-ip / --interface",
            )
        elif host.listen_error is not None and "assign" in host.listen_error:
            verdicts[host.name] = CheckResult(
                "address",
                host.name,
                Status.FAIL,
                f"would advertise {address}, which is not an address of {host.name} "
                f"(binding it: {host.listen_error}); its addresses: {addresses}",
                "ps-lite binds the address it advertises: reach the host by an address it "
                "owns (no NAT in between), or pass --interface NAME",
            )
        elif incoming and all(not c.is_ok and c.error in UNROUTABLE for c in incoming):
            verdicts[host.name] = CheckResult(
                "address",
                host.name,
                Status.FAIL,
                f"no host can reach {address}: {incoming[0].error}",
                "check routes between the hosts, or pass --interface NAME for a shared network",
            )
        else:
            verdicts[host.name] = _hostname_verdict(host, address, survey.is_multi_host)
    return _unchecked(survey, "address", verdicts)


def _hostname_verdict(host: Observed, address: str, is_multi_host: bool) -> CheckResult:
    naming: Mapping[str, Any] = host.probe.get("hostname") or {}
    resolved = [str(a) for a in naming.get("addresses") or []]
    name = naming.get("hostname", host.name)
    if is_multi_host and resolved and all(is_loopback(a) for a in resolved):
        return CheckResult(
            "address",
            host.name,
            Status.WARN,
            f"advertises {address}; but its hostname {name} resolves to {resolved[0]} there, "
            "so tools that advertise the hostname (DMLC_NODE_HOST=$(hostname), the dmlc "
            "tracker) would hand peers a loopback address",
            f"map {name} to {address} in /etc/hosts on {host.name} (Debian puts 127.0.1.1 there)",
        )
    return CheckResult("address", host.name, Status.PASS, f"advertises {address}")


def judge_scheduler(survey: Survey) -> Verdicts:
    verdicts: Verdicts = {}
    scheduler = survey.scheduler
    listening = next((h for h in survey.hosts if h.name == (scheduler and scheduler.host)), None)
    if scheduler is None or listening is None or not listening.is_reached:
        for host in survey.hosts:
            if host.is_reached:
                verdicts[host.name] = CheckResult(
                    "scheduler", host.name, Status.SKIP, "the scheduler's host was not reached"
                )
        return _unchecked(survey, "scheduler", verdicts)
    endpoint = address_port(scheduler.address, scheduler.port)
    reaching = [c for c in survey.connects if c.dst == scheduler.host]
    everyone_fails = bool(reaching) and not any(c.is_ok for c in reaching)
    for host in survey.hosts:
        if not host.is_reached:
            continue
        if host.name == scheduler.host:
            verdicts[host.name] = _scheduler_host_verdict(survey, scheduler, endpoint)
            continue
        probe = next((c for c in reaching if c.src == host.name), None)
        if probe is None:
            continue
        if probe.is_ok:
            verdicts[host.name] = CheckResult(
                "scheduler",
                host.name,
                Status.PASS,
                f"reaches the scheduler at {endpoint} ({probe.elapsed_s * 1000:.0f} ms)",
            )
            continue
        if everyone_fails:
            hint = (
                f"open TCP port {scheduler.port} in the firewall of {scheduler.host}, where the "
                "scheduler listens (no host reaches it)"
            )
        else:
            hint = (
                f"check the firewalls of {host.name} (outgoing) and {scheduler.host} "
                f"(incoming from {host.name}); other hosts do reach it"
            )
        verdicts[host.name] = CheckResult(
            "scheduler",
            host.name,
            Status.FAIL,
            f"cannot reach the scheduler: {probe.text()}",
            hint,
        )
    return _unchecked(survey, "scheduler", verdicts)


def _scheduler_host_verdict(survey: Survey, scheduler: Scheduler, endpoint: str) -> CheckResult:
    if scheduler.listen_error is None:
        return CheckResult(
            "scheduler",
            scheduler.host,
            Status.PASS,
            f"the scheduler can listen on {endpoint} here",
        )
    if "in use" in scheduler.listen_error:
        held = "; ".join(_holder_text(h, scheduler.now) for h in scheduler.holders) or "unknown"
        return CheckResult(
            "scheduler",
            scheduler.host,
            Status.FAIL,
            f"port {scheduler.port} is in use on {scheduler.host}: {held}",
            _holder_hint(survey, scheduler),
        )
    return CheckResult(
        "scheduler",
        scheduler.host,
        Status.FAIL,
        f"the scheduler cannot listen on {endpoint}: {scheduler.listen_error}",
        _listen_hint(scheduler),
    )


def _listen_hint(scheduler: Scheduler) -> str:
    """What to do when the scheduler's address and port cannot be bound, by why not."""
    error = (scheduler.listen_error or "").lower()
    if "permission" in error and scheduler.port < PRIVILEGED_PORTS:
        return (
            f"ports below {PRIVILEGED_PORTS} need root: pass --port {PRIVILEGED_PORTS} or "
            "above, or leave --port out for a free one"
        )
    if "assign" in error:
        return (
            f"{scheduler.address} is not an address of {scheduler.host}: pass --host-ip "
            f"with one of {scheduler.host}'s addresses that every host reaches, or leave it out"
        )
    return "pass --host-ip and --port with an address and port the scheduler can listen on"


def _holder_text(holder: Mapping[str, Any], now: float) -> str:
    if holder.get("pid") is None:
        return "a process this user cannot see"
    tags: Mapping[str, str] = holder.get("tags") or {}
    parts = [f"pid {holder['pid']}"]
    if holder.get("start"):
        parts.append(f"age {duration_text(max(0, now - float(holder['start'])))}")
    if tags.get(JOB_ID_VAR):
        parts.append(f"job {tags[JOB_ID_VAR]}")
    if tags.get(ROLE_VAR):
        parts.append(f"DMLC_ROLE={tags[ROLE_VAR]}")
    command = shlex.join(holder.get("cmdline") or [])[:120]
    return f"{', '.join(parts)}: {command}"


def _holder_hint(survey: Survey, scheduler: Scheduler) -> str:
    jobs = sorted(
        {
            str((h.get("tags") or {}).get(JOB_ID_VAR))
            for h in scheduler.holders
            if (h.get("tags") or {}).get(JOB_ID_VAR)
        }
    )
    local = survey.local is not None and survey.local.name == scheduler.host
    prefix = "dtrain kill" if local else survey.kill_command
    if jobs:
        return "stop it: " + "; ".join(f"{prefix} --job {job}" for job in jobs)
    if any((h.get("tags") or {}).get(ROLE_VAR) for h in scheduler.holders):
        return f"stop it: {prefix}"
    pids = " ".join(str(h["pid"]) for h in scheduler.holders if h.get("pid"))
    other = f"stop it (kill {pids}) or " if pids else ""
    return f"{other}pick another --port"


def blocked_by_host(connects: Sequence[Connect], peers: Sequence[str]) -> dict[str, list[Connect]]:
    """Failed probes, each blamed on the host whose firewall most likely blocks it.

    A probe is blamed on its destination (incoming rules are the usual culprit), unless its
    source reaches none of the peers it tried while others reach that destination: then the
    source's own (outgoing) rules are the likelier cause.
    """
    tried: dict[str, list[Connect]] = {}
    for probe in connects:
        tried.setdefault(probe.src, []).append(probe)
    reached_by_someone = {c.dst for c in connects if c.is_ok}
    cut_off = {
        src for src, probes in tried.items() if len(probes) > 1 and not any(p.is_ok for p in probes)
    }
    blamed: dict[str, list[Connect]] = {name: [] for name in peers}
    for probe in connects:
        if probe.is_ok:
            continue
        culprit = probe.dst
        if probe.src in cut_off and probe.dst in reached_by_someone:
            culprit = probe.src
        blamed.setdefault(culprit, []).append(probe)
    return blamed


def judge_firewall(survey: Survey) -> Verdicts:
    verdicts: Verdicts = {}
    scheduler = survey.scheduler.host if survey.scheduler is not None else None
    peers = [c for c in survey.connects if c.dst != scheduler]
    reached = [h.name for h in survey.hosts if h.is_reached]
    blamed = blocked_by_host(peers, reached)
    for host in survey.hosts:
        if not host.is_reached:
            continue
        mine = blamed.get(host.name, [])
        involved = [c for c in peers if host.name in (c.src, c.dst)]
        if not involved and not mine:
            verdicts[host.name] = CheckResult(
                "firewall", host.name, Status.PASS, "no other host to probe"
            )
            continue
        if not mine:
            others = len(
                {c.dst for c in involved if c.src == host.name}
                | {c.src for c in involved if c.dst == host.name}
            )
            verdicts[host.name] = CheckResult(
                "firewall",
                host.name,
                Status.PASS,
                f"TCP to and from {others} host{'s' if others != 1 else ''} on high ports",
            )
            continue
        tools = _tools_text(host)
        hint = (
            f"open TCP ports {PORT_RANGE_TEXT} on {host.name} to the other hosts (ps-lite's "
            "servers and workers bind random ports there)"
            + (f"; rules found: {tools}" if tools else "")
        )
        verdicts[host.name] = CheckResult(
            "firewall", host.name, Status.FAIL, _listed([c.text() for c in mine]), hint
        )
    return _unchecked(survey, "firewall", verdicts)


def _tools_text(host: Observed) -> str:
    parts = []
    for tool in host.firewall_tools:
        if tool.get("error"):
            parts.append(f"{tool['tool']}: not readable ({tool['error']})")
        elif tool.get("rules"):
            parts.append(f"{tool['tool']}: " + ", ".join(str(r) for r in tool["rules"][:3]))
    return "; ".join(parts)


def _process_text(proc: JobProcess) -> str:
    who = f"{proc.label} of job {proc.job_id}" if proc.job_id else f"DMLC_ROLE={proc.role}"
    if proc.inherited_from is not None:
        who = f"child of {proc.inherited_from}, {who}"
    command = shlex.join(proc.command)[:100]
    return f"pid {proc.pid} ({who}, age {duration_text(proc.age_s)}): {command}"


def _count(processes: Sequence[JobProcess]) -> str:
    return f"{len(processes)} job process{'es' if len(processes) != 1 else ''}"


def _listed(texts: Sequence[str]) -> str:
    """The first MAX_LISTED texts joined by "; ", and how many more there are."""
    listed = "; ".join(texts[:MAX_LISTED])
    more = len(texts) - MAX_LISTED
    return listed + (f"; and {more} more" if more > 0 else "")


def _listing(processes: Sequence[JobProcess]) -> str:
    return _listed([_process_text(p) for p in processes])


def kill_lines(processes: Sequence[JobProcess], kill_command: str) -> list[str]:
    """The `dtrain kill` lines that remove exactly these processes' jobs."""
    jobs = sorted({p.job_id for p in processes if p.job_id})
    lines = [f"{kill_command} --job {job}" for job in jobs]
    if any(p.job_id is None for p in processes):
        lines.append(kill_command)
    return lines


def judge_stale(survey: Survey) -> Verdicts:
    """Leftovers FAIL: job processes whose launcher is gone (adopted by init). Job processes
    that something still supervises are another job running side by side: WARN, because
    telling the user to kill them could kill a live experiment; what would break this job
    (holding the scheduler port) FAILs under scheduler."""
    verdicts: Verdicts = {}
    for host in survey.hosts:
        if not host.is_reached or host.scan is None:
            continue
        scan = host.scan
        if scan.error is not None:
            verdicts[host.name] = CheckResult(
                "stale",
                host.name,
                Status.FAIL,
                f"could not scan for processes: {scan.error.message}",
                scan.error.hint,
            )
            continue
        if not scan.processes:
            verdicts[host.name] = CheckResult(
                "stale", host.name, Status.PASS, "no processes of earlier jobs"
            )
            continue
        prefix = "dtrain kill" if host.is_local else survey.kill_command
        orphans = [p for p in scan.processes if p.orphaned]
        if orphans:
            verdicts[host.name] = CheckResult(
                "stale",
                host.name,
                Status.FAIL,
                f"{_count(orphans)} left behind by an earlier job (its launcher is gone): "
                + _listing(orphans),
                "stop them: " + "; ".join(kill_lines(orphans, prefix)),
            )
            continue
        live = scan.processes
        jobs = sorted({p.job_id or p.role or "?" for p in live})
        verdicts[host.name] = CheckResult(
            "stale",
            host.name,
            Status.WARN,
            f"another job is running here ({', '.join(jobs)}): {_count(live)}: " + _listing(live),
            "it may compete for ports, memory and GPUs; if it should not run, stop it: "
            + "; ".join(kill_lines(live, prefix)),
        )
    return _unchecked(survey, "stale", verdicts)


def judge_stacks(survey: Survey) -> Verdicts:
    """Whether `dtrain stacks` (and a hung job's automatic stacks) can work on each host."""
    verdicts: Verdicts = {}
    for host in _probed(survey):
        facts: Mapping[str, Any] = host.probe.get(PROBE_STACKS) or {}
        verdicts[host.name] = _stacks_verdict(host.name, facts, bool(survey.command))
    return _unchecked(survey, "stacks", verdicts)


def _stacks_verdict(name: str, facts: Mapping[str, Any], has_command: bool) -> CheckResult:
    tool, looked_in = facts.get("tool"), list(facts.get("looked_in") or ())
    scope, is_root = facts.get("ptrace_scope"), bool(facts.get("is_root"))
    if tool is None:
        if not has_command:
            return CheckResult(
                "stacks",
                name,
                Status.SKIP,
                "py-spy is not on PATH; give the job's command to look beside its Python",
            )
        where = " and ".join(looked_in) or "its Python"
        python = f"{looked_in[0]}/python -m pip" if looked_in else "pip"
        return CheckResult(
            "stacks",
            name,
            Status.WARN,
            f"py-spy is not installed beside {where} or on PATH: `dtrain stacks` cannot show "
            "where this host's tasks are when a job hangs",
            f"install it into the job's environment: {python} install py-spy",
        )
    if isinstance(scope, int) and (scope >= 3 or (scope >= 1 and not is_root)):
        return CheckResult(
            "stacks",
            name,
            Status.WARN,
            f"py-spy is {tool}, but kernel.yama.ptrace_scope is {scope}: it cannot read "
            "the tasks of this user",
            "sysctl kernel.yama.ptrace_scope=0 on this host (as root), or run py-spy as root",
        )
    return CheckResult("stacks", name, Status.PASS, f"py-spy is {tool}")
