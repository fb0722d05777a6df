"""A real PyTorch DDP job (gloo) that checkpoints, has a rank killed mid-training, and resumes:
dtrain restarts the whole job, every rank loads the checkpoint, and the model ends the same as
a run that never failed (examples/torch_ddp_resume.py)."""

from __future__ import annotations

import json
import os
import re
import signal
import time
from pathlib import Path

from tests.conftest import PYTHON, ROOT, latest_job, run_dtrain, start_dtrain, wait_for_line

RESUME = str(ROOT / "examples" / "torch_ddp_resume.py")
STEPS = ["--steps", "20", "--every", "5"]


def checksums(stdout: str) -> list[str]:
    return re.findall(r"\] rank \d checksum (\S+ \S+)", stdout)


def test_a_killed_rank_resumes_from_its_checkpoint_to_the_same_model(workdir: Path) -> None:
    plain = run_dtrain(
        ["launch", "--framework", "torch", "-n", "2", "--",
         PYTHON, RESUME, *STEPS, "--checkpoint", str(workdir / "plain.pt")],
        workdir,
        timeout_s=240,
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr[-3000:]
    expected = checksums(plain.stdout)
    plain_job = latest_job(workdir)
    assert len(expected) == 2 and expected[0] == expected[1]

    process = start_dtrain(
        ["launch", "--framework", "torch", "-n", "2", "--max-restarts", "2",
         "--restart-delay", "1", "--restart-window", "0", "--",
         PYTHON, RESUME, *STEPS, "--sleep", "0.3", "--checkpoint", str(workdir / "r.pt")],
        workdir,
    )  # fmt: skip
    try:
        deadline = time.monotonic() + 60
        while latest_job(workdir) == plain_job and time.monotonic() < deadline:
            time.sleep(0.1)
        logs = latest_job(workdir)
        wait_for_line(logs / "worker.0.log", "checkpoint at step 9", timeout_s=180)
        started = wait_for_line(logs / "worker.1.log", "starts at step 0", timeout_s=10)
        pid = int(re.search(r"pid (\d+) starts", started).group(1))  # type: ignore[union-attr]
        os.kill(pid, signal.SIGKILL)  # mid-training, after a checkpoint, from outside
        stdout, stderr = process.communicate(timeout=240)
    finally:
        if process.poll() is None:
            process.kill()
            process.communicate()
    assert process.returncode == 0, stderr[-3000:]
    assert "attempt 1 of 3 failed: worker.1 was killed by SIGKILL" in stderr
    second = latest_job(workdir) / "attempt-2"
    for rank in (0, 1):
        text = (second / f"worker.{rank}.log").read_text()
        assert f"rank {rank} resumed from step" in text
        assert "starts at step 0" not in text
    assert checksums(stdout)[-2:] == expected  # the same model as the run that never failed
    attempts = json.loads((latest_job(workdir) / "job.json").read_text())["attempts"]
    assert [a["state"] for a in attempts] == ["failed", "succeeded"]
