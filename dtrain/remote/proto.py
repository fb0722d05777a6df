"""Frames exchanged between the launcher and an agent over one byte stream (a pipe or ssh channel).

A frame is `kind (1 byte) | task (2 bytes) | length (4 bytes) | payload`. Control frames carry
JSON; output frames carry a task's raw bytes. Standard library only, Python >= 3.6: this module
is sent to remote hosts with the agent.
"""

import json
import struct
from typing import Any, List, Tuple

HEADER = struct.Struct("!BHI")
MAX_PAYLOAD = 1 << 24

# launcher -> agent
REQUEST = 1  # JSON {"op": ...}
PING = 2  # heartbeat (both directions)
STOP = 3  # JSON {"grace_s": float}: TERM every task, KILL after the grace
KILL = 4  # KILL every task now
DATA = 5  # bulk bytes for the current request (e.g. a sync archive); empty payload ends it

# agent -> launcher
REPLY = 10  # JSON answer to a REQUEST: {"ok": true, ...} or {"error": "...", "hint": "..."}
STARTED = 11  # JSON {"pid", "pgid", "time"} for the task in the header
STDOUT = 12  # task output bytes
STDERR = 13
EXITED = 14  # JSON {"code", "signal", "stopped_by_dtrain", "reason", "detail", "time"}
NOTICE = 15  # JSON {"message"}: something the person at the launcher should know

# Every name both sides spell, spelled once. The agent, `dtrain.agents.ops` and the readers of
# replies and events use these; nothing else writes an op name or a field by hand.

# ops: the "op" field of a REQUEST, one handler each in the agent
OP = "op"
OP_HELLO = "hello"  # settings in, the host's facts out (HELLO_*)
OP_STAGE = "launch"  # check and keep the job's tasks (TASK_*); starts nothing
OP_START = "start"  # start every staged task
OP_SCAN = "scan"  # the job processes on the host (`dtrain ps`)
OP_KILL = "kill"  # stop them (`dtrain kill`)
OP_PROBE = "probe"  # the facts `dtrain doctor` compares
OP_LISTEN = "listen"  # open a TCP listener for the network probe
OP_UNLISTEN = "unlisten"
OP_CONNECT = "connect"  # connect to other hosts' listeners
OP_SYNC_PLAN = "sync_plan"  # which files of a manifest the host needs
OP_SYNC_PUT = "sync_put"  # receive them (DATA frames)
OP_STACKS = "stacks"  # every job process's Python stack (`dtrain stacks`), answered from a thread
OP_SETUP = (
    "setup"  # run the --setup commands; the host's tasks start from the environment they leave
)

# every REPLY
OK = "ok"
ERROR = "error"
HINT = "hint"

# the hello reply fields the launcher reads
HELLO_SSH_SERVER_ADDRESS = "ssh_server_address"
HELLO_INTERFACES = "interfaces"
HELLO_FREE_PORTS = "free_ports"

# one task of the stage request (its "tasks" list); "id" is the task field of its frames
STAGE_TASKS = "tasks"
TASK_ID = "id"
TASK_NAME = "name"
TASK_ARGV = "argv"
TASK_ENV = "env"
TASK_CWD = "cwd"
TASK_SCRIPT = "script"  # the Python or shell script the command runs, checked before start
TASK_SCRIPT_ON_PATH = "script_on_path"  # its program also looks for it on PATH (bash)

# the setup request; its output comes as STDOUT/STDERR frames of task SETUP_TASK, before the reply
SETUP_COMMANDS = "commands"
SETUP_JOB = "job_id"  # the tag its processes carry
SETUP_NAME = "name"  # their TASK_VAR: `setup@HOST`, one per host (two may share a machine)
SETUP_TIMEOUT_S = "timeout_s"  # the agent stops it, and answers, after this long
SETUP_TASK = 0xFFFF  # never a task's id

# STARTED, EXITED, NOTICE and STOP payloads
STARTED_PID = "pid"
STARTED_PGID = "pgid"
EVENT_TIME = "time"
EXITED_CODE = "code"
EXITED_SIGNAL = "signal"
EXITED_STOPPED_BY_DTRAIN = "stopped_by_dtrain"
EXITED_REASON = "reason"
EXITED_DETAIL = "detail"
NOTICE_MESSAGE = "message"
STOP_GRACE_S = "grace_s"

# EXITED reasons (none: the task exited by itself)
REASON_SPAWN_FAILED = "spawn-failed"
REASON_TRACEBACK_HANG = "traceback-hang"
REASON_LOST = "lost"  # set by the launcher: the task's host stopped answering

