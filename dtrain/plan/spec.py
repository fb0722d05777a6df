"""The plan of a job as plain data: which task runs where, with what argv and environment.

`tracker` builds a `JobPlan`; the supervisor runs it; `render` shows it. Pure.
"""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass, field
from enum import Enum

from dtrain.errors import UsageError
from dtrain.plan.hosts import Host, address_port


class Framework(str, Enum):
    DMLC = "dmlc"
    TF = "tf"
    TORCH = "torch"
    PADDLE = "paddle"

    @classmethod
    def parse(cls, text: str) -> Framework:
        """Accept the canonical names and the names users type (`mxnet`, `pytorch`, ...)."""
        key = text.strip().lower()
        if key in FRAMEWORK_ALIASES:
            return FRAMEWORK_ALIASES[key]
        names = ", ".join(sorted(FRAMEWORK_ALIASES))
        raise UsageError(
            f'unknown framework "{text}"',
            hint=f"--framework takes one of: {names}",
        )


FRAMEWORK_ALIASES: dict[str, Framework] = {
    "dmlc": Framework.DMLC,
    "mxnet": Framework.DMLC,
    "ps-lite": Framework.DMLC,
    "byteps": Framework.DMLC,
    "tf": Framework.TF,
    "tensorflow": Framework.TF,
    "torch": Framework.TORCH,
    "pytorch": Framework.TORCH,
    "paddle": Framework.PADDLE,
    "paddlepaddle": Framework.PADDLE,
}


class Role(str, Enum):
    SCHEDULER = "scheduler"
    SERVER = "server"
    WORKER = "worker"
    CHIEF = "chief"


@dataclass(frozen=True, slots=True)
class Endpoint:
    address: str
    port: int

    def __str__(self) -> str:
        return address_port(self.address, self.port)


@dataclass(frozen=True, slots=True)
class PlacedTask:
    """A task with its place decided but no environment yet: the planner's middle step.

    `node_rank` is the host's position among the hosts the job uses; `local_rank` and
    `local_size` count this task's role on its host (collective frameworks read them).
    """

    role: Role
    index: int
    host: Host
    node_rank: int
    local_rank: int
    local_size: int
    address: str = ""
    interface: str | None = None
    endpoint: Endpoint | None = None
    gpu: str | None = None


@dataclass(frozen=True, slots=True)
class TaskSpec:
    """One process of the job: what to run, where, and with which environment.

    `env` holds only what dtrain adds; the task also inherits its host's login environment.
    `name` is the task's identity in logs and in `DTRAIN_TASK` (`worker.1`); `label` adds the
    host in multi-host jobs (`worker.1@node2`).
    """

    role: Role
    index: int
    name: str
    host: Host
    address: str
    argv: tuple[str, ...]
    env: Mapping[str, str]
    label: str
    log_name: str
    workdir: str = "."
    endpoint: Endpoint | None = None
    gpu: str | None = None
    log_aliases: tuple[str, ...] = ()

    def to_dict(self) -> dict[str, object]:
        return {
            "name": self.name,
            "label": self.label,
            "role": self.role.value,
            "index": self.index,
            "host": self.host.to_dict(),
            "address": self.address,
            "endpoint": str(self.endpoint) if self.endpoint else None,
            "gpu": self.gpu,
            "argv": list(self.argv),
            "workdir": self.workdir,
            "env": dict(self.env),
            "log": self.log_name,
            "log_aliases": list(self.log_aliases),
        }


@dataclass(frozen=True, slots=True)
class JobPlan:
    """Everything the supervisor needs to start the job and decide how it ended.

    The job succeeds when every task whose role is in `finish_roles` exits 0; the other tasks
    (schedulers, parameter servers) then get `linger` to exit by themselves if
    `others_exit_by_themselves`, and are stopped otherwise: that is success, not failure.
    """

    job_id: str
    framework: Framework
    tasks: tuple[TaskSpec, ...]
    workdir: str
    rendezvous: Endpoint | None
    finish_roles: frozenset[Role]
    others_exit_by_themselves: bool
    sync_dst: str | None = None
    extra_files: Mapping[str, str] = field(default_factory=dict)
    notes: tuple[str, ...] = ()

    @property
    def hosts(self) -> tuple[Host, ...]:
        """Distinct hosts in first-use order."""
        seen: dict[str, Host] = {}
        for task in self.tasks:
            seen.setdefault(task.host.key, task.host)
        return tuple(seen.values())

    def tasks_by_id(self) -> dict[int, TaskSpec]:
        """The tasks by the id that tags their frames between launcher and agent."""
        return dict(enumerate(self.tasks))

    @property
    def is_multi_host(self) -> bool:
        return any(not host.is_local for host in self.hosts)

    def task(self, name: str) -> TaskSpec:
        for task in self.tasks:
            if task.name == name:
                return task
        raise KeyError(name)

    def to_dict(self) -> dict[str, object]:
        return {
            "job_id": self.job_id,
            "framework": self.framework.value,
            "workdir": self.workdir,
            "sync_dst": self.sync_dst,
            "rendezvous": str(self.rendezvous) if self.rendezvous else None,
            "finish_roles": sorted(role.value for role in self.finish_roles),
            "notes": list(self.notes),
            "tasks": [task.to_dict() for task in self.tasks],
        }
