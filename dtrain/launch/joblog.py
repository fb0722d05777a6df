"""A job's log directory: paths and modes, job.json, and task logs a full disk cannot kill.

Owns everything under LOG_DIR/<job-id>/ and the LOG_DIR/latest link. The directory is 0700 and
every file in it 0600, whatever the umask: job.json holds every `--env` value (API keys) in
plaintext, and task logs print whatever the training code prints.

A job that trains for days must not die because its logs filled a disk: a task log that cannot
be written stops being written (the caller warns once), and job.json keeps a reserve so that its
last write, the job's final state, still fits (see `JobFile`).

job.json also names the launcher (pid, start time, boot, host), so a later `dtrain ps` or
`dtrain launch` can tell a job whose launcher was killed (SIGKILL, a crash) from a running one,
and records it as `launcher_died`.
"""

from __future__ import annotations

import contextlib
import errno
import json
import logging
import os
import shutil
import signal
import time
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from dtrain.errors import UsageError
from dtrain.inputfiles import InputFile, InputFileError, read_input
from dtrain.plan.spec import JobPlan

if TYPE_CHECKING:  # what the launcher records of itself loads once a job needs it
    from dtrain.processes.launcher import DeadLauncherJob, Launcher

logger = logging.getLogger(__name__)

DIR_MODE = 0o700
FILE_MODE = 0o600
JOB_FILE = "job.json"
RESERVE_FILE = ".job.json.reserve"
RUNNING = "running"
LAUNCHER_DIED = "launcher_died"
ATTEMPT_PREFIX = "attempt-"
BASE_RESERVE_BYTES = 64 * 1024
RESERVE_PER_TASK_BYTES = 2048  # a task's entry in the result, with a long `detail`
DISK_FULL = (errno.ENOSPC, errno.EDQUOT)
MAX_JOB_FILE_BYTES = 1 << 30  # a plan of 100k tasks, each with its whole environment


class LogDirError(UsageError):
    """The log directory cannot be made or written: nothing was started."""

    code = "log_dir"


def _reason(exc: OSError) -> str:
    return exc.strerror or str(exc)


def log_dir_error(root: Path | str, exc: OSError, verb: str = "create") -> LogDirError:
    """`cannot create log directory X: reason`, with a hint that fits the reason."""
    reason = _reason(exc)
    if isinstance(exc, FileExistsError):
        other = exc.filename and Path(exc.filename) != Path(root)
        reason = f"{exc.filename if other else 'it'} exists and is not a directory"
    if exc.errno in DISK_FULL:
        hint = "free some space there, or pass --log-dir DIR on another disk"
    else:
        hint = "pass --log-dir DIR, a directory you can create and write (default: dtrain-logs)"
    return LogDirError(f"cannot {verb} log directory {root} (--log-dir): {reason}", hint=hint)


@dataclass(frozen=True, slots=True)
class JobPaths:
    """Where one job's files live."""

    root: Path
    job_id: str
    made: tuple[
        Path, ...
    ] = ()  # the directories above the job's that dtrain created, deepest first

    @property
    def dir(self) -> Path:
        return self.root / self.job_id

    @property
    def job_file(self) -> Path:
        return self.dir / JOB_FILE

    @property
    def latest(self) -> Path:
        return self.root / "latest"

    def log(self, name: str) -> Path:
        return self.dir / name


def check_root(text: str) -> Path:
    """The `--log-dir` value as a path; an empty one is an error (it would mean `.`)."""
    if not text.strip():
        raise LogDirError(
            "cannot create log directory '' (--log-dir): the path is empty",
            hint="pass --log-dir DIR, or leave it out for ./dtrain-logs",
        )
    return Path(text)


