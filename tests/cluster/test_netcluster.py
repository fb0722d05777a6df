"""Tests of the ssh test cluster itself: isolation, reachability, every fault, clean teardown."""

from __future__ import annotations

import contextlib
import os
import re
import select
import socket
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from pathlib import Path
from typing import IO

import paramiko
import pytest

from . import netcluster
from .netcluster import (
    BRIDGE_ADDRESS,
    NAME_PREFIX,
    WORKDIR_PREFIX,
    Cluster,
    ClusterError,
    CommandFailed,
    HostProcess,
    host_address,
)

# A tiny TCP server for a host: prints "ready" once listening, answers each connection with
# its hostname. Runs with this interpreter; the filesystem is shared between hosts.
SERVER = """
import socket, sys
s = socket.socket()
s.setsockopt(socket.SOL_SOCKET, socket.SO_REUSEADDR, 1)
s.bind(("0.0.0.0", int(sys.argv[1])))
s.listen()
print("ready", flush=True)
while True:
    c, _ = s.accept()
    c.sendall(socket.gethostname().encode())
    c.close()
"""
CLIENT = """
import socket, sys
with socket.create_connection((sys.argv[1], int(sys.argv[2])), timeout=3) as s:
    print(s.recv(100).decode())
"""
PORT = 9050  # inside the 9000-9100 range the firewall tests use
ROOT_SUPERUSER_PATH = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin"


def wait_for(predicate: Callable[[], bool], timeout_s: float = 5.0, what: str = "it") -> None:
    deadline = time.monotonic() + timeout_s
    while not predicate():
        if time.monotonic() > deadline:
            raise AssertionError(f"timed out after {timeout_s}s waiting for {what}")
        time.sleep(0.01)


def read_line(stream: IO[bytes] | None, timeout_s: float) -> str:
    """One line from a pipe, or "" if none arrives in time (never blocks past the bound)."""
    assert stream is not None
    fd = stream.fileno()
    buf = b""
    deadline = time.monotonic() + timeout_s
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0 or not select.select([fd], [], [], left)[0]:
            return ""
        chunk = os.read(fd, 1)
        if not chunk:
            return buf.decode()
        buf += chunk
    return buf.decode()


def start_server(cluster: Cluster, host: str, port: int = PORT) -> HostProcess:
    proc = cluster.spawn(host, [sys.executable, "-c", SERVER, str(port)], stdout=subprocess.PIPE)
    assert read_line(proc.popen.stdout, 10) == "ready\n"
    return proc


def connect_from_root(address: str, port: int, timeout_s: float) -> bytes:
    with socket.create_connection((address, port), timeout=timeout_s) as s:
        return s.recv(100)


def ssh_all(cluster: Cluster, cmd: str) -> dict[str, subprocess.CompletedProcess[str]]:
    """Run `cmd` over ssh on every host at once (each login costs ~0.25 s of CPU)."""
    with ThreadPoolExecutor(len(cluster.hosts)) as pool:
        results = pool.map(lambda h: cluster.ssh_run(h, cmd), cluster.hosts)
        return {h.name: r for h, r in zip(cluster.hosts, results, strict=False)}


@contextmanager
def ssh_session(cluster: Cluster, host: str, cmd: str) -> Iterator[subprocess.Popen[bytes]]:
    proc = subprocess.Popen(
        [*cluster.ssh_argv(host), cmd], stdout=subprocess.PIPE, stdin=subprocess.DEVNULL
    )
    with proc:  # closes the pipe
        try:
            yield proc
        finally:
            proc.kill()
            proc.wait(timeout=5)


# ------------------------------------------------------------------ hosts as real machines


def test_ssh_to_every_host_with_strict_host_key_checking(cluster: Cluster) -> None:
    config = cluster.ssh_config.read_text()
    assert config.count("StrictHostKeyChecking yes") == len(cluster.hosts)
    assert "BatchMode yes" in config

    results = ssh_all(cluster, "hostname; echo $SSH_CONNECTION")

    for h in cluster.hosts:
        result = results[h.name]
        assert result.returncode == 0, result.stderr
        name, connection = result.stdout.splitlines()
        assert name == h.name
        assert connection.split()[2] == h.address  # the server side of the connection
        assert result.stderr == ""  # no "Permanently added": the key was already known


