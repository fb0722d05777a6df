"""`ssh -G` answers kept between runs: what a config file says about caching (pure), and, with
the real OpenSSH client, that an answer is reused only while nothing `ssh -G` reads changed."""

from __future__ import annotations

import os
import shutil
import time
from pathlib import Path

import pytest
from hypothesis import given
from hypothesis import strategies as st

from dtrain.errors import UsageError
from dtrain.transport import sshcache, sshconfig
from tests.transport.test_ssh import logged_ssh
from tests.transport.test_sshconfig import needs_openssh


@pytest.mark.parametrize(
    "line",
    [
        'Match exec "test -f /tmp/vpn"',
        "Match host n* !exec true",
        "match localnetwork 198.18.0.0/24",
        "Match canonical host n1",
        "Match final all",
        "Match=exec true",
        "CanonicalizeHostname yes",
        "CanonicalizeHostname always",
        "IdentityFile ${HOME}/.ssh/id_x",
        "Include ~/.ssh/%u.conf",
        "Include $HOME/x.conf",
        'Include "unterminated',
    ],
)
def test_a_config_whose_answer_can_change_with_nothing_read_changing_is_not_cached(
    line: str,
) -> None:
    assert sshcache.read_config_text(f"Host n*\n  User bob\n{line}\n").uncacheable is not None


@pytest.mark.parametrize(
    "line",
    [
        "Match host n* user bob",
        "Match originalhost exec-node",  # `exec` only as a criterion
        "CanonicalizeHostname no",
        "# Match exec true",
        "ProxyCommand ssh -W %h:%p gate",  # not run by `ssh -G`
    ],
)
def test_configs_that_only_name_hosts_users_and_files_are_cached(line: str) -> None:
    assert sshcache.read_config_text(f"Host n*\n{line}\n").uncacheable is None


def test_includes_are_read_in_order_in_every_spelling() -> None:
    text = 'Include a.conf "b c.conf"\n  include=~/d/*.conf\nHost x\n  Include /etc/e\n'
    assert sshcache.read_config_text(text).includes == (
        "a.conf",
        "b c.conf",
        "~/d/*.conf",
        "/etc/e",
    )


def test_include_paths_resolve_as_openssh_resolves_them() -> None:
    assert sshcache.include_path("x.conf", "/home/me", system=False) == "/home/me/.ssh/x.conf"
    assert sshcache.include_path("x.conf", "/home/me", system=True) == "/etc/ssh/x.conf"
    assert sshcache.include_path("~/y/*.conf", "/home/me", system=False) == "/home/me/y/*.conf"
    assert sshcache.include_path("/opt/z", "/home/me", system=True) == "/opt/z"


@given(st.text())
def test_any_config_text_is_read_without_error(text: str) -> None:
    seen = sshcache.read_config_text(text)
    assert seen.uncacheable is None or seen.includes == ()


def test_keys_differ_by_host_user_port_and_config() -> None:
    keys = {
        sshcache.answer_key("f1", "n1", None, None),
        sshcache.answer_key("f1", "n1", "bob", None),
        sshcache.answer_key("f1", "n1", None, 2200),
        sshcache.answer_key("f1", "n2", None, None),
        sshcache.answer_key("f2", "n1", None, None),
    }
    assert len(keys) == 5


def test_answers_asked_with_other_options_are_not_the_same_answers(tmp_path: Path) -> None:
    """An answer kept by a dtrain that asked `ssh -G` without `-o BatchMode=no` says the
    ServerAliveInterval OpenSSH derives: it must not be taken for one asked with it."""
    ssh = shutil.which("true") or "/bin/true"
    facts = ("u", "0", "here")
    plain = sshcache.config_fingerprint(ssh, "/dev/null", str(tmp_path), facts)
    asked = sshcache.config_fingerprint(
        ssh, "/dev/null", str(tmp_path), facts, sshconfig.SSH_G_OPTIONS
    )
    assert plain is not None and asked is not None and plain != asked


# ---- with OpenSSH's client -----------------------------------------------------------------