# the other replies' fields the launcher reads (doctor's probe facts are probe.py's document)
REPLY_TIME = "time"  # the host's clock when it answered
SCAN_PROCESSES = "processes"
SCAN_USER = "user"
SCAN_CPU_WINDOW_S = "cpu_window_s"  # request: measure each process's CPU % over this long
SCAN_CPU_PERCENT = "cpu_percent"  # each process: CPU % over that window (100: one core)
KILL_TERM = "term"  # pids gone after SIGTERM
KILL_KILL = "kill"  # pids gone after SIGKILL
KILL_GONE = "gone"  # pids gone before they were signalled
KILL_SURVIVORS = "survivors"  # [{"pid", "reason"}]: still there after SIGKILL
LISTEN_ADDRESS = "address"
LISTEN_PORT = "port"
CONNECT_TARGETS = "targets"  # request: [{"to", "address", "port"}]
CONNECT_RESULTS = "results"  # reply: each target with "ok", "error", "elapsed_s"
SYNC_NEED = "need"
SYNC_WRITTEN = "written"
STACKS_JOB = "job"
STACKS_NATIVE = "native"
STACKS_PER_PROCESS_S = "per_process_s"
STACKS_PROCESSES = "processes"  # each: pid, tags, python, tool, threads or error
PROBE_STACKS = "stacks"  # doctor: {"tool", "looked_in", "ptrace_scope"}
PROBE_PORT_HOLDERS = "port_holders"
PROBE_FIREWALL_TOOLS = "firewall_tools"

# tag variables: every task's environment carries them; `ps`, `kill` and cleanup find by them
JOB_ID_VAR = "DTRAIN_JOB_ID"
TASK_VAR = "DTRAIN_TASK"
ROLE_VAR = "DMLC_ROLE"  # parameter-server processes, however they were started
TAG_VARS = (JOB_ID_VAR, TASK_VAR, ROLE_VAR)

# The variables dtrain computes for each framework's tasks (ranks, roles, addresses), by the
# framework's name. The agent takes every one of them, of any framework, out of the environment
# a task inherits (the launcher's own on this machine, a host's login environment): a task gets
# only the values its plan sets, never a stale id (BytePS's launcher leaks DMLC_WORKER_ID).
MANAGED_VARS = {
    "dmlc": (
        ROLE_VAR,
        "DMLC_PS_ROOT_URI",
        "DMLC_PS_ROOT_PORT",
        "DMLC_NUM_WORKER",
        "DMLC_NUM_SERVER",
        "DMLC_NODE_HOST",
        "DMLC_SERVER_ID",
        "DMLC_WORKER_ID",
        "DMLC_RANK",
    ),
    "tf": ("TF_CONFIG",),
    "torch": (
        "MASTER_ADDR",
        "MASTER_PORT",
        "RANK",
        "WORLD_SIZE",
        "LOCAL_RANK",
        "LOCAL_WORLD_SIZE",
        "GROUP_RANK",
        "GROUP_WORLD_SIZE",
        "ROLE_RANK",
        "ROLE_WORLD_SIZE",
        "ROLE_NAME",
    ),
    "paddle": (
        "PADDLE_TRAINER_ID",
        "PADDLE_TRAINERS_NUM",
        "PADDLE_TRAINER_ENDPOINTS",
        "PADDLE_CURRENT_ENDPOINT",
        "PADDLE_LOCAL_RANK",
        "PADDLE_RANK_IN_NODE",
        "PADDLE_LOCAL_SIZE",
        "PADDLE_NNODES",
        "PADDLE_ROLE",
        "TRAINING_ROLE",
        "PADDLE_PORT",
        "POD_IP",
        "PADDLE_PSERVERS_IP_PORT_LIST",
        "PADDLE_PSERVER_ID",
        "PADDLE_MASTER",
        "FLAGS_selected_gpus",
    ),
}


def encode(kind: int, payload: bytes = b"", task: int = 0) -> bytes:
    return HEADER.pack(kind, task, len(payload)) + payload


def encode_json(kind: int, obj: "Any", task: int = 0) -> bytes:
    return encode(kind, json.dumps(obj, separators=(",", ":")).encode("ascii"), task)


def decode_json(payload: bytes) -> "Any":
    """A control frame's JSON; a FrameError if it is not JSON."""
    try:
        return json.loads(payload.decode("utf-8"))
    except ValueError as exc:  # UnicodeDecodeError and JSONDecodeError among them
        raise FrameError("a frame that is not JSON: %s" % exc) from None


class FrameError(Exception):
    pass


class FrameReader:
    """Reassembles frames from arbitrarily split reads."""

    def __init__(self) -> None:
        self._buffer = bytearray()

    def feed(self, data: bytes) -> "List[Tuple[int, int, bytes]]":
        """Add bytes; return the complete frames as (kind, task, payload) tuples."""
        self._buffer += data
        frames = []  # type: List[Tuple[int, int, bytes]]
        offset = 0
        size = len(self._buffer)
        while size - offset >= HEADER.size:
            kind, task, length = HEADER.unpack_from(self._buffer, offset)
            if length > MAX_PAYLOAD:
                raise FrameError("frame of %d bytes is larger than the limit" % length)
            end = offset + HEADER.size + length
            if end > size:
                break
            frames.append((kind, task, bytes(self._buffer[offset + HEADER.size : end])))
            offset = end
        if offset:
            del self._buffer[:offset]
        return frames
