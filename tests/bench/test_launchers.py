"""How the benchmark asks each launcher for the same job: plain argv and environment."""

from __future__ import annotations

from pathlib import Path

from bench import launchers


def job_and_setup(
    tmp_path: Path, before: Path | None = None
) -> tuple[launchers.Job, launchers.Setup]:
    job = launchers.Job(("h1", "h2"), 2, ("/usr/bin/python3", "-S", "task.py"))
    return job, launchers.Setup(ssh_config=tmp_path / "ssh_config", scratch=tmp_path, before=before)


def test_before_is_the_same_command_with_its_tree_first_on_the_path(tmp_path: Path) -> None:
    job, setup = job_and_setup(tmp_path, before=tmp_path / "old")
    ours, theirs = launchers.command("dtrain", job, setup), launchers.command("before", job, setup)
    assert theirs.argv == ours.argv
    assert theirs.env == {"PYTHONPATH": str(tmp_path / "old")}
    assert ours.env == {}
    assert (tmp_path / "hosts-2x2-1").read_text() == "h1 slots=2\nh2 slots=2\n"


def test_pdsh_and_ssh_run_every_copy_on_every_host(tmp_path: Path) -> None:
    job, setup = job_and_setup(tmp_path)
    pdsh = launchers.command("pdsh", job, setup)
    assert pdsh.argv[pdsh.argv.index("-w") + 1] == "h1,h2"
    assert "i < 2" in pdsh.argv[-1]
    script = launchers.command("ssh", job, setup).argv[-1]
    assert [line.split()[4] for line in script.splitlines() if line.startswith("ssh ")] == [
        "h1", "h2", "h1", "h2",
    ]  # fmt: skip