def create(root: Path, job_id: str) -> JobPaths:
    """Make LOG_DIR/<job-id> (0700) with job.json's reserve in it: proof that it can be written.

    Called before any host is connected, so a log directory that cannot be made (a file in the
    way, read-only, /proc, a full disk) starts nothing.
    """
    try:  # even asking whether a directory exists fails under one the user cannot enter
        made = tuple(p for p in (root, *root.parents) if not p.exists())
        paths = JobPaths(root, job_id, made=made)
        root.mkdir(parents=True, exist_ok=True)
        paths.dir.mkdir(mode=DIR_MODE)
    except OSError as exc:
        raise log_dir_error(root, exc) from None
    try:
        os.chmod(paths.dir, DIR_MODE)  # mkdir's mode is cut by the umask; 0700 always
        JobFile(paths).reserve(BASE_RESERVE_BYTES)
    except OSError as exc:
        remove(paths)
        raise log_dir_error(root, exc, "write") from None
    return paths


def remove(paths: JobPaths) -> None:
    """Remove a job directory that never ran a task (the launch failed before starting any),
    and `latest` if it points there: a link to nothing would be all that is left of it."""
    shutil.rmtree(paths.dir, ignore_errors=True)
    with contextlib.suppress(OSError):
        if os.readlink(paths.latest) == paths.job_id:
            paths.latest.unlink()
    for made in paths.made:
        with contextlib.suppress(OSError):
            made.rmdir()  # only if still empty: another job may have started there meanwhile


def populate(
    paths: JobPaths, plan: JobPlan, host: str, attempt: int | None = None
) -> DeadLauncherJob | None:
    """Write the plan's extra files and log aliases, and point `latest` at this job.

    With `attempt` (a job that may restart), they go under `attempt-N/` and the job's top
    level links each name to the newest attempt's file. Returns the job `latest` pointed at
    before if its launcher died without recording its end (that job.json now says so).
    """
    try:
        write_attempt_files(paths, plan, attempt)
    except OSError as exc:
        raise log_dir_error(paths.dir, exc, "write") from None
    if attempt is not None and attempt > 1:
        return None  # `latest` went to this job with its first attempt
    latest = paths.latest
    previous = None
    with contextlib.suppress(OSError):
        if latest.is_symlink():
            previous = mark_if_launcher_died(latest.resolve(), host)
        if latest.is_symlink() or not latest.exists():
            temporary = paths.root / f".latest.{os.getpid()}"
            temporary.symlink_to(paths.job_id)
            temporary.replace(latest)
    return previous


def attempt_dir(paths: JobPaths, attempt: int | None) -> Path:
    """Where an attempt's task logs go: the job's directory, or its `attempt-N/`."""
    return paths.dir if attempt is None else paths.dir / f"{ATTEMPT_PREFIX}{attempt}"


def write_attempt_files(paths: JobPaths, plan: JobPlan, attempt: int | None) -> None:
    where = attempt_dir(paths, attempt)
    if attempt is not None:
        where.mkdir(mode=DIR_MODE, exist_ok=True)
        os.chmod(where, DIR_MODE)
    for name, content in plan.extra_files.items():
        write_private(where / name, content.encode())
    for task in plan.tasks:
        for alias in task.log_aliases:
            (where / alias).symlink_to(task.log_name)
    if attempt is None:
        return
    names = [*plan.extra_files]
    for task in plan.tasks:
        names += [task.log_name, *task.log_aliases]
    for old in paths.dir.iterdir():  # a task the new plan does not have: no link to the past
        if (
            old.is_symlink()
            and os.readlink(old).startswith(ATTEMPT_PREFIX)
            and old.name not in names
        ):
            old.unlink()
    for name in names:
        temporary = paths.dir / f".{name}.{os.getpid()}.link"
        temporary.symlink_to(f"{where.name}/{name}")
        temporary.replace(paths.dir / name)


def write_private(path: Path, data: bytes) -> None:
    """Write a whole file, created 0600 (a partial write to a full disk raises)."""
    fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
    try:
        os.fchmod(fd, FILE_MODE)  # an existing file keeps its mode otherwise
        view = memoryview(data)
        while view:
            view = view[os.write(fd, view) :]
    finally:
        os.close(fd)


def encode(document: Mapping[str, Any]) -> bytes:
    """job.json's bytes: indented, for people who read it."""
    return (json.dumps(document, indent=2) + "\n").encode()