@pytest.fixture
def cache(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    monkeypatch.setenv("XDG_CACHE_HOME", str(tmp_path / "cache"))
    return tmp_path / "cache" / "dtrain" / "ssh-G"


def resolve(config: Path, *hosts: str) -> list[dict[str, tuple[str, ...]]]:
    ssh = shutil.which("ssh")
    assert ssh is not None
    return sshconfig.resolve_all(ssh, [(h, None, None) for h in hosts], str(config))


def config_and_log(tmp_path: Path, monkeypatch: pytest.MonkeyPatch, text: str) -> tuple[Path, Path]:
    """An ssh config holding `text`, and the log of every command the `ssh` in PATH runs."""
    log = logged_ssh(tmp_path, monkeypatch)
    config = tmp_path / "ssh_config"
    config.write_text(text)
    return config, log


def asked(log: Path) -> list[str]:
    return [line.split()[-1] for line in log.read_text().splitlines()] if log.exists() else []


@needs_openssh
def test_the_second_run_asks_openssh_nothing_and_gets_the_same_answers(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    config, log = config_and_log(
        tmp_path, monkeypatch, "Host n*\n  HostName 198.18.0.11\n  User bob\n"
    )
    first = resolve(config, "n1", "n2")
    assert sorted(asked(log)) == ["n1", "n2"]  # in parallel
    assert resolve(config, "n1", "n2") == first
    assert sorted(asked(log)) == ["n1", "n2"]  # nothing more
    assert first[0]["user"] == ("bob",)
    assert sorted(os.stat(p).st_mode & 0o777 for p in answers(cache)) == [0o600, 0o600]
    assert os.stat(cache).st_mode & 0o777 == 0o700


@needs_openssh
def test_a_changed_config_an_included_file_that_appears_or_a_new_mode_asks_again(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    extra = tmp_path / "conf.d"
    extra.mkdir()
    config, log = config_and_log(
        tmp_path, monkeypatch, f"Include {extra}/*.conf\nHost n*\n  User bob\n"
    )
    assert resolve(config, "n1")[0]["user"] == ("bob",)
    (extra / "a.conf").write_text("Host n1\n  User carol\n")  # a new file the glob matches
    assert resolve(config, "n1")[0]["user"] == ("carol",)
    (extra / "a.conf").write_text("Host n1\n  User dave\n")  # an included file edited
    assert resolve(config, "n1")[0]["user"] == ("dave",)
    config.write_text(f"Include {extra}/*.conf\nHost n*\n  User bob\n  Port 2200\n")
    assert resolve(config, "n1")[0]["port"] == ("2200",)
    config.chmod(0o640)
    resolve(config, "n1")
    assert asked(log) == ["n1"] * 5
    resolve(config, "n1")
    assert asked(log) == ["n1"] * 5


@needs_openssh
def test_configs_that_must_be_asked_each_time_are_and_refusals_are_never_kept(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    config, log = config_and_log(tmp_path, monkeypatch, 'Match exec "true"\n  User bob\n')
    resolve(config, "n1")
    resolve(config, "n1")
    config.write_text("Host n1\n  NoSuchKeyword yes\n")
    for _ in range(2):
        with pytest.raises(UsageError, match="OpenSSH refuses the ssh config for host n1"):
            resolve(config, "n1")
    assert asked(log) == ["n1"] * 4
    assert not cache.exists() or not list(cache.iterdir())


@needs_openssh
def test_a_cache_others_may_write_or_a_file_not_written_by_dtrain_is_not_believed(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, cache: Path
) -> None:
    config, log = config_and_log(tmp_path, monkeypatch, "Host n1\n  HostName 198.18.0.11\n")
    resolve(config, "n1")
    (answer,) = answers(cache)
    answer.write_text("hostname 198.18.0.99\n")  # not an answer `ssh -G` wrote
    assert resolve(config, "n1")[0]["hostname"] == ("198.18.0.11",)
    cache.chmod(0o777)
    assert resolve(config, "n1")[0]["hostname"] == ("198.18.0.11",)
    resolve(config, "n1")
    assert asked(log) == ["n1"] * 4


@needs_openssh
def test_answers_unused_for_a_week_are_removed_when_new_ones_are_kept(
    tmp_path: Path, cache: Path
) -> None:
    config = tmp_path / "ssh_config"
    config.write_text("Host n1\n  HostName 198.18.0.11\n")
    resolve(config, "n1")
    (old,) = answers(cache)
    week_ago = time.time() - 8 * 86400
    os.utime(old, (week_ago, week_ago))
    resolve(config, "n1")  # a hit refreshes the answer it used
    assert old.exists() and old.stat().st_mtime > week_ago
    os.utime(old, (week_ago, week_ago))
    config.write_text("Host n1\n  HostName 198.18.0.12\n")
    resolve(config, "n1")  # a new answer is kept; the folder was swept less than a day ago
    assert old.exists() and len(answers(cache)) == 2
    day_ago = time.time() - 86401
    os.utime(cache / sshcache.SWEPT, (day_ago, day_ago))
    config.write_text("Host n1\n  HostName 198.18.0.13\n")
    resolve(config, "n1")  # a new answer is kept, the stale one goes
    assert not old.exists() and len(answers(cache)) == 2
    assert (cache / sshcache.SWEPT).stat().st_mtime > day_ago + 60


def answers(cache: Path) -> list[Path]:
    return [path for path in cache.iterdir() if path.name != sshcache.SWEPT]


def test_a_sweep_comes_at_most_once_a_day_and_a_stamp_from_the_future_does_not_stop_it(
    tmp_path: Path,
) -> None:
    folder = tmp_path / "ssh-G"
    folder.mkdir(mode=0o700)
    kept = sshcache.Answers(folder, "0" * 64)
    stale = folder / "old.txt"
    now = time.time()

    def left_stale() -> None:
        stale.write_text("host n1\n")
        os.utime(stale, (now - 8 * 86400, now - 8 * 86400))

    left_stale()
    kept.prune(now)
    assert not stale.exists()
    left_stale()
    kept.prune(now + 3600)  # swept an hour ago
    assert stale.exists()
    kept.prune(now + 86401)
    assert not stale.exists()
    left_stale()
    os.utime(folder / sshcache.SWEPT, (now + 30 * 86400, now + 30 * 86400))
    kept.prune(now + 86402)
    assert not stale.exists()
    assert answers(folder) == []