def test_paramiko_connects_with_the_suite_key_and_strict_known_hosts(cluster: Cluster) -> None:
    h2 = cluster.host("h2")
    netcluster.assert_routes_to_bridge(cluster, h2.address)
    client = paramiko.SSHClient()
    client.load_host_keys(str(cluster.known_hosts))
    client.set_missing_host_key_policy(paramiko.RejectPolicy())
    try:
        client.connect(
            h2.address,
            username="root",
            key_filename=str(cluster.key),
            look_for_keys=False,
            allow_agent=False,
            timeout=5,
        )
        _, stdout, _ = client.exec_command("hostname", timeout=5)
        assert stdout.read() == b"h2\n"
    finally:
        client.close()


def test_each_host_sees_only_its_own_processes(cluster: Cluster) -> None:
    sleeper = cluster.spawn("h1", ["sleep", "60"], env={"DMLC_ROLE": "worker"})

    on_h1 = cluster.run("h1", "ps -e -o pid=,args=", check=True).stdout.splitlines()
    on_h2 = cluster.run("h2", "ps -e -o pid=,args=", check=True).stdout.splitlines()

    assert on_h1[0].split(None, 1)[0] == "1" and "sshd" in on_h1[0]  # sshd is PID 1
    assert f"{sleeper.host_pid} sleep 60" in [line.strip() for line in on_h1]
    assert not any("sleep 60" in line for line in on_h2)
    assert cluster.host_pids("h1") == [sleeper.pid]
    assert cluster.host_pids("h2") == []
    assert cluster.sshd_pid("h1") in cluster.host_pids("h1", include_sshd=True)
    environ = Path(f"/proc/{sleeper.pid}/environ").read_bytes().split(b"\0")
    assert b"DMLC_ROLE=worker" in environ
    assert cluster.run("h2", "hostname").stdout == "h2\n"


def test_a_process_started_over_ssh_is_visible_and_tagged(cluster: Cluster) -> None:
    tag = f"DTCL_PROBE={cluster.prefix}".encode()  # unique, so concurrent runs never mix

    def tagged_sleeps() -> list[int]:
        found = []
        for pid in cluster.host_pids("h2"):
            with contextlib.suppress(OSError):
                environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
                cmdline = Path(f"/proc/{pid}/cmdline").read_bytes()
                if tag in environ and cmdline == b"sleep\x0060\x00":  # setsid has exec'd
                    found.append(pid)
        return found

    cluster.ssh_run(
        "h2", f"{tag.decode()} DMLC_ROLE=worker setsid sleep 60 >/dev/null 2>&1 </dev/null &"
    )

    wait_for(lambda: len(tagged_sleeps()) == 1, what="the tagged sleep on h2")
    (pid,) = tagged_sleeps()
    wait_for(lambda: cluster.host_pids("h2") == [pid], what="the ssh session's shell to exit")
    assert cluster.host_pids("h1") == []


def test_hosts_reach_each_other_and_the_bridge_on_high_ports(cluster: Cluster) -> None:
    start_server(cluster, "h2")

    by_name = cluster.run("h1", [sys.executable, "-c", CLIENT, "h2", str(PORT)], check=True)
    by_address = cluster.run(
        "h3", [sys.executable, "-c", CLIENT, cluster.host("h2").address, str(PORT)], check=True
    )
    assert by_name.stdout == "h2\n"
    assert by_address.stdout == "h2\n"

    with socket.create_server((BRIDGE_ADDRESS, 0)) as server:
        server.settimeout(5)
        port = server.getsockname()[1]
        client = cluster.spawn("h1", [sys.executable, "-c", CLIENT, BRIDGE_ADDRESS, str(port)])
        conn, (peer, _) = server.accept()
        with conn:
            conn.sendall(b"bridge")
        assert peer == cluster.host("h1").address
        assert client.popen.wait(timeout=5) == 0


