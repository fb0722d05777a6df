"""What `dtrain` says when a host's port answers, but not as an ssh server, and which failures
it tries again.

Real listeners on 127.0.0.1 stand in for the wrong port: each counts the connections it
accepts, so a retry shows as a second connection (no timing in any assertion).
"""

from __future__ import annotations

import json
import os
import signal
import socket
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import paramiko
import pytest

from dtrain.errors import ExitCode
from tests.conftest import run_dtrain, start_dtrain, wait_gone


class Listener:
    """A TCP server on 127.0.0.1 that answers every connection with `greeting`, then holds
    it open (or closes it, with `close_after`). Never speaks ssh."""

    def __init__(self, greeting: bytes = b"", close_after: bool = False) -> None:
        self.greeting = greeting
        self.close_after = close_after
        self.accepted = 0
        self.server = socket.create_server(("127.0.0.1", 0))
        self.server.settimeout(0.2)
        self.port: int = self.server.getsockname()[1]
        self.held: list[socket.socket] = []
        self.stopping = threading.Event()
        self.thread = threading.Thread(target=self._serve, daemon=True)
        self.thread.start()

    def _serve(self) -> None:
        while not self.stopping.is_set():
            try:
                conn, _ = self.server.accept()
            except TimeoutError:
                continue
            self.accepted += 1
            self.answer(conn)

    def answer(self, conn: socket.socket) -> None:
        if self.greeting:
            conn.sendall(self.greeting)
        if self.close_after:
            conn.close()
        else:
            self.held.append(conn)

    def stop(self) -> None:
        self.stopping.set()
        self.thread.join(timeout=5)
        for conn in self.held:
            conn.close()
        self.server.close()


@pytest.fixture
def listener_factory() -> Iterator[type[Listener]]:
    started: list[Listener] = []

    class Started(Listener):
        def __init__(self, greeting: bytes = b"", close_after: bool = False) -> None:
            super().__init__(greeting, close_after)
            started.append(self)

    yield Started
    for listener in started:
        listener.stop()


def launch_on(tmp_path: Path, port: int, *extra: str) -> tuple[int, list[str]]:
    (tmp_path / "hosts").write_text(f"127.0.0.1:{port}\n")
    args = ["launch", "-n", "1", "-H", "hosts", "--ssh-config", "/dev/null", *extra, "--", "true"]
    result = run_dtrain(args, tmp_path, timeout_s=60)
    assert result.stdout == ""
    return result.returncode, result.stderr.splitlines()


HINT = (
    "    hint: check the port: is {port} where sshd listens on 127.0.0.1? "
    "(host:port in the hosts file, or Port in your ssh config)"
)


def test_a_silent_port_is_one_line_no_retry(
    tmp_path: Path, listener_factory: type[Listener]
) -> None:
    silent = listener_factory()
    code, lines = launch_on(tmp_path, silent.port, "--connect-timeout", "1")
    assert code == ExitCode.ENVIRONMENT
    assert lines == [
        "dtrain: cannot reach 1 of 1 host; nothing was started",
        f"  127.0.0.1:{silent.port} is not an ssh server: no SSH banner within 1 s",
        HINT.format(port=silent.port),
    ]
    assert silent.accepted == 1


@pytest.mark.parametrize("close_after", [False, True])
def test_a_port_that_speaks_another_protocol_is_quoted(
    tmp_path: Path, listener_factory: type[Listener], close_after: bool
) -> None:
    web = listener_factory(b"HTTP/1.1 400 Bad Request\r\n\r\n", close_after=close_after)
    code, lines = launch_on(tmp_path, web.port)
    assert code == ExitCode.ENVIRONMENT
    assert lines[1:] == [
        f'  127.0.0.1:{web.port} is not an ssh server: it answered "HTTP/1.1 400 Bad Request" '
        "instead of an SSH banner",
        HINT.format(port=web.port),
    ]
    assert web.accepted == 1


def test_a_connection_closed_before_the_banner_is_tried_again(
    tmp_path: Path, listener_factory: type[Listener]
) -> None:
    """sshd drops connections beyond MaxStartups this way: a second try can succeed."""
    dropping = listener_factory(close_after=True)
    code, lines = launch_on(tmp_path, dropping.port)
    assert code == ExitCode.ENVIRONMENT
    assert lines[1] == (
        f"  127.0.0.1:{dropping.port}: the server closed the connection before its SSH banner"
    )
    assert dropping.accepted == 2