class JobFile:
    """job.json, replaced atomically (write a temporary file, rename it over).

    On a full disk the temporary file does not fit, so the directory keeps a reserve file of
    incompressible bytes big enough for the final document: when a write fails with ENOSPC or
    EDQUOT, the reserve is deleted and the write tried once more, into the space it freed.
    The reserve goes once the final state is written.
    """

    def __init__(self, paths: JobPaths) -> None:
        self.paths = paths
        self.reserve_path = paths.dir / RESERVE_FILE
        self.document: dict[str, Any] = {}

    def reserve(self, size: int) -> None:
        if self.reserve_path.exists() and self.reserve_path.stat().st_size >= size:
            return
        write_private(self.reserve_path, os.urandom(size))  # random: a compressing fs keeps it

    def release(self) -> None:
        with contextlib.suppress(FileNotFoundError):
            self.reserve_path.unlink()

    def write(
        self, document: Mapping[str, Any], *, final: bool = False, use_reserve: bool = True
    ) -> None:
        """Replace job.json; with `final`, also drop the reserve. Raises OSError if it cannot
        (at once without `use_reserve`: the reserve is kept for the final document)."""
        self._write(encode(document), final=final, use_reserve=use_reserve)

    def _write(self, data: bytes, *, final: bool, use_reserve: bool) -> None:
        temporary = self.paths.dir / f".{JOB_FILE}.{os.getpid()}.tmp"
        try:
            write_private(temporary, data)
        except OSError as exc:
            with contextlib.suppress(OSError):
                temporary.unlink()
            if exc.errno not in DISK_FULL or not use_reserve or not self.reserve_path.exists():
                raise
            logger.debug("job.json does not fit (%s): using its reserve", exc)
            self.release()
            write_private(temporary, data)
        temporary.replace(self.paths.job_file)
        if final:
            self.release()

    def start(
        self, plan: JobPlan, launcher: Launcher, engine: Mapping[str, Any] | None = None
    ) -> None:
        """The running job's document, and a reserve big enough for its final one.

        `engine` says what started the agents when it was not ssh (Slurm's job and step ids)."""
        document = {
            "dtrain_job": 1,
            "state": RUNNING,
            "launcher": launcher.to_dict(),
            "engine": dict(engine) if engine is not None else {"name": "ssh"},
            "started_at": time.time(),
            "plan": plan.to_dict(),
            "result": None,
        }
        data = encode(document)  # once: indented, json's encoder is pure Python (ms a job)
        self.reserve(BASE_RESERVE_BYTES + 2 * len(data) + RESERVE_PER_TASK_BYTES * len(plan.tasks))
        self._write(data, final=False, use_reserve=True)
        self.document = document

    def tasks_started(self) -> None:
        """Every task was accepted and started on every host: job.json says when, so a job
        that got that far can be told from one that died starting. Best effort: a full disk
        skips it and keeps the reserve for the final document."""
        document = {**self.document, "tasks_started_at": time.time()}
        try:
            self.write(document, use_reserve=False)
        except OSError as exc:
            logger.debug("job.json: tasks_started_at not written (%s)", exc)
            return
        self.document = document

    def update(self, **fields: Any) -> None:
        """Best effort, as `tasks_started`: a full disk keeps the reserve for the final
        document (an attempt's start or end, a restart's wait)."""
        document = {**self.document, **fields}
        try:
            self.reserve(BASE_RESERVE_BYTES + 2 * len(encode(document)))
            self.write(document, use_reserve=False)
        except OSError as exc:
            logger.debug("job.json: %s not written (%s)", ", ".join(fields), exc)
            return
        self.document = document

    def finish(self, state: str, result: Mapping[str, Any], **fields: Any) -> None:
        document = {**self.document, **fields, "state": state, "result": dict(result)}
        self.write(document, final=True)
        self.document = document