def test_hosts_have_no_default_route(cluster: Cluster) -> None:
    for h, peer in zip(cluster.hosts, cluster.hosts[1:] + cluster.hosts[:1], strict=False):
        assert cluster.run(h, "ip route show default").stdout == ""
        # Only asks the routing table; nothing is sent.
        outside = cluster.run(h, "ip route get 203.0.113.1")
        assert outside.returncode != 0
        assert "unreachable" in outside.stderr
        inside = cluster.run(h, f"ip route get {peer.address}", check=True)
        assert " dev eth0 " in inside.stdout


def test_route_guard_passes_while_up_and_refuses_once_down(
    make_cluster: Callable[[int], Cluster],
) -> None:
    cluster = make_cluster(1)
    netcluster.assert_routes_to_bridge(cluster)

    cluster.stop()

    with pytest.raises(ClusterError, match="refusing to connect"):
        netcluster.assert_routes_to_bridge(cluster)
    with pytest.raises(ClusterError, match=f"outside {re.escape(netcluster.SUBNET)}"):
        netcluster.assert_routes_to_bridge(cluster, "192.0.2.1")


def test_hosts_file_lists_aliases_or_addresses_with_slots(cluster: Cluster) -> None:
    plain = cluster.hosts_file()
    per_host = cluster.hosts_file(["h3", "h1"], slots={"h3": 4}, by="address", user="root")
    uniform = cluster.hosts_file(slots=2)

    assert plain.read_text() == "h1\nh2\nh3\n"
    assert per_host.read_text() == f"root@{host_address(3)} slots=4\nroot@{host_address(1)}\n"
    assert uniform.read_text() == "h1 slots=2\nh2 slots=2\nh3 slots=2\n"


def test_run_raises_with_host_and_stderr_and_kills_on_timeout(cluster: Cluster) -> None:
    with pytest.raises(CommandFailed, match=r"h2: .* exited with 3\n  stderr: boom"):
        cluster.run("h2", "echo boom >&2; exit 3", check=True)

    with pytest.raises(subprocess.TimeoutExpired):
        cluster.run("h1", "sleep 60", timeout=0.3)
    wait_for(lambda: cluster.host_pids("h1") == [], what="the timed-out sleep to die")


# ------------------------------------------------------------------ faults


def test_firewall_drop_times_out_and_reject_refuses_on_that_host_only(cluster: Cluster) -> None:
    start_server(cluster, "h2")
    start_server(cluster, "h3")
    h2, h3 = cluster.host("h2").address, cluster.host("h3").address

    cluster.firewall("h2", (9000, 9100), "drop")
    with pytest.raises(socket.timeout):
        connect_from_root(h2, PORT, timeout_s=0.5)
    assert connect_from_root(h3, PORT, timeout_s=2) == b"h3"

    cluster.clear_firewall("h2")
    cluster.firewall("h2", PORT, "reject")
    started = time.monotonic()
    with pytest.raises(ConnectionRefusedError):
        connect_from_root(h2, PORT, timeout_s=5)
    assert time.monotonic() - started < 2  # refused, not timed out
    assert cluster.ssh_run("h2", "hostname").stdout == "h2\n"  # port 22 is not filtered

    cluster.clear_firewall("h2")
    assert connect_from_root(h2, PORT, timeout_s=2) == b"h2"
    assert cluster.run("h2", "nft list ruleset").stdout == ""