def test_paramiko_logs_only_with_debug(tmp_path: Path, listener_factory: type[Listener]) -> None:
    web = listener_factory(b"HTTP/1.1 400 Bad Request\r\n\r\n", close_after=True)
    (tmp_path / "hosts").write_text(f"127.0.0.1:{web.port}\n")
    args = ["launch", "-n", "1", "-H", "hosts", "--ssh-config", "/dev/null", "--", "true"]
    quiet = run_dtrain(args, tmp_path, timeout_s=60)
    assert "paramiko" not in quiet.stderr and "Traceback" not in quiet.stderr
    debug = run_dtrain(["--debug", *args], tmp_path, timeout_s=60)
    assert "dtrain: paramiko.transport: " in debug.stderr


def test_doctor_names_the_wrong_port_and_never_says_to_run_doctor(
    tmp_path: Path, listener_factory: type[Listener]
) -> None:
    silent = listener_factory()
    (tmp_path / "hosts").write_text(f"127.0.0.1:{silent.port}\n")
    args = ["doctor", "-H", "hosts", "--ssh-config", "/dev/null", "--connect-timeout", "1"]
    result = run_dtrain(args, tmp_path, timeout_s=60)
    assert result.returncode == ExitCode.ENVIRONMENT
    finding = f"FAIL 127.0.0.1 ssh: 127.0.0.1:{silent.port} is not an ssh server: "
    assert finding + "no SSH banner within 1 s" in result.stdout
    assert "dtrain doctor" not in result.stdout
    assert "paramiko" not in result.stderr


@pytest.fixture
def closed_port() -> Iterator[int]:
    """A port bound on every address but never listening: connecting anywhere is refused,
    and nothing else can take it while the test runs."""
    with socket.socket() as held:
        held.bind(("0.0.0.0", 0))
        yield held.getsockname()[1]


def test_many_refused_hosts_print_one_line_and_keep_one_json_error_each(
    tmp_path: Path, closed_port: int
) -> None:
    names = [f"127.3.0.{i}" for i in range(1, 41)]
    (tmp_path / "hosts").write_text("".join(f"{name}:{closed_port}\n" for name in names))
    args = ["launch", "-n", "40", "-H", "hosts", "--ssh-config", "/dev/null", "--", "true"]
    result = run_dtrain(args, tmp_path, timeout_s=60)
    assert result.returncode == ExitCode.ENVIRONMENT
    assert result.stderr.splitlines() == [
        "dtrain: cannot reach 40 of 40 hosts; nothing was started",
        f"  40 hosts: connection refused: 127.3.0.1:{closed_port}, 127.3.0.2:{closed_port}, "
        f"127.3.0.3:{closed_port} and 37 more",
        "    hint: is sshd running on these hosts and listening on the port shown?",
    ]
    document = json.loads(run_dtrain([*args[:1], "--json", *args[1:]], tmp_path).stdout)
    assert [e["host"] for e in document["errors"]] == names
    assert {e["code"] for e in document["errors"]} == {"refused"}
    assert document["errors"][0]["message"] == f"127.3.0.1:{closed_port}: connection refused"


def test_doctor_prints_one_finding_for_hosts_refused_alike(
    tmp_path: Path, closed_port: int
) -> None:
    names = [f"127.3.0.{i}" for i in range(1, 41)]
    (tmp_path / "hosts").write_text("".join(f"{name}:{closed_port}\n" for name in names))
    args = ["doctor", "-H", "hosts", "--ssh-config", "/dev/null"]
    result = run_dtrain(args, tmp_path, timeout_s=60)
    assert result.returncode == ExitCode.ENVIRONMENT
    findings = [line for line in result.stdout.splitlines() if line.startswith("FAIL")]
    assert findings == [
        f"FAIL ssh: 40 hosts: connection refused: 127.3.0.1:{closed_port}, "
        f"127.3.0.2:{closed_port}, 127.3.0.3:{closed_port} and 37 more"
    ]
    document = json.loads(run_dtrain([*args, "--json"], tmp_path, timeout_s=60).stdout)
    failed = [r["host"] for r in document["data"]["results"] if r["status"] == "fail"]
    assert failed == names
    assert len(document["errors"]) == 40


BANNER = b"SSH-2.0-OpenSSH_9.2p1\r\n"


