"""A Slurm allocation as dtrain's hosts: node lists, task counts, the agents' job step (pure).

Slurm hands a job its nodes as a compressed host list (`SLURM_JOB_NODELIST=gpu[01-04],cpu7`)
and the tasks per node as run-length counts (`SLURM_TASKS_PER_NODE=4(x3),2`). dtrain uses the
nodes as its hosts and the task counts as their slots, so `dtrain launch` with no -H runs what
`srun` would run in the same allocation. The launcher expands the list with `scontrol show
hostnames` where it can (Slurm's own reading); `expand_hostlist` is the same grammar, for when
scontrol is missing and for tests.
"""

from __future__ import annotations

import re
from collections.abc import Mapping, Sequence
from dataclasses import dataclass

from dtrain.errors import UsageError
from dtrain.plan.hosts import Host

MAX_NODES = 100_000  # more than any cluster: a typo in a range cannot expand for minutes
NODELIST_VAR = "SLURM_JOB_NODELIST"
TASKS_PER_NODE_VAR = "SLURM_TASKS_PER_NODE"
JOB_ID_VAR = "SLURM_JOB_ID"
# Set inside every step's tasks, so `dtrain launch` inside `srun --pty bash` knows it too.
STEP_ID_VAR = "SLURM_STEP_ID"

_RANGE = re.compile(r"(\d+)(?:-(\d+))?\Z")
_COUNT = re.compile(r"(\d+)(?:\(x(\d+)\))?\Z")


@dataclass(frozen=True)
class Allocation:
    """The Slurm job dtrain runs in: its id, its nodes in Slurm's order, tasks on each."""

    job_id: str
    nodes: tuple[str, ...]
    tasks_per_node: tuple[int, ...]

    def hosts(self) -> tuple[Host, ...]:
        """The nodes as hosts: slots are the tasks Slurm planned on each (what srun runs)."""
        return tuple(
            Host(name=node, slots=tasks)
            for node, tasks in zip(self.nodes, self.tasks_per_node, strict=True)
        )

    def summary(self) -> str:
        """`4 nodes h[1-4]`-style: the count and the list as Slurm wrote it (or the names)."""
        count = len(self.nodes)
        return f"{count} node{'s' if count != 1 else ''} {', '.join(self.nodes)}"


def in_allocation(env: Mapping[str, str]) -> bool:
    """Inside `salloc`, `sbatch` or a step: Slurm set the job's id and node list."""
    return bool(env.get(JOB_ID_VAR)) and bool(env.get(NODELIST_VAR))


def _split_top(text: str) -> list[str]:
    """Split at commas outside brackets: `a[1,3],b` -> [`a[1,3]`, `b`]."""
    parts, depth, start = [], 0, 0
    for i, char in enumerate(text):
        if char == "[":
            depth += 1
        elif char == "]":
            depth -= 1
            if depth < 0:
                raise ValueError("a ']' without its '['")
        elif char == "," and depth == 0:
            parts.append(text[start:i])
            start = i + 1
    if depth:
        raise ValueError("a '[' without its ']'")
    parts.append(text[start:])
    return parts


def _expand_ranges(body: str) -> list[str]:
    """`01-03,7` -> [`01`, `02`, `03`, `7`]: a range keeps its first number's zero padding."""
    numbers: list[str] = []
    for item in body.split(","):
        match = _RANGE.match(item.strip())
        if match is None:
            raise ValueError(f'"[{body}]" holds "{item}", not a number or a range a-b')
        low, high = match.group(1), match.group(2) or match.group(1)
        if int(high) < int(low):
            raise ValueError(f'the range "{item}" counts down')
        if int(high) - int(low) + len(numbers) >= MAX_NODES:
            raise ValueError(f'the range "{item}" names more than {MAX_NODES} nodes')
        width = len(low)
        numbers += [str(n).zfill(width) for n in range(int(low), int(high) + 1)]
    return numbers