def test_partition_stalls_an_open_session_and_heal_resumes_it(cluster: Cluster) -> None:
    loop = "while :; do echo tick; sleep 0.1; done"
    with ssh_session(cluster, "h2", loop) as session:
        assert read_line(session.stdout, 10) == "tick\n"

        cluster.partition("h2")
        while read_line(session.stdout, 0.5):  # drain what was already on the way
            pass
        assert read_line(session.stdout, 1.0) == ""  # silence...
        assert session.poll() is None  # ...but no FIN or RST either
        with pytest.raises(socket.timeout):
            connect_from_root(cluster.host("h2").address, 22, timeout_s=0.5)
        assert cluster.run("h1", "true").returncode == 0

        cluster.heal("h2")
        assert read_line(session.stdout, 10) == "tick\n"  # on the next retransmit

    # all_traffic: even a closed port, which normally answers RST at once, stays silent.
    h3 = cluster.host("h3").address
    with pytest.raises(ConnectionRefusedError):
        connect_from_root(h3, 1, timeout_s=2)
    cluster.partition("h3", all_traffic=True)
    with pytest.raises(socket.timeout):
        connect_from_root(h3, 1, timeout_s=0.5)
    assert cluster.run("h3", f"ip route get {host_address(2)}").returncode == 0
    cluster.heal("h3")
    with pytest.raises(ConnectionRefusedError):
        connect_from_root(h3, 1, timeout_s=2)


def test_sshd_override_sets_env_for_new_sessions_on_that_host_only(cluster: Cluster) -> None:
    sshd_pid = cluster.sshd_pid("h1")

    cluster.sshd_override("h1", "SetEnv DTRAIN_PROBE=on-h1")
    results = ssh_all(cluster, "echo probe=$DTRAIN_PROBE")

    assert results["h1"].stdout == "probe=on-h1\n"
    assert results["h2"].stdout == "probe=\n"
    assert cluster.sshd_pid("h1") == sshd_pid  # SIGHUP re-exec keeps PID 1
    with pytest.raises(ClusterError, match="Bad configuration option"):
        cluster.sshd_override("h1", "NoSuchOption yes")
    cluster.sshd_override("h1", "")
    assert cluster.ssh_run("h1", "echo probe=$DTRAIN_PROBE").stdout == "probe=\n"


def test_blank_bashrc_gives_ssh_commands_sshd_path_on_that_host_only(cluster: Cluster) -> None:
    bashrc = Path.home() / ".bashrc"
    size = str(bashrc.stat().st_size) if bashrc.exists() else "none"
    probe = "stat -c %s ~/.bashrc 2>/dev/null || echo none; echo $PATH"

    cluster.blank_bashrc("h1")
    results = ssh_all(cluster, probe)

    assert results["h1"].stdout.splitlines()[0] == ("0" if bashrc.exists() else "none")
    assert results["h1"].stdout.splitlines()[1] == ROOT_SUPERUSER_PATH
    assert results["h2"].stdout.splitlines()[0] == size
    cluster.restore_bashrc("h1")
    assert cluster.run("h1", "stat -c %s ~/.bashrc || echo none").stdout.strip() == size


def test_hide_path_hides_a_package_and_its_metadata_on_one_host(
    cluster: Cluster, tmp_path: Path
) -> None:
    site = tmp_path / "site"
    (site / "probe_pkg").mkdir(parents=True)
    (site / "probe_pkg" / "__init__.py").write_text("VERSION = '1.0'\n")
    (site / "probe_pkg-1.0.dist-info").mkdir()
    (site / "probe_pkg-1.0.dist-info" / "METADATA").write_text(
        "Metadata-Version: 2.1\nName: probe_pkg\nVersion: 1.0\n"
    )
    (site / "other.py").write_text("")
    probe = (
        "import importlib.metadata as m\n"
        "try:\n    import probe_pkg; print('module', probe_pkg.VERSION)\n"
        "except ImportError: print('module missing')\n"
        "try: print('dist', m.version('probe_pkg'))\n"
        "except m.PackageNotFoundError: print('dist missing')\n"
    )
    env = {"PYTHONPATH": str(site)}

    cluster.hide_path("h1", site / "probe_pkg", site / "probe_pkg-1.0.dist-info")

    on_h1 = cluster.run("h1", [sys.executable, "-c", probe], env=env, check=True)
    on_h2 = cluster.run("h2", [sys.executable, "-c", probe], env=env, check=True)
    assert on_h1.stdout == "module missing\ndist missing\n"
    assert on_h2.stdout == "module 1.0\ndist 1.0\n"
    assert cluster.run("h1", ["ls", str(site)]).stdout == "other.py\n"
    assert (site / "probe_pkg").is_dir()  # the root namespace is untouched

    cluster.unhide_path("h1", site / "probe_pkg", site / "probe_pkg-1.0.dist-info")
    again = cluster.run("h1", [sys.executable, "-c", probe], env=env, check=True)
    assert again.stdout == "module 1.0\ndist 1.0\n"


