"""A task's checks before it starts: whether the kernel can run its program, its GPUs."""

from __future__ import annotations

from pathlib import Path

import pytest

from dtrain.remote.checks import exec_format_problem, gpu_note


@pytest.mark.parametrize(
    ("head", "binfmt", "refused"),
    [
        (b"import os\n", None, True),  # a Python file without its #! line
        (b"", None, True),
        (b"#!/bin/sh\n", None, False),
        (b"\x7fELF\x02\x01", None, False),
        (b"import os\n", ("enabled", ["python3"]), False),  # a handler may take it
        (b"import os\n", ("disabled", ["python3"]), True),
        (b"import os\n", ("enabled", []), True),
    ],
)
def test_a_file_the_kernel_cannot_execute_is_found_before_it_is_run(
    tmp_path: Path, head: bytes, binfmt: tuple[str, list[str]] | None, refused: bool
) -> None:
    program = tmp_path / "train"
    program.write_bytes(head + b"print(1)\n")
    folder = tmp_path / "binfmt_misc"  # not there: binfmt_misc is not mounted
    if binfmt is not None:
        folder.mkdir()
        (folder / "status").write_text(binfmt[0] + "\n")
        for name in ["register", *binfmt[1]]:
            (folder / name).write_text("")
    assert exec_format_problem(str(program), str(folder)) is refused


def test_a_gpu_index_the_host_lacks_gets_a_note(tmp_path: Path) -> None:
    gpus = tmp_path / "gpus"
    gpus.mkdir()
    for bus in ("0000:3b:00.0", "0000:af:00.0"):
        (gpus / bus).mkdir()
    no_kfd = str(tmp_path / "kfd")
    assert gpu_note({"CUDA_VISIBLE_DEVICES": "1"}, str(gpus), no_kfd) is None
    assert gpu_note({"CUDA_VISIBLE_DEVICES": "0,7"}, str(gpus), no_kfd) == (
        "CUDA_VISIBLE_DEVICES=0,7, but this host has no GPU 7 (the NVIDIA driver shows GPUs 0-1)"
    )
    assert gpu_note({"CUDA_VISIBLE_DEVICES": "7"}, str(tmp_path / "none"), no_kfd) == (
        "CUDA_VISIBLE_DEVICES=7, but this host has no GPU 7 (the NVIDIA driver shows no GPU)"
    )
    assert gpu_note({"CUDA_VISIBLE_DEVICES": "GPU-8c1f"}, str(gpus), no_kfd) is None
    assert gpu_note({"CUDA_VISIBLE_DEVICES": ""}, str(gpus), no_kfd) is None
    assert gpu_note({}, str(gpus), no_kfd) is None