class TaskLog:
    """One task's log file (0600). A write that fails, e.g. on a full disk, ends this log, not
    the job: `write` returns the reason once, and the caller warns."""

    def __init__(self, path: Path) -> None:
        self.path = path
        self.fd = -1
        self.error: str | None = None
        self.reported = False
        try:
            self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_TRUNC | os.O_CLOEXEC, FILE_MODE)
        except OSError as exc:
            self.error = _reason(exc)

    def write(self, data: bytes) -> str | None:
        """Append `data`; the reason the first time this log cannot be written, else None."""
        if self.fd >= 0:
            view = memoryview(data)
            try:
                while view:
                    view = view[os.write(self.fd, view) :]
            except OSError as exc:
                self.error = _reason(exc)
                self.close()
        if self.error is not None and not self.reported:
            self.reported = True
            return self.error
        return None

    def close(self) -> None:
        if self.fd >= 0:
            os.close(self.fd)
            self.fd = -1


# ---- the launcher, and jobs whose launcher died -------------------------------------------


SAME_START_S = 1.0  # a process started this close to a launcher's time after boot is it


def this_launcher(host: str) -> Launcher:
    """This process, as job.json records its launcher: a pid alone can be reused."""
    import psutil  # at the point of use: `dtrain --help`, ps and kill need none of it

    from dtrain.processes.launcher import Launcher

    me = psutil.Process()
    return Launcher(me.pid, host, create_time=me.create_time(), boot_time=psutil.boot_time())


def launcher_is_gone(launcher: Launcher, host: str) -> bool:
    """True when `launcher` ran on this host and no longer runs (a zombie is gone); False
    when alive or unknown.

    The same process is the pid started as long after boot as recorded: that span is what a
    step of the clock (which moves both times) leaves alone, and what a reboot or a reused
    pid changes."""
    if launcher.host != host:
        return False  # another machine's launcher (a shared log directory): cannot tell
    import psutil

    try:
        process = psutil.Process(launcher.pid)
        if process.status() in (psutil.STATUS_ZOMBIE, psutil.STATUS_DEAD):
            return True
        since_boot = process.create_time() - psutil.boot_time()
    except psutil.NoSuchProcess:
        return True
    except psutil.Error:  # not ours to look at: cannot tell
        return False
    if launcher.create_time is None or launcher.boot_time is None:
        return False  # an older job.json: the pid alone
    return abs(since_boot - (launcher.create_time - launcher.boot_time)) > SAME_START_S


def _read_document(job_file: Path) -> dict[str, Any] | None:
    """A job.json's document; None for anything else under its name (a FIFO would hang
    `dtrain ps`, /dev/zero fill its memory)."""
    try:
        source = InputFile(job_file, "--log-dir", "job file", "")
        document = json.loads(read_input(source, MAX_JOB_FILE_BYTES))
    except (InputFileError, ValueError):
        return None
    return document if isinstance(document, dict) and document.get("dtrain_job") else None


def _dead_job(job_dir: Path, document: Mapping[str, Any]) -> DeadLauncherJob | None:
    from dtrain.processes.launcher import DeadLauncherJob, Launcher

    launcher = Launcher.from_dict(document.get("launcher"))
    if launcher is None:
        return None
    return DeadLauncherJob(
        job_id=job_dir.name,
        log_dir=str(job_dir),
        launcher=launcher,
        started_at=document.get("started_at"),
    )


def mark_if_launcher_died(job_dir: Path, host: str) -> DeadLauncherJob | None:
    """If job.json says running but its launcher is gone, make it say launcher_died."""
    document = _read_document(job_dir / JOB_FILE)
    if document is None or document.get("state") != RUNNING:
        return None
    return _mark(job_dir, document, host)


def _mark(job_dir: Path, document: dict[str, Any], host: str) -> DeadLauncherJob | None:
    dead = _dead_job(job_dir, document)
    if dead is None or not launcher_is_gone(dead.launcher, host):
        return None
    document.update(state=LAUNCHER_DIED, launcher_died_noticed_at=time.time())
    try:
        JobFile(JobPaths(job_dir.parent, job_dir.name)).write(document, final=True)
    except OSError as exc:
        logger.debug("cannot mark %s as launcher_died: %s", job_dir, exc)
    return dead


