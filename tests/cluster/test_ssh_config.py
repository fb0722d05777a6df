"""ssh as users configure it, on the real sshd cluster: OpenSSH's own resolution (Include,
Match exec, wildcards, tokens), a bastion reached by ProxyJump and two ProxyCommands, a user
certificate, and `--setup` shaping the environment tasks see."""

from __future__ import annotations

import os
import re
import shutil
import signal
import subprocess
import time
from pathlib import Path

from dtrain.plan.hosts import Host
from dtrain.transport import sshconfig
from dtrain.transport.options import SshOptions
from dtrain.transport.ssh import SshTransport
from tests.cluster.netcluster import BRIDGE_ADDRESS, Cluster, host_address
from tests.cluster.test_launch_ssh import assert_nothing_left, cluster_tasks, wait_running
from tests.conftest import PYTHON, program, run_dtrain, start_dtrain, wait_gone

BY_TASK = program("by_task.py")


def launch(
    cluster: Cluster, config: Path, hosts: Path, cwd: Path, *rest: str, timeout_s: float = 90
) -> subprocess.CompletedProcess[str]:
    args = ["launch", "-H", str(hosts), "--ssh-config", str(config), *rest]
    return run_dtrain(args, cwd, timeout_s=timeout_s)


def resolution_config(cluster: Cluster, tmp_path: Path) -> Path:
    """Aliases w1..w3 defined only in an Included directory; Port, key and user from wildcard
    and Match blocks, the key's path through tokens."""
    confd = tmp_path / "conf.d"
    confd.mkdir()
    for h in cluster.hosts:
        (confd / f"{h.name}.conf").write_text(f"Host w{h.index}\n  HostName {h.address}\n")
    shutil.copy(cluster.key, tmp_path / "id_root")
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Include {confd}/*.conf\n"
        "Host w* !w9\n"
        "  Port 22\n"
        f"  IdentityFile {tmp_path}/id_%r\n"
        "  IdentitiesOnly yes\n"
        f"  UserKnownHostsFile {cluster.known_hosts}\n"
        "  GlobalKnownHostsFile /dev/null\n"
        "  StrictHostKeyChecking yes\n"
        f'Match host 198.18.* exec "test -r {tmp_path}/id_root"\n'
        "  User root\n"
        "Host *\n"
        "  User nobody-would-get-in\n"
    )
    return config


def test_resolution_equals_openssh_for_every_host_and_a_launch_works(
    cluster: Cluster, tmp_path: Path
) -> None:
    config = resolution_config(cluster, tmp_path)
    transport = SshTransport(SshOptions(config_file=str(config)))
    table = []
    for h in cluster.hosts:
        target = transport.target(Host(name=f"w{h.index}"))
        openssh = sshconfig.parse_ssh_g(
            sshconfig.run_ssh_g("ssh", f"w{h.index}", str(config), None, None)
        )
        expected = (h.address, 22, "root", (f"{tmp_path}/id_root",))
        assert (target.hostname, target.port, target.user, target.identity_files) == expected
        assert (
            openssh["hostname"][0],
            int(openssh["port"][0]),
            openssh["user"][0],
        ) == expected[:3]
        table.append(target)
    assert len(table) == len(cluster.hosts)
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"w{h.index}\n" for h in cluster.hosts))
    result = launch(cluster, config, hosts, tmp_path, "-n", "3", "-s", "0", "--", PYTHON, BY_TASK)
    assert result.returncode == 0, result.stderr
    assert "ready worker.2" in result.stdout


def test_server_alive_settings_set_the_heartbeat_timeout_of_their_host(
    cluster: Cluster, tmp_path: Path
) -> None:
    """ServerAliveInterval 1, CountMax 3 for w3 alone: w3 silenced is lost after 3s, not
    the default 15s, and its tasks stop themselves after the same lease."""
    config = resolution_config(cluster, tmp_path)
    with config.open("a") as text:
        text.write("Host w3\n  ServerAliveInterval 1\n  ServerAliveCountMax 3\n")
    hosts = tmp_path / "hosts"
    hosts.write_text("".join(f"w{h.index}\n" for h in cluster.hosts))
    args = ["launch", "-H", str(hosts), "--ssh-config", str(config), "--grace", "1"]
    proc = start_dtrain([*args, "-n", "3", "-s", "0", "--", PYTHON, BY_TASK, "*=sleep"], tmp_path)
    try:
        job = wait_running(tmp_path, 4)  # the scheduler and three workers
        cluster.partition("h3")
        _, stderr = proc.communicate(timeout=30)
        assert proc.returncode == 255, stderr
        assert re.search(r"worker\.2@w3 was lost: no heartbeat from w3 for [34]s", stderr), stderr
        assert_nothing_left(cluster, job, within_s=3 + 1 + 3)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_batchmode_alone_gives_a_host_cut_off_one_way_the_default_lease(
    cluster: Cluster, tmp_path: Path
) -> None:
    """The cluster's config says BatchMode yes and nothing of ServerAlive, so `ssh -G` prints
    the ServerAliveInterval 300 OpenSSH derives: h3, whose port 22 then receives nothing (its
    own packets still leave), is lost after the default 15 s, not 300 x 3, and its agent stops
    its tasks within the same lease."""
    assert "BatchMode yes" in cluster.ssh_config.read_text()
    args = ["launch", "-H", str(cluster.hosts_file()), "--ssh-config", str(cluster.ssh_config)]
    proc = start_dtrain(
        [*args, "--grace", "1", "-n", "3", "-s", "0", "--", PYTHON, BY_TASK, "*=sleep"], tmp_path
    )
    try:
        job = wait_running(tmp_path, 4)  # the scheduler and three workers
        cluster.partition("h3", one_way=True)
        _, stderr = proc.communicate(timeout=15 + 30)
        assert proc.returncode == 255, stderr
        assert re.search(r"worker\.2@h3 was lost: no heartbeat from h3 for 1[56]s", stderr), stderr
        # no FIN reaches h3: its agent stops the task when its own lease (the same) runs out
        deadline = time.monotonic() + 15 + 1 + 10
        while cluster_tasks(cluster, job) and time.monotonic() < deadline:
            time.sleep(0.2)
        assert_nothing_left(cluster, job)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def bastion(cluster: Cluster, tmp_path: Path, how: str) -> tuple[Path, Path]:
    """h1 is the jump host; h2 and h3 drop ssh from the launcher, and are reached through h1
    by `how` (a ProxyJump or ProxyCommand line). The cluster's own config comes after."""
    for h in cluster.hosts[1:]:
        cluster.refuse_from(h, BRIDGE_ADDRESS)
    inner = tmp_path / "cluster_config"  # a path unique to this test: it marks our proxies
    shutil.copy(cluster.ssh_config, inner)
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host h2 h3\n  {how.format(cfg=inner)}\nHost *\n  ConnectTimeout 5\nInclude {inner}\n"
    )
    hosts = cluster.hosts_file(names=["h2", "h3"])
    return config, hosts


def proxy_pids(marker: Path) -> list[int]:
    """Processes on this machine whose command line names `marker` (ours: a unique path)."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit() or int(entry.name) == os.getpid():
            continue
        try:
            cmdline = (entry / "cmdline").read_bytes()
        except OSError:
            continue
        if str(marker).encode() in cmdline:
            found.append(int(entry.name))
    return found


BASTIONS = {
    "proxyjump": "ProxyJump h1",
    "proxycommand -W": "ProxyCommand ssh -F {cfg} -W %h:%p h1",
    "proxycommand nc": "ProxyCommand ssh -F {cfg} h1 nc %h %p",
}


def test_hosts_firewalled_from_the_launcher_are_unreachable_directly(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.refuse_from("h2", BRIDGE_ADDRESS)
    hosts = cluster.hosts_file(names=["h2"])
    result = launch(
        cluster,
        cluster.ssh_config,
        hosts,
        tmp_path,
        "--connect-timeout",
        "2",
        "-n",
        "1",
        "-s",
        "0",
        "--",
        "true",
    )
    assert result.returncode != 0 and "h2" in result.stderr and "timed out" in result.stderr


def test_a_bastion_by_proxyjump_and_proxycommands_launches_and_leaves_no_proxy(
    cluster: Cluster, tmp_path: Path
) -> None:
    for name, how in BASTIONS.items():
        workdir = tmp_path / name.replace(" ", "_")
        workdir.mkdir()
        config, hosts = bastion(cluster, workdir, how)
        args = ("-n", "2", "-s", "0", "--", PYTHON, BY_TASK, "*=exit:0")
        started = time.monotonic()
        result = launch(cluster, config, hosts, workdir, *args)
        print(f"{name}: {time.monotonic() - started:.2f} s")
        assert result.returncode == 0, f"{name}: {result.stderr}"
        assert "ready worker.1" in result.stdout, name
        assert wait_gone(proxy_pids(workdir / "cluster_config"), 5) == [], name
        for h in cluster.hosts[1:]:
            cluster.clear_firewall(h)


def test_a_failing_proxyjump_hop_is_named_with_what_to_do(cluster: Cluster, tmp_path: Path) -> None:
    """h2 and h3 are reached through h1: what fails at h1 (its key refused, its forwarding
    off, h1 unreachable, h3 not reachable from h1) is said of h1, with what to do there,
    never blamed on the hosts behind it."""
    config, hosts = bastion(cluster, tmp_path, BASTIONS["proxyjump"])
    args = ["launch", "-H", str(hosts), "--ssh-config", str(config), "--connect-timeout", "2"]
    args += ["-n", "2", "-s", "0", "--", "true"]
    hop = f"via jump host h1 ({host_address(1)}:22)"
    faults = {
        "revoked": (
            lambda: cluster.revoke_key("h1"),
            lambda: cluster.restore_key("h1"),
            f"2 hosts: {hop}: the server refused our keys as user root",
            f"ssh-copy-id -p 22 root@{host_address(1)}",
        ),
        "no forwarding": (
            lambda: cluster.sshd_override("h1", "AllowTcpForwarding no"),
            lambda: cluster.sshd_override("h1", ""),
            "2 hosts: jump host h1 refuses to forward connections (administratively prohibited)",
            "sshd on h1 must allow forwarding (AllowTcpForwarding yes",
        ),
        "cut off": (
            lambda: cluster.partition("h1"),
            lambda: cluster.heal("h1"),
            f"2 hosts: {hop}: connection timed out after 2s",
            "check that h1 is up and that port 22 is open",
        ),
        "h3 refuses h1": (
            lambda: cluster.firewall("h3", 22, "reject"),
            lambda: cluster.refuse_from("h2", BRIDGE_ADDRESS),  # h2 as it was
            f"h3 ({host_address(3)}:22): jump host h1 could not connect to {host_address(3)}:22 "
            "(Connect failed)",
            f"check that {host_address(3)} is up and that h1 can reach its port 22",
        ),
    }
    for name, (fault, undo, line, hint) in faults.items():
        fault()
        result = run_dtrain(args, tmp_path, timeout_s=60)
        undo()
        assert result.returncode == 3, f"{name}: {result.stderr}"
        assert line in result.stderr and hint in result.stderr, f"{name}: {result.stderr}"
        assert "Exception" not in result.stderr, f"{name}: {result.stderr}"


def test_a_session_sshd_refuses_is_a_sentence_with_what_to_look_at(
    cluster: Cluster, tmp_path: Path
) -> None:
    cluster.sshd_override("h2", "MaxSessions 0")
    args = ["launch", "-H", str(cluster.hosts_file()), "--ssh-config", str(cluster.ssh_config)]
    result = run_dtrain([*args, "-n", "3", "-s", "0", "--", "true"], tmp_path, timeout_s=60)
    assert result.returncode == 3, result.stderr
    assert result.stderr.splitlines()[1:] == [
        "  h2: cannot start dtrain's agent: sshd refused it a session (Connect failed)",
        "    hint: sshd on h2 allows only so many sessions on one connection (MaxSessions), and "
        "its log says why it refused this one",
    ]


def test_a_proxycommand_dies_when_dtrain_is_sigkilled(cluster: Cluster, tmp_path: Path) -> None:
    config, hosts = bastion(cluster, tmp_path, BASTIONS["proxycommand nc"])
    marker = tmp_path / "cluster_config"
    args = ["launch", "-H", str(hosts), "--ssh-config", str(config)]
    proc = start_dtrain([*args, "-n", "2", "-s", "0", "--", PYTHON, BY_TASK, "*=sleep"], tmp_path)
    try:
        deadline = time.monotonic() + 30
        while len(proxy_pids(marker)) < 2 or not (tmp_path / "dtrain-logs" / "latest").exists():
            assert proc.poll() is None and time.monotonic() < deadline, "no job came up"
            time.sleep(0.1)
        time.sleep(1.0)  # the tasks start after the connections
        proxies = proxy_pids(marker)
        assert proxies
        proc.send_signal(signal.SIGKILL)
        proc.wait(timeout=10)
        assert wait_gone(proxies, 10) == [], "a ProxyCommand outlived SIGKILLed dtrain"
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


def test_a_user_certificate_alone_gets_in(cluster: Cluster, tmp_path: Path) -> None:
    keygen = ["ssh-keygen", "-q", "-N", "", "-t", "ed25519", "-f"]
    subprocess.run([*keygen, str(tmp_path / "ca")], check=True)
    user = tmp_path / "user"
    subprocess.run([*keygen, str(user)], check=True)
    subprocess.run(
        ["ssh-keygen", "-q", "-s", str(tmp_path / "ca"), "-I", "id", "-n", "root", f"{user}.pub"],
        check=True,
    )
    cert = tmp_path / "signed-cert"
    (tmp_path / "user-cert.pub").rename(cert)  # not beside the key: CertificateFile must say it
    for h in cluster.hosts:  # no plain key authorized anywhere: only the CA
        trust = f"TrustedUserCAKeys {tmp_path / 'ca.pub'}\nAuthorizedKeysFile none"
        cluster.sshd_override(h, trust)
    config = tmp_path / "ssh_config"
    config.write_text(
        f"Host h*\n  IdentityFile {tmp_path / 'user'}\n  CertificateFile {cert}\n"
        f"Include {cluster.ssh_config}\n"
    )
    hosts = cluster.hosts_file()
    result = launch(cluster, config, hosts, tmp_path, "-n", "3", "-s", "0", "--", "true")
    assert result.returncode == 0, result.stderr
    without = tmp_path / "no_cert_config"
    key_only = f"Host h*\n  IdentityFile {tmp_path / 'user'}\nInclude {cluster.ssh_config}\n"
    without.write_text(key_only)
    refused = launch(cluster, without, hosts, tmp_path, "-n", "3", "-s", "0", "--", "true")
    assert refused.returncode != 0 and "refused our keys" in refused.stderr


def test_a_key_held_only_by_the_agent_identityagent_names_gets_in(
    cluster: Cluster, tmp_path: Path
) -> None:
    """A key in an ssh-agent on its own socket (as 1Password's or a hardware agent's), not
    the one SSH_AUTH_SOCK names: IdentityAgent reaches it; no agent there, no way in."""
    user = tmp_path / "agent_key"
    subprocess.run(["ssh-keygen", "-q", "-N", "", "-t", "ed25519", "-f", str(user)], check=True)
    authorized = tmp_path / "authorized_keys"
    shutil.copy(f"{user}.pub", authorized)
    for h in cluster.hosts:  # only the agent's key is authorized, not the suite's
        cluster.sshd_override(h, f"AuthorizedKeysFile {authorized}")
    sock = tmp_path / "agent.sock"
    agent = subprocess.Popen(["ssh-agent", "-D", "-a", str(sock)], stdout=subprocess.DEVNULL)
    try:
        deadline = time.monotonic() + 10
        while not sock.exists():
            assert time.monotonic() < deadline, "ssh-agent did not start"
            time.sleep(0.05)
        env = {k: v for k, v in os.environ.items() if k != "SSH_AUTH_SOCK"}
        subprocess.run(
            ["ssh-add", "-q", str(user)], env={**env, "SSH_AUTH_SOCK": str(sock)}, check=True
        )
        user.unlink()  # the agent holds the only copy
        hosts = cluster.hosts_file()
        for agent_path, works in ((sock, True), (tmp_path / "no-agent.sock", False)):
            config = tmp_path / f"ssh_config_{works}"
            config.write_text(
                f"Host h*\n  IdentitiesOnly no\n  IdentityAgent {agent_path}\n"
                f"Include {cluster.ssh_config}\n"
            )
            args = ["launch", "-H", str(hosts), "--ssh-config", str(config)]
            result = run_dtrain([*args, "-n", "3", "-s", "0", "--", "true"], tmp_path, env=env)
            if works:
                assert result.returncode == 0, result.stderr
            else:
                assert result.returncode != 0 and "refused our keys" in result.stderr
    finally:
        agent.terminate()
        agent.wait(timeout=10)


def test_strict_host_key_checking_no_connects_through_a_changed_key_as_openssh_does(
    cluster: Cluster, tmp_path: Path
) -> None:
    """`no` lets a changed key through with a warning and records an unknown one; the
    suite's own `yes` still refuses the changed key."""
    cluster.rotate_host_key("h2")
    cluster.forget_host_key("h1")
    before = cluster.known_hosts.read_text()
    config = tmp_path / "ssh_config"
    config.write_text(f"Host h*\n  StrictHostKeyChecking no\nInclude {cluster.ssh_config}\n")
    hosts = cluster.hosts_file()
    result = launch(cluster, config, hosts, tmp_path, "-n", "3", "-s", "0", "--", "true")
    assert result.returncode == 0, result.stderr
    assert f"HOST KEY CHANGED for {host_address(2)}" in result.stderr
    after = cluster.known_hosts.read_text()
    assert after.startswith(before) and f"{host_address(1)} " in after[len(before) :]
    assert host_address(2) not in after[len(before) :]  # the changed key is not recorded
    strict = launch(cluster, cluster.ssh_config, hosts, tmp_path, "-n", "3", "--", "true")
    assert strict.returncode == 3 and "HOST KEY CHANGED" in strict.stderr


def test_setup_activates_a_shared_venv_and_job_variables_still_win(
    cluster: Cluster, tmp_path: Path
) -> None:
    venv = tmp_path / "venv"  # the filesystem is shared between hosts
    subprocess.run(["/usr/bin/python3", "-m", "venv", "--without-pip", str(venv)], check=True)
    for h in cluster.hosts:
        cluster.blank_bashrc(h)  # a pyenv init there would put its python first again
    show = "import os,sys;print('env', sys.prefix, os.environ['A'], os.environ['B'])"
    result = run_dtrain(
        [
            *("launch", "-H", str(cluster.hosts_file()), "--ssh-config", str(cluster.ssh_config)),
            *("--setup", f". {venv}/bin/activate", "--setup", "export A=setup B=setup"),
            *("--env", "B=job", "-n", "3", "-s", "0", "--", "python", "-c", show),
        ],
        tmp_path,
        timeout_s=90,
    )
    assert result.returncode == 0, result.stderr
    lines = [line for line in result.stdout.splitlines() if " env " in line]
    assert len(lines) == 4  # the scheduler here and a worker on each host
    assert all(line.endswith(f"env {venv} setup job") for line in lines), lines


def test_a_failing_setup_on_one_host_starts_nothing_and_names_it(
    cluster: Cluster, tmp_path: Path
) -> None:
    check = 'test "$(uname -n)" != h2 || { echo no-gpu-here >&2; false; }'
    result = run_dtrain(
        [
            *("launch", "-H", str(cluster.hosts_file()), "--ssh-config", str(cluster.ssh_config)),
            *("--setup", check, "-n", "3", "-s", "0", "--", PYTHON, BY_TASK, "*=sleep"),
        ],
        tmp_path,
        timeout_s=60,
    )
    assert result.returncode != 0
    assert "h2" in result.stderr and "no-gpu-here" in result.stderr, result.stderr
    assert "setup command" in result.stderr and "nothing was started" in result.stderr
    assert "ready" not in result.stdout  # no task ran anywhere


def test_doctor_runs_the_same_setup_first(cluster: Cluster, tmp_path: Path) -> None:
    base = ["doctor", "-H", str(cluster.hosts_file()), "--ssh-config", str(cluster.ssh_config)]
    setup_file = tmp_path / "setup.sh"
    setup_file.write_text('export DTRAIN_SETUP_PROBE=1\ntest "$(uname -n)" != h3\n')
    failed = run_dtrain([*base, "--setup-file", str(setup_file), "--", "true"], tmp_path)
    assert failed.returncode != 0
    assert (
        "h3" in failed.stdout + failed.stderr and "setup command" in failed.stdout + failed.stderr
    )
    passed = run_dtrain([*base, "--setup", "export DTRAIN_SETUP_PROBE=1", "--", "true"], tmp_path)
    assert passed.returncode == 0, passed.stdout + passed.stderr