def test_a_banner_then_silence_is_one_sentence_and_not_tried_again(
    tmp_path: Path, listener_factory: type[Listener]
) -> None:
    """paramiko's handshake runs out of time as "No existing session"; tried again, the
    user waited twice the timeout for it."""
    mute = listener_factory(BANNER)
    code, lines = launch_on(tmp_path, mute.port, "--connect-timeout", "1")
    assert code == ExitCode.ENVIRONMENT
    assert lines[1:] == [
        f"  127.0.0.1:{mute.port}: no answer to the key exchange within 1 s after its banner "
        '"SSH-2.0-OpenSSH_9.2p1"',
        "    hint: the server took the connection, then went silent: check its load and its "
        "sshd log, and for a firewall that lets only a connection's first packets through",
    ]
    assert mute.accepted == 1


def test_a_banner_then_a_close_is_one_sentence_without_waiting_for_the_timeout(
    tmp_path: Path, listener_factory: type[Listener]
) -> None:
    """Not `EOFError:` or a reset's errno; tried once more, as a close before the banner
    (MaxStartups), and never waited on: the run's own bound is far below --connect-timeout."""
    closing = listener_factory(BANNER, close_after=True)
    (tmp_path / "hosts").write_text(f"127.0.0.1:{closing.port}\n")
    args = ["launch", "-n", "1", "-H", "hosts", "--ssh-config", "/dev/null"]
    result = run_dtrain([*args, "--connect-timeout", "120", "--", "true"], tmp_path, timeout_s=60)
    assert result.returncode == ExitCode.ENVIRONMENT
    assert result.stderr.splitlines()[1] == (
        f"  127.0.0.1:{closing.port}: the server closed the connection during the ssh "
        'handshake after its banner "SSH-2.0-OpenSSH_9.2p1"'
    )
    assert closing.accepted == 2


def proxy_config(tmp_path: Path, command: str) -> Path:
    config = tmp_path / "ssh_config"
    config.write_text(f"Host gpu9\n  ProxyCommand {command}\n")
    (tmp_path / "hosts").write_text("gpu9\n")
    return config


PROXY_HINT = (
    "    hint: run the ProxyCommand by hand (`{command}`): it must carry the connection to "
    "sshd on gpu9 port 22 over its stdin and stdout"
)


@pytest.mark.parametrize(
    ("command", "said"),
    [
        ("sh -c 'echo no route to gpu9 >&2; exit 1'", "exited with 1: no route to gpu9"),
        ("true", "exited with 0 before the server's SSH banner"),
        ("sleep 60", "no SSH banner within 1 s through ProxyCommand `sleep 60`"),
    ],
)
def test_a_proxycommand_that_fails_ends_or_hangs_is_named_with_what_to_do(
    tmp_path: Path, command: str, said: str
) -> None:
    config = proxy_config(tmp_path, command)
    args = ["launch", "-n", "1", "-H", "hosts", "--ssh-config", str(config)]
    result = run_dtrain([*args, "--connect-timeout", "1", "--", "true"], tmp_path)
    assert result.returncode == ExitCode.ENVIRONMENT
    lines = result.stderr.splitlines()
    message = said if said.startswith("no SSH") else f"ProxyCommand `{command}` {said}"
    assert lines[1:] == [f"  gpu9:22: {message}", PROXY_HINT.format(command=command)]


def test_a_failing_jump_host_is_named_not_the_host_behind_it(
    tmp_path: Path, listener_factory: type[Listener]
) -> None:
    hop = listener_factory()
    config = tmp_path / "ssh_config"
    config.write_text(f"Host gpu9\n  HostName 127.0.0.9\n  ProxyJump 127.0.0.1:{hop.port}\n")
    (tmp_path / "hosts").write_text("gpu9\n")
    args = ["launch", "-n", "1", "-H", "hosts", "--ssh-config", str(config)]
    result = run_dtrain([*args, "--connect-timeout", "1", "--", "true"], tmp_path)
    assert result.returncode == ExitCode.ENVIRONMENT
    assert result.stderr.splitlines()[1:] == [
        f"  gpu9 (127.0.0.9:22): via jump host 127.0.0.1:{hop.port} is not an ssh server: "
        "no SSH banner within 1 s",
        HINT.format(port=hop.port),
    ]
    assert hop.accepted == 1


class KeyOnlyServer(Listener):
    """paramiko's own ssh server on 127.0.0.1: a real key exchange, then it asks for a key."""

    def __init__(self) -> None:
        self.key = paramiko.RSAKey.generate(1024)
        self.transports: list[paramiko.Transport] = []
        super().__init__()

    def answer(self, conn: socket.socket) -> None:
        transport = paramiko.Transport(conn)
        transport.add_server_key(self.key)
        self.transports.append(transport)
        transport.start_server(server=KeysOnly())

    def stop(self) -> None:
        super().stop()
        for transport in self.transports:
            transport.close()


