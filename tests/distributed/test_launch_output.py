"""What ``--nproc`` shows: an error once, without the launcher's traceback, with the exit code
lmctl documents; torch's warnings once, not once per process; no launcher banner; and
``--nproc 1`` without a launcher."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from tests.distributed.conftest import TINY_GPT2, environment, finish, lmctl_command

pytestmark = pytest.mark.distributed


def launch(args: list[str | Path], cwd: Path) -> subprocess.CompletedProcess[str]:
    """``lmctl ARGS`` as a user starts it: OMP_NUM_THREADS unset, so the launcher would print
    its banner about it."""
    env = environment()
    env.pop("OMP_NUM_THREADS")
    proc = subprocess.Popen(
        lmctl_command(*args), cwd=cwd, env=env, stdout=subprocess.PIPE,
        stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip
    return finish(proc)


def tiny_run(tokenizer: Path, train: Path, out: Path, *extra: str) -> list[str | Path]:
    return [
        "train", "clm", *TINY_GPT2, "--tokenizer", tokenizer, "--train-file", train,
        "--block-size", "32", "--max-steps", "2", "--per-device-train-batch-size", "4",
        "--no-eval", "-o", out, *extra,
    ]  # fmt: skip


def assert_no_launcher_noise(stderr: str) -> None:
    for noise in ("Traceback", "ChildFailedError", "Root Cause", "Setting OMP_NUM_THREADS"):
        assert noise not in stderr, stderr


def test_a_user_error_under_nproc_is_said_once(bpe_tokenizer: Path, tmp_path: Path) -> None:
    blank = tmp_path / "blank.txt"
    blank.write_text("")
    proc = launch(tiny_run(bpe_tokenizer, blank, tmp_path / "run", "--nproc", "2"), tmp_path)
    assert proc.returncode == 3, proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, proc.stderr
    assert "blank.txt: no records" in errors[0]
    assert_no_launcher_noise(proc.stderr)
    shown = next(line for line in proc.stderr.splitlines() if "running: " in line)
    assert "running: OMP_NUM_THREADS=1 " in shown  # torchrun's own default, said
    assert len(proc.stderr.splitlines()) < 8, proc.stderr


def test_torch_warnings_come_from_the_main_process_only(
    bpe_tokenizer: Path, unique_lines: tuple[Path, Path], tmp_path: Path
) -> None:
    """DDP warns about find_unused_parameters from every process; the main one says it."""
    train, _ = unique_lines
    proc = launch(tiny_run(bpe_tokenizer, train, tmp_path / "run", "--nproc", "2"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "[rank1]" not in proc.stderr, proc.stderr
    assert proc.stderr.count("find_unused_parameters") <= 1, proc.stderr
    assert_no_launcher_noise(proc.stderr)


def test_nproc_1_runs_in_the_process_itself(
    bpe_tokenizer: Path, unique_lines: tuple[Path, Path], tmp_path: Path
) -> None:
    train, _ = unique_lines
    proc = launch(tiny_run(bpe_tokenizer, train, tmp_path / "run", "--nproc", "1"), tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert "running: " not in proc.stderr  # no launcher command
    assert (tmp_path / "run" / "model.safetensors").is_file()