def dead_launcher_jobs(root: Path, host: str, job: str | None = None) -> list[DeadLauncherJob]:
    """Jobs under `root` whose launcher died before recording their end, oldest first.

    Marks each newly found one in its job.json; unreadable directories (another user's) are
    skipped.
    """
    found = []
    for job_dir, document in _job_documents(root, job):
        state = document.get("state")
        dead = None
        if state == RUNNING:
            dead = _mark(job_dir, document, host)
        elif state == LAUNCHER_DIED:
            dead = _dead_job(job_dir, document)
        if dead is not None:
            found.append(dead)
    return found


def _job_documents(root: Path, job: str | None) -> Iterator[tuple[Path, dict[str, Any]]]:
    """Each job directory under `root` (only `job`'s, when given), oldest first, with its
    job.json's document; what is not a readable job directory is skipped."""
    try:
        entries = sorted(p for p in root.iterdir() if p.is_dir() and not p.is_symlink())
    except OSError:
        return
    for job_dir in entries:
        if job is not None and job_dir.name != job:
            continue
        document = _read_document(job_dir / JOB_FILE)
        if document is not None:
            yield job_dir, document


def launcher_is_running(launcher: Launcher, host: str) -> bool:
    """True only when `launcher` is surely the live process job.json names: on this host, its
    pid started as long after boot as recorded (what may be signalled)."""
    if launcher.host != host or launcher.create_time is None or launcher.boot_time is None:
        return False
    return not launcher_is_gone(launcher, host)


def running_launchers(root: Path, host: str, job: str | None = None) -> list[tuple[str, Launcher]]:
    """The jobs under `root` that may restart (--max-restarts), whose job.json says running and
    whose launcher runs here: `dtrain kill` stops the launcher first, so that the job ends for
    good (no restart), even while it waits between attempts with no task running."""
    from dtrain.processes.launcher import Launcher

    found = []
    for job_dir, document in _job_documents(root, job):
        if document.get("state") != RUNNING:
            continue
        if not document.get("max_restarts"):
            continue  # its tasks killed from outside end it: nothing would restart it
        launcher = Launcher.from_dict(document.get("launcher"))
        if launcher is not None and launcher_is_running(launcher, host):
            found.append((job_dir.name, launcher))
    return found


def stop_launchers(root: Path, host: str, job: str | None = None) -> list[tuple[str, int]]:
    """SIGTERM to the launcher of each running job under `root` launched here (a stop on
    purpose: never restarted); the jobs and pids told."""
    told = []
    for job_id, launcher in running_launchers(root, host, job):
        try:
            os.kill(launcher.pid, signal.SIGTERM)
        except OSError:  # gone meanwhile, or not ours
            continue
        told.append((job_id, launcher.pid))
    return told


def restart_states(root: Path, jobs: set[str]) -> dict[str, dict[str, Any]]:
    """For the running jobs named that may restart: which attempt runs (or when the next
    starts), for `dtrain ps`."""
    states = {}
    for job in sorted(jobs):
        document = _read_document(root / job / JOB_FILE)
        if document is None or document.get("state") != RUNNING:
            continue
        if not document.get("max_restarts"):
            continue
        states[job] = {
            "attempt": document.get("attempt"),
            "max_restarts": document.get("max_restarts"),
            "next_attempt_at": document.get("next_attempt_at"),
        }
    return states


def output_ages(root: Path, job: str, now: float) -> dict[str, float]:
    """Seconds since each task of a running job under `root` last wrote output, by task name
    (its log's modification time); empty when the job is not running from this machine."""
    document = _read_document(root / job / JOB_FILE)
    if document is None or document.get("state") != RUNNING:
        return {}
    ages = {}
    for task in (document.get("plan") or {}).get("tasks") or ():
        name, log = task.get("name"), task.get("log")
        if not isinstance(name, str) or not isinstance(log, str):
            continue
        try:
            ages[name] = max(0.0, now - (root / job / log).stat().st_mtime)
        except OSError:
            continue
    return ages