class KeysOnly(paramiko.ServerInterface):
    def get_allowed_auths(self, username: str) -> str:
        return "publickey"


@pytest.fixture
def key_only_server() -> Iterator[KeyOnlyServer]:
    server = KeyOnlyServer()
    yield server
    server.stop()


def test_no_key_to_offer_is_a_sentence_with_what_to_do(
    tmp_path: Path, key_only_server: KeyOnlyServer
) -> None:
    """paramiko says "No authentication methods available" (and was asked twice)."""
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host gpu9\n  HostName 127.0.0.1\n  Port {key_only_server.port}\n  User trainer\n"
        f"  IdentityFile {tmp_path}/id_missing\n  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {tmp_path}/known_hosts\n  StrictHostKeyChecking no\n"
    )
    (tmp_path / "hosts").write_text("gpu9\n")
    args = ["launch", "-n", "1", "-H", "hosts", "--ssh-config", str(config), "--", "true"]
    result = run_dtrain(args, tmp_path)
    assert result.returncode == ExitCode.ENVIRONMENT
    assert result.stderr.splitlines()[1:] == [
        f"  gpu9 (127.0.0.1:{key_only_server.port}): no ssh key to log in with as trainer "
        f"(IdentityFile {tmp_path}/id_missing not found, and ssh-agent is not asked)",
        "    hint: make a key (ssh-keygen -t ed25519) and install it on gpu9 (ssh-copy-id -p "
        f"{key_only_server.port} trainer@127.0.0.1), or name yours with IdentityFile in your "
        "ssh config",
    ]
    assert key_only_server.accepted == 1


def wait_until(condition: Callable[[], bool], what: str, timeout_s: float = 30) -> None:
    deadline = time.monotonic() + timeout_s
    while not condition():
        assert time.monotonic() < deadline, f"{what} did not happen within {timeout_s}s"
        time.sleep(0.05)


def holding_config(
    tmp_path: Path, listener_factory: type[Listener], holder: str
) -> tuple[Path, Callable[[], bool]]:
    """An ssh config whose host gpu9 holds a connection up as `holder` says, and whether that
    connection has begun; a ProxyCommand writes its pid and its child's to proxy.pids."""
    (tmp_path / "hosts").write_text("gpu9\n")
    pids = tmp_path / "proxy.pids"
    if holder == "ProxyCommand":
        script = f"echo $$ > {pids}; sleep 120 & echo $! >> {pids}; wait"
        config = proxy_config(tmp_path, f"sh -c '{script}'")
        return config, lambda: pids.exists() and len(pids.read_text().split()) == 2
    listener = listener_factory(BANNER if holder.startswith("banner") else b"")
    config = tmp_path / "ssh_config"
    config.write_text(f"Host gpu9\n  HostName 127.0.0.1\n  Port {listener.port}\n")
    return config, lambda: listener.accepted > 0


@pytest.mark.parametrize("holder", ["silent port", "banner, then silence", "ProxyCommand"])
def test_ctrl_c_while_connecting_stops_at_once_and_leaves_nothing(
    tmp_path: Path, listener_factory: type[Listener], holder: str
) -> None:
    """However a host holds the connection up (a port that never speaks, a banner and then
    silence, a ProxyCommand that hangs, with a child of its own), the first Ctrl-C ends
    dtrain with 130 long before the connect timeout (120 s), and no ProxyCommand is left."""
    config, connecting = holding_config(tmp_path, listener_factory, holder)
    pids = tmp_path / "proxy.pids"
    args = ["launch", "-n", "1", "-H", "hosts", "--ssh-config", str(config)]
    proc = start_dtrain([*args, "--connect-timeout", "120", "--", "true"], tmp_path)
    left: list[int] = []
    try:
        wait_until(connecting, "the connection")
        time.sleep(1.0)  # well into the handshake's wait
        proc.send_signal(signal.SIGINT)
        _, stderr = proc.communicate(timeout=15)
        assert proc.returncode == 130, stderr
        assert "dtrain: interrupted" in stderr
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
        if pids.exists():
            left = wait_gone([int(pid) for pid in pids.read_text().split()], 5)
            for pid in left:
                os.kill(pid, signal.SIGKILL)
    assert left == [], "a ProxyCommand outlived dtrain"