def test_revoke_key_makes_ssh_fail_with_publickey(cluster: Cluster) -> None:
    cluster.revoke_key("h1")
    results = ssh_all(cluster, "true")

    assert results["h1"].returncode == 255
    assert "Permission denied (publickey)" in results["h1"].stderr
    assert results["h2"].returncode == 0
    cluster.restore_key("h1")
    assert cluster.ssh_run("h1", "true").returncode == 0


def test_rotate_host_key_is_reported_as_changed(cluster: Cluster) -> None:
    cluster.rotate_host_key("h3")
    results = ssh_all(cluster, "true")

    assert results["h3"].returncode == 255
    assert "REMOTE HOST IDENTIFICATION HAS CHANGED" in results["h3"].stderr
    assert "Host key verification failed" in results["h3"].stderr
    assert results["h1"].returncode == 0
    cluster.trust_host_key("h3")
    assert cluster.ssh_run("h3", "true").returncode == 0


def test_forget_host_key_is_reported_as_unknown(cluster: Cluster) -> None:
    cluster.forget_host_key("h2")
    results = ssh_all(cluster, "true")

    assert results["h2"].returncode == 255
    assert f"No ED25519 host key is known for {host_address(2)}" in results["h2"].stderr
    assert "Host key verification failed" in results["h2"].stderr
    assert results["h3"].returncode == 0


def test_stop_host_kills_everything_on_it_and_ssh_is_refused(cluster: Cluster) -> None:
    on_h2 = cluster.spawn("h2", ["sleep", "60"])
    on_h1 = cluster.spawn("h1", ["sleep", "60"])
    ssh = ["ssh", "-F", str(cluster.ssh_config), "h2", "true"]

    cluster.stop_host("h2")

    assert not on_h2.is_alive()
    assert on_h1.is_alive()
    refused = subprocess.run(ssh, capture_output=True, text=True, timeout=10, check=False)
    assert refused.returncode == 255
    assert "Connection refused" in refused.stderr
    with pytest.raises(ClusterError, match="host is stopped"):
        cluster.run("h2", "true")

    cluster.start_host("h2")
    assert cluster.ssh_run("h2", "hostname").stdout == "h2\n"


def test_private_dir_is_srv_on_that_host_only(cluster: Cluster) -> None:
    (cluster.private_dir("h1") / "shard-0").write_text("h1 data")

    assert cluster.run("h1", "cat /srv/shard-0").stdout == "h1 data"
    assert cluster.run("h2", "ls -A /srv").stdout == ""
    assert not Path("/srv/shard-0").exists()
    cluster.run("h2", "echo h2 data > /srv/shard-1", check=True)
    assert (cluster.private_dir("h2") / "shard-1").read_text() == "h2 data\n"


# ------------------------------------------------------------------ lifecycle


def _mount_lines() -> set[str]:
    return set(Path("/proc/mounts").read_text().splitlines())


def test_teardown_leaves_no_namespace_link_process_mount_or_file(
    make_cluster: Callable[[int], Cluster],
) -> None:
    mounts_before = _mount_lines()
    cluster = make_cluster(3)
    spawned = [cluster.spawn(h, ["sleep", "60"]) for h in cluster.hosts]
    pids = [cluster.sshd_pid(h) for h in cluster.hosts] + [p.pid for p in spawned]
    workdir = cluster.workdir

    cluster.stop()
    cluster.stop()  # idempotent

    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert cluster.prefix not in netns
    assert cluster.prefix not in links
    assert [pid for pid in pids if netcluster._pid_state(pid) not in (None, "Z")] == []
    assert not workdir.exists()
    new_mounts = _mount_lines() - mounts_before
    # `ip netns add` makes /run/netns a mount point once per boot; nothing else may remain.
    assert {m for m in new_mounts if m.split()[1] != "/run/netns"} == set()
    assert not any(cluster.prefix in m for m in _mount_lines())


