"""Streaming on two ranks x two dataloader workers with uneven shards: every pass and every
evaluation ends on both ranks together (no rank left in a collective), no example is read by
both ranks, and a run killed with SIGKILL resumes each rank from its own position."""

from __future__ import annotations

from pathlib import Path

import pytest

from lmctl.run import checkpoints
from tests.distributed.conftest import (
    RECORDER,
    TINY_GPT2,
    kill_when,
    lmctl_command,
    records,
    results,
    run,
    start,
)

pytestmark = pytest.mark.distributed


@pytest.fixture(scope="module")
def uneven_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Files whose halves hold very different numbers of tokens per byte (digits, one token
    each, then long words), so byte-equal shards hold uneven numbers of blocks."""
    folder = tmp_path_factory.mktemp("uneven")
    digits = "".join(f"{n} {n % 7} {n % 3} {n % 5} {n % 2} {n % 9}\n" for n in range(700))
    words = "".join(f"thereupon{n} notwithstanding nevertheless\n" for n in range(400))
    train, valid = folder / "train.txt", folder / "valid.txt"
    train.write_text(digits + words)
    valid.write_text(digits[:3000] + words[:9000])
    return train, valid


def _args(tokenizer: Path, data: tuple[Path, Path], out: Path, engine: str) -> list[str]:
    train, valid = data
    return [
        "train", "clm", *TINY_GPT2, "--tokenizer", str(tokenizer), "--train-file", str(train),
        "--validation-file", str(valid), "--block-size", "16", "--streaming",
        "--dataloader-num-workers", "2", "--max-steps", "24", "--per-device-train-batch-size",
        "8", "--eval-strategy", "steps", "--eval-steps", "12", "--save-steps", "12",
        "--engine", engine, "--import", str(RECORDER), "-o", str(out), "--nproc", "2",
    ]  # fmt: skip


@pytest.mark.parametrize("engine", ["trainer", "accelerate"])
def test_uneven_stream_on_two_ranks_completes_and_resumes_per_rank(
    engine: str,
    bpe_tokenizer: Path,
    uneven_files: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    full, seen_full = tmp_path / "full", tmp_path / "seen-full"
    seen_full.mkdir()
    proc = run(
        lmctl_command(*_args(bpe_tokenizer, uneven_files, full, engine)),
        tmp_path,
        {"LMCTL_RECORD_DIR": str(seen_full)},
    )
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert results(full)["eval_samples"] > 0
    rows = [records(seen_full, 0), records(seen_full, 1)]
    assert len(rows[0]) == len(rows[1]) == 24 * 8
    # (That the ranks and their workers read disjoint shards is checked line by line in
    # test_streaming_cli.py::test_trainer_ranks_read_disjoint_shards; blocks of this
    # repetitive text can coincide.)
    # The data ran out and started over at least once: passes end on both ranks together.
    assert len(set(rows[0])) < len(rows[0])

    killed, seen_killed = tmp_path / "killed", tmp_path / "seen-killed"
    seen_killed.mkdir()
    slow = {"LMCTL_RECORD_DIR": str(seen_killed), "LMCTL_STEP_DELAY": "1"}
    proc = start(lmctl_command(*_args(bpe_tokenizer, uneven_files, killed, engine)), tmp_path, slow)
    kill_when(proc, (killed / "checkpoint-12").is_dir)
    checkpoint = checkpoints.latest_checkpoint(killed)
    assert checkpoint is not None
    step = checkpoints.checkpoint_step(checkpoint)
    seen_resumed = tmp_path / "seen-resumed"
    seen_resumed.mkdir()
    resumed = run(
        lmctl_command("resume", killed, "--nproc", "2"),
        tmp_path,
        {"LMCTL_RECORD_DIR": str(seen_resumed)},
    )
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    for rank in (0, 1):
        # Each rank continues from its own position in its own shards.
        assert records(seen_resumed, rank) == rows[rank][step * 8 :], f"rank {rank}"
