"""Streaming on two ranks x two dataloader workers with uneven shards: every pass and every
evaluation ends on both ranks together (no rank left in a collective), no example is read by
both ranks, and a run killed with SIGKILL resumes each rank from its own position, or on one
process from every rank's positions."""

from __future__ import annotations

import subprocess
from pathlib import Path

import pytest

from lmctl.run import checkpoints
from tests.distributed.conftest import (
    RECORDER,
    TINY_GPT2,
    corpus_lines,
    kill_when,
    lmctl_command,
    records,
    results,
    run,
    start,
    unique_text,
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
    _resume_on(2, killed, tmp_path, seen_resumed)
    for rank in (0, 1):
        # Each rank continues from its own position in its own shards.
        assert records(seen_resumed, rank) == rows[rank][step * 8 :], f"rank {rank}"


@pytest.fixture(scope="module")
def short_pass(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Unique lines few enough that a pass ends within a short run."""
    return unique_text(tmp_path_factory.mktemp("short"), 60, 40)


def _resume_on(
    nproc: int, run_dir: Path, cwd: Path, seen: Path
) -> subprocess.CompletedProcess[str]:
    """``lmctl resume RUN_DIR --nproc N``, its examples recorded in ``seen``; it must finish."""
    command = lmctl_command("resume", run_dir, "--nproc", str(nproc))
    resumed = run(command, cwd, {"LMCTL_RECORD_DIR": str(seen)})
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    return resumed


def _first_pass(rows: list[tuple[int, ...]], before: set[tuple[int, ...]]) -> list[tuple[int, ...]]:
    """``rows`` up to the first one read before (in ``before`` or earlier in ``rows``): where
    the next pass starts again from a shard's start."""
    seen = set(before)
    for index, row in enumerate(rows):
        if row in seen:
            return rows[:index]
        seen.add(row)
    return rows


@pytest.mark.parametrize("engine", ["trainer", "accelerate"])
def test_a_stream_saved_by_two_processes_goes_on_with_one(
    engine: str, bpe_tokenizer: Path, short_pass: tuple[Path, Path], tmp_path: Path
) -> None:
    """SIGKILL after a checkpoint of two processes, `lmctl resume --nproc 1`: the one process
    reads on from both ranks' positions, so its pass holds every example the two did not
    train on before the checkpoint, none twice, and ends with the eval loss of an
    uninterrupted run within 1%. A number of processes that cannot share the recorded
    shards is refused first."""
    train, valid = short_pass
    steps = 14

    def args(out: Path) -> list[str]:
        return [
            "train", "clm", *TINY_GPT2, "--tokenizer", str(bpe_tokenizer), "--train-file",
            str(train), "--validation-file", str(valid), "--block-size", "16", "--streaming",
            "--max-steps", str(steps), "--per-device-train-batch-size", "4",
            "--learning-rate", "1e-3", "--save-steps", "4", "--import", str(RECORDER),
            "--dataloader-num-workers", "2", "--engine", engine, "-o", str(out), "--nproc", "2",
        ]  # fmt: skip

    full, killed = tmp_path / "full", tmp_path / "killed"
    seen_full, seen_killed, seen_resumed = (tmp_path / n for n in ("sf", "sk", "sr"))
    for folder in (seen_full, seen_killed, seen_resumed):
        folder.mkdir()
    proc = run(lmctl_command(*args(full)), tmp_path, {"LMCTL_RECORD_DIR": str(seen_full)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    slow = {"LMCTL_RECORD_DIR": str(seen_killed), "LMCTL_STEP_DELAY": "0.5"}
    kill_when(start(lmctl_command(*args(killed)), tmp_path, slow), (killed / "checkpoint-4").is_dir)

    refused = run(lmctl_command("resume", killed, "--nproc", "3"), tmp_path)
    assert refused.returncode == 2, refused.stderr[-4000:]
    assert "4 shards" in refused.stderr and "processes that shares them: 1, 2" in refused.stderr

    resumed = _resume_on(1, killed, tmp_path, seen_resumed)
    assert "continuing on 1 with the same global batch of 8" in resumed.stderr
    assert "not batched in the uninterrupted run's order" in resumed.stderr
    # What the two processes trained on before the checkpoint (4 steps of 4 examples each).
    # (Two dataloader workers per process: their four shards split over one process's two.)
    before = [row for rank in (0, 1) for row in records(seen_killed, rank)[: 4 * 4]]
    assert len(set(before)) == len(before) == 32
    full_rows = [records(seen_full, rank) for rank in (0, 1)]
    assert before == full_rows[0][:16] + full_rows[1][:16]
    trained = [row for rows in full_rows for row in rows]
    assert len(set(trained)) < len(trained), "the uninterrupted run's pass did not end"
    resumed_rows = records(seen_resumed, 0)
    rest = _first_pass(resumed_rows, set(before))
    assert len(rest) < len(resumed_rows), "the resumed pass did not end"
    # None twice (_first_pass stops at the first repeat), none skipped: every example the
    # uninterrupted run trained on (its passes hold the same examples) is in the pass.
    assert set(trained) <= set(before) | set(rest)
    final, uninterrupted = results(killed)["eval_loss"], results(full)["eval_loss"]
    assert abs(final - uninterrupted) <= 0.01 * uninterrupted, (final, uninterrupted)


@pytest.mark.parametrize("engine", ["trainer", "accelerate"])
def test_a_stream_without_dataloader_workers_ends_its_pass_on_both_processes(
    engine: str, bpe_tokenizer: Path, short_pass: tuple[Path, Path], tmp_path: Path
) -> None:
    """Each process reads its stream itself (no dataloader workers): when one runs out
    within an accumulation window and the other does not, both end the pass there and go on
    into the next. (The Trainer's count of a window's tokens gathers across processes only
    where there is a batch: counted before the cut, the processes fell out of step and hung;
    Accelerate closed the window at the end of the data on one process only.)"""
    train, valid = short_pass
    out, seen = tmp_path / "run", tmp_path / "seen"
    seen.mkdir()
    args = [
        "train", "clm", *TINY_GPT2, "--tokenizer", str(bpe_tokenizer), "--train-file",
        str(train), "--validation-file", str(valid), "--block-size", "16", "--streaming",
        "--max-steps", "14", "--per-device-train-batch-size", "4",
        "--gradient-accumulation-steps", "2", "--import", str(RECORDER), "--engine", engine,
        "-o", str(out), "--nproc", "2",
    ]  # fmt: skip
    proc = run(lmctl_command(*args), tmp_path, {"LMCTL_RECORD_DIR": str(seen)})
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert (out / "checkpoint-14").is_dir() and (out / "model.safetensors").is_file()
    rows = [row for rank in (0, 1) for row in records(seen, rank)]
    assert len(set(rows)) < len(rows), "the pass did not end within the run"


@pytest.fixture(scope="module")
def eight_shards(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Text large enough (8 MiB) to be cut into 8 shards however few processes read it, so
    that a run of one process can go on with two."""
    folder = tmp_path_factory.mktemp("eight")
    lines = corpus_lines()
    train, valid = folder / "train.txt", folder / "valid.txt"
    with train.open("w") as out:
        n = 0
        while out.tell() < 8 << 20:
            out.write(f"{n} {lines[n % 1500]}\n")
            n += 1
    valid.write_text("".join(f"{line}\n" for line in lines[1500:1540]))
    return train, valid


@pytest.mark.parametrize("engine", ["trainer", "accelerate"])
def test_a_stream_saved_by_one_process_goes_on_with_two(
    engine: str, bpe_tokenizer: Path, eight_shards: tuple[Path, Path], tmp_path: Path
) -> None:
    """SIGKILL after a checkpoint of one process, `lmctl resume --nproc 2`: the two share the
    eight shards and read on from their positions: no example trained twice, the global
    batch kept, and the eval loss of an uninterrupted run within 1%."""
    train, valid = eight_shards

    def args(out: Path) -> list[str]:
        return [
            "train", "clm", *TINY_GPT2, "--tokenizer", str(bpe_tokenizer), "--train-file",
            str(train), "--validation-file", str(valid), "--block-size", "16", "--streaming",
            "--max-steps", "12", "--per-device-train-batch-size", "4",
            "--gradient-accumulation-steps", "2", "--learning-rate", "1e-3", "--save-steps", "4",
            "--import", str(RECORDER), "--engine", engine, "-o", str(out),
        ]  # fmt: skip

    full, killed = tmp_path / "full", tmp_path / "killed"
    seen_killed, seen_resumed = tmp_path / "sk", tmp_path / "sr"
    seen_killed.mkdir()
    seen_resumed.mkdir()
    proc = run(lmctl_command(*args(full)), tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    slow = {"LMCTL_RECORD_DIR": str(seen_killed), "LMCTL_STEP_DELAY": "0.5"}
    kill_when(start(lmctl_command(*args(killed)), tmp_path, slow), (killed / "checkpoint-4").is_dir)
    resumed = _resume_on(2, killed, tmp_path, seen_resumed)
    assert "continuing on 2 with the same global batch of 8" in resumed.stderr
    before = records(seen_killed, 0)[: 4 * 8]
    after = [row for rank in (0, 1) for row in records(seen_resumed, rank)]
    assert len(before) == 32 and len(after) == 8 * 8
    assert len(set(before + after)) == len(before) + len(after), "an example trained twice"
    final, uninterrupted = results(killed)["eval_loss"], results(full)["eval_loss"]
    assert abs(final - uninterrupted) <= 0.01 * uninterrupted, (final, uninterrupted)


def test_a_streamed_mixture_saved_by_two_processes_goes_on_with_one(
    bpe_tokenizer: Path, tmp_path: Path
) -> None:
    """A mixture of a reader (a table of eight partitions) and a text file, streamed by two
    processes of two dataloader workers each: SIGKILL after a checkpoint, `lmctl resume
    --nproc 1`: every shard of each source goes on from its position (its file cut as the
    two processes had it, and its shuffled order the same although the resumed run reads
    the file's path made absolute), no example is trained twice, and the examples of each
    source trained on count the whole run."""
    import sqlite3

    import yaml

    from tests.test_sources import EXAMPLE

    lines = corpus_lines()
    with sqlite3.connect(tmp_path / "corpus.db") as connection:
        connection.execute("CREATE TABLE corpus (id INTEGER PRIMARY KEY, partition INT, text TEXT)")
        rows = [(n, n % 8, f"{n} {line}") for n, line in enumerate(lines[:800])]
        connection.executemany("INSERT INTO corpus VALUES (?, ?, ?)", rows)
    (tmp_path / "readers.py").write_text((EXAMPLE / "readers.py").read_text())
    books = "".join(f"{n} {line}\n" for n, line in enumerate(lines[800:1100], start=800))
    (tmp_path / "books.txt").write_text(books)
    table = {"db": str(tmp_path / "corpus.db"), "partitions": list(range(8))}
    sources = [
        {
            "name": "table",
            "reader": f"{tmp_path / 'readers.py'}:rows",
            "args": table,
            "weight": 0.7,
        },
        {"name": "books", "file": "books.txt", "weight": 0.3},  # relative: lmctl.yaml's is not
    ]
    (tmp_path / "mix.yaml").write_text(yaml.safe_dump({"train_sources": sources}))
    killed, seen_killed, seen_resumed = tmp_path / "killed", tmp_path / "sk", tmp_path / "sr"
    seen_killed.mkdir()
    seen_resumed.mkdir()
    command = lmctl_command(
        "train", "clm", "--config", tmp_path / "mix.yaml", *TINY_GPT2, "--tokenizer",
        bpe_tokenizer, "--block-size", "16", "--streaming", "--max-steps", "12",
        "--per-device-train-batch-size", "4", "--save-steps", "4", "--no-eval",
        "--dataloader-num-workers", "2", "--engine", "accelerate", "--import", RECORDER,
        "-o", killed, "--nproc", "2",
    )  # fmt: skip
    slow = {"LMCTL_RECORD_DIR": str(seen_killed), "LMCTL_STEP_DELAY": "0.5"}
    kill_when(start(command, tmp_path, slow), (killed / "checkpoint-4").is_dir)

    resumed = _resume_on(1, killed, tmp_path, seen_resumed)
    assert "continuing on 1 with the same global batch of 8" in resumed.stderr
    before = [row for rank in (0, 1) for row in records(seen_killed, rank)[: 4 * 4]]
    after = records(seen_resumed, 0)
    assert len(before) == 32 and len(after) == 8 * 8
    assert len(set(before + after)) == len(before) + len(after), "an example trained twice"
    trained = results(killed)
    counts = [trained["train_table_examples"], trained["train_books_examples"]]
    assert sum(counts) == trained["train_samples"] == 12 * 8 and min(counts) > 0