def _expand_one(name: str) -> list[str]:
    """One host expression, with any number of bracket groups: `r[1-2]n[1-2]` -> 4 names."""
    open_at = name.find("[")
    if open_at < 0:
        if "]" in name:
            raise ValueError("a ']' without its '['")
        return [name]
    close_at = name.find("]", open_at)
    prefix, body, rest = name[:open_at], name[open_at + 1 : close_at], name[close_at + 1 :]
    tails = _expand_one(rest)
    if len(tails) * len(body.split(",")) > MAX_NODES:
        raise ValueError(f"names more than {MAX_NODES} nodes")
    return [prefix + number + tail for number in _expand_ranges(body) for tail in tails]


def expand_hostlist(expression: str) -> tuple[str, ...]:
    """Slurm's host list grammar, in Slurm's order (duplicates kept, as scontrol does).

    Raises UsageError naming the variable's text and what is wrong with it.
    """
    names: list[str] = []
    try:
        for part in _split_top(expression.strip()):
            if not part.strip():
                raise ValueError("an empty name between commas")
            names += _expand_one(part.strip())
            if len(names) > MAX_NODES:
                raise ValueError(f"names more than {MAX_NODES} nodes")
    except ValueError as exc:
        raise UsageError(
            f'cannot read the Slurm node list "{expression}": {exc}',
            hint="run `scontrol show hostnames` on it to see what Slurm makes of it",
        ) from None
    return tuple(names)


def expand_counts(text: str, expected: int) -> tuple[int, ...]:
    """`SLURM_TASKS_PER_NODE`'s run-length form: `2(x3),1` -> (2, 2, 2, 1)."""
    counts: list[int] = []
    for item in text.split(","):
        match = _COUNT.match(item.strip())
        if match is None:
            raise UsageError(
                f'cannot read {TASKS_PER_NODE_VAR}="{text}": "{item}" is not N or N(xM)'
            )
        repeat = int(match.group(2) or 1)
        if len(counts) + repeat > expected:
            counts += [0] * (expected + 1 - len(counts))  # more than the nodes: say so below
            break
        counts += [int(match.group(1))] * repeat
    if len(counts) != expected:
        raise UsageError(
            f'{TASKS_PER_NODE_VAR}="{text}" counts {len(counts)} node(s), the node list {expected}',
            hint="run dtrain inside the allocation whose variables these are",
        )
    if not any(counts):  # no node has a slot: there is nowhere to place a task
        raise UsageError(
            f'{TASKS_PER_NODE_VAR}="{text}" gives no node a task',
            hint="run dtrain inside an allocation with at least one task (salloc -n N)",
        )
    return tuple(counts)


def allocation_from(env: Mapping[str, str], nodes: Sequence[str]) -> Allocation:
    """The allocation these variables describe, its node list already expanded."""
    if not nodes:
        raise UsageError(
            f'{NODELIST_VAR}="{env.get(NODELIST_VAR, "")}" names no node',
            hint="run dtrain inside the allocation (salloc, sbatch), or pass -H hosts",
        )
    text = env.get(TASKS_PER_NODE_VAR) or f"1(x{len(nodes)})"
    return Allocation(env.get(JOB_ID_VAR, ""), tuple(nodes), expand_counts(text, len(nodes)))


def agent_step_argv(
    nodes: Sequence[str] | None,
    count: int,
    command: Sequence[str],
    job_name: str,
    srun_args: Sequence[str] = (),
) -> list[str]:
    """The one `srun` that runs `command` (an agent) on each node: one task per node, one step.

    `nodes` pins the step to those nodes inside an allocation; None lets srun make the
    allocation (`--launcher slurm --nodes N`), with the user's own srun options. `--overlap`
    lets `dtrain ps` and `dtrain kill` run a step beside it; no `--exact`, so each agent's step
    has all of the job's CPUs and GPUs on its node for the tasks it starts; `--input=none`
    because agents talk to the launcher over their own connection, not srun's stdio.
    """
    argv = ["srun", f"--nodes={count}", f"--ntasks={count}", "--ntasks-per-node=1"]
    if nodes is not None:
        argv.append(f"--nodelist={','.join(nodes)}")
    argv += ["--overlap", "--input=none", "--kill-on-bad-exit=0", f"--job-name={job_name}"]
    return [*argv, *srun_args, *command]
