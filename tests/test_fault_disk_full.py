"""The run directory's disk fills at the second checkpoint: a real full file system (a small
tmpfs, mounted when the tests run as root, which CI does), not a simulated error.

The run ends with exit code 4 naming the last good checkpoint, which is complete; the run,
moved to a larger disk, finishes with ``lmctl resume``."""

from __future__ import annotations

import os
import shutil
import subprocess
from collections.abc import Iterator
from pathlib import Path

import pytest

from tests.conftest import assert_clean_failure, lmctl, tiny_clm_args

pytestmark = [pytest.mark.e2e, pytest.mark.faults]


def _size(path: Path) -> int:
    return sum(p.stat().st_size for p in path.rglob("*") if p.is_file())


@pytest.fixture
def small_disk(tmp_path: Path) -> Iterator[Path]:
    """An empty folder where the test mounts a small tmpfs; unmounted at the end."""
    if os.geteuid() != 0 or shutil.which("mount") is None:
        pytest.skip("mounting a small tmpfs needs root (CI runs as root)")
    disk = tmp_path / "disk"
    disk.mkdir()
    yield disk
    subprocess.run(["umount", "-l", str(disk)], check=False)


def test_a_full_disk_at_the_second_checkpoint_keeps_the_first_and_resume_finishes(
    small_disk: Path,
    tmp_path: Path,
    text_files: tuple[Path, Path],
    bpe_tokenizer: Path,
) -> None:
    disk = small_disk
    args = tiny_clm_args(
        bpe_tokenizer, text_files, "--save-steps", "2", "--no-eval", block_size=32, steps=6
    )
    # The same run on a roomy disk tells how much the first checkpoint and what precedes it
    # take: the small disk holds that and half a checkpoint more.
    sized = tmp_path / "sized"
    probe = lmctl(*args, "--max-steps", "2", "-o", sized, cwd=tmp_path)
    assert probe.returncode == 0, probe.stderr
    checkpoint = _size(sized / "checkpoint-2")
    before = _size(sized) - _size(sized / "checkpoint-2")
    for name in ("model.safetensors", "all_results.json", "train_results.json", "README.md"):
        if (sized / name).is_file():
            before -= (sized / name).stat().st_size
    size_kib = (before + checkpoint + checkpoint // 2) // 1024 + 64
    mounted = subprocess.run(
        ["mount", "-t", "tmpfs", "-o", f"size={size_kib}k", "tmpfs", str(disk)],
        capture_output=True,
        text=True,
        check=False,
    )
    if mounted.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {mounted.stderr.strip()}")

    run = disk / "run"
    full = lmctl(*args, "-o", run, cwd=tmp_path)
    assert_clean_failure(full, 4, "no space left", "the last good checkpoint is checkpoint-2")
    assert "lmctl resume" in full.stderr
    kept = sorted(p.name for p in run.iterdir() if p.name.startswith("checkpoint-"))
    assert kept == ["checkpoint-2"]
    assert not [p.name for p in run.iterdir() if p.name.startswith(".tmp-")]  # the half save went

    moved = tmp_path / "larger" / "run"
    shutil.copytree(run, moved)
    resumed = lmctl("resume", moved, cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert (moved / "model.safetensors").is_file()
    assert (moved / "checkpoint-6").is_dir()