def test_a_failed_start_tears_down_what_it_built(monkeypatch: pytest.MonkeyPatch) -> None:
    cluster = Cluster(2)

    def fail(*_: object) -> None:
        raise ClusterError("simulated failure while waiting")

    monkeypatch.setattr(cluster, "_wait_until_up", fail)
    with pytest.raises(ClusterError, match="simulated"):
        cluster.start()

    netns = subprocess.run(["ip", "netns", "list"], capture_output=True, text=True).stdout
    links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True).stdout
    assert cluster.prefix not in netns + links
    assert not any(
        p.name.startswith(f"{WORKDIR_PREFIX}{cluster.id}") for p in Path("/tmp").iterdir()
    )
    with Cluster(1) as again:  # the lock and the subnet were released
        assert again.run("h1", "hostname").stdout == "h1\n"


def test_one_cluster_at_a_time_in_process_and_across_processes(cluster: Cluster) -> None:
    with pytest.raises(ClusterError, match="another cluster"):
        Cluster(1).start()

    other = subprocess.run(
        [
            sys.executable,
            "-c",
            "import sys; sys.path.insert(0, sys.argv[1]);"
            "from netcluster import Cluster; Cluster(1, lock_timeout_s=0.3).start()",
            str(Path(netcluster.__file__).parent),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    assert other.returncode != 0
    assert "is still held by another test cluster" in other.stderr
    assert f"pid {os.getpid()}" in other.stderr  # names the holder


def test_cleanup_stale_removes_what_a_crashed_run_left(tmp_path: Path) -> None:
    crashed = subprocess.run(
        [
            sys.executable,
            "-c",
            "import os, sys; sys.path.insert(0, sys.argv[1]);"
            "from netcluster import Cluster; c = Cluster(2); c.start(); print(c.prefix);"
            "sys.stdout.flush(); os._exit(1)",  # no stop(), no atexit
            str(Path(netcluster.__file__).parent),
        ],
        capture_output=True,
        text=True,
        timeout=30,
    )
    prefix = crashed.stdout.strip()
    assert prefix.startswith(NAME_PREFIX), crashed.stderr
    assert any(prefix in name for name in os.listdir("/sys/class/net"))

    removed = netcluster.cleanup_stale()

    assert not any(prefix in name for name in os.listdir("/sys/class/net"))
    assert not any(name.startswith(prefix) for name in netcluster._netns_names())
    if f"{prefix}br" not in removed:
        # Only possible when a concurrent test run started a cluster in between: its start()
        # cleans up stale runs too. Then it must have left nothing either (checked above).
        return
    assert f"netns {prefix}-h1" in removed
    assert any(f"{WORKDIR_PREFIX}{prefix[4:]}" in item for item in removed)


def test_a_pyenv_lock_left_on_one_host_stays_on_that_host(cluster: Cluster) -> None:
    # A login killed mid-`pyenv rehash` leaves this lock behind; on the shared filesystem it
    # would make every later login on the machine wait 60 s.
    shims = netcluster._pyenv_shims()
    mounts = cluster.run("h1", "cat /proc/self/mounts", check=True).stdout
    if shims is None:  # no pyenv here: nothing to isolate, and nothing is mounted for it
        assert "-shims " not in mounts
        return
    assert f" {shims} overlay " in mounts
    lock = shims / ".pyenv-shim"
    cluster.run("h1", f"touch {lock}", check=True)
    assert cluster.run("h1", f"test -e {lock}").returncode == 0
    assert not lock.exists()
    assert cluster.run("h2", f"test -e {lock}").returncode != 0
