"""`--setup` on one host: the agent runs the commands, the launcher shows their output.

The agent owns the setup's processes (a process group tagged with the job's id): it stops
them when they run past their time, when the launcher goes away (Ctrl-C, a failed launch,
dtrain killed) and when the job ends. The launcher only asks, shows, and keeps the agent's
lease alive meanwhile.
"""

from __future__ import annotations

from collections.abc import Callable, Sequence

from dtrain.agents.session import AgentSession
from dtrain.remote import proto

SetupOutput = Callable[[str, bytes], None]
"""(the host as shown, bytes the setup wrote): called on the session's reader thread."""

REPLY_MARGIN_S = 15.0  # past the setup's own time, before a silent host counts as lost
PING_S = 1.0  # the agents' lease runs meanwhile: the job's heartbeat starts after the setup


def setup_name(host: str) -> str:
    """The setup's DTRAIN_TASK on `host`: its own, as two hosts may be one machine."""
    return f"setup@{host}"


def run_setup(
    session: AgentSession,
    commands: Sequence[str],
    job_id: str,
    timeout_s: float,
    output: SetupOutput | None = None,
) -> None:
    """Run the setup on the session's host; a `RemoteError` naming the command if it fails
    or runs past `timeout_s`. Its output, stdout and stderr alike, goes to `output`. The
    caller keeps the agents' heartbeat going meanwhile (`PING_S`)."""
    shown = session.host.display

    def relay(task: int, kind: int, data: bytes) -> None:
        if output is not None and task == proto.SETUP_TASK:
            output(shown, data)

    session.output = relay
    try:
        # the fields are proto.SETUP_COMMANDS, SETUP_JOB, SETUP_NAME and SETUP_TIMEOUT_S
        session.send_request(
            proto.OP_SETUP,
            commands=list(commands),
            job_id=job_id,
            name=setup_name(session.host.display),
            timeout_s=timeout_s,
        )
        session.reply_to(proto.OP_SETUP, timeout_s + REPLY_MARGIN_S)
    finally:
        session.output = None
