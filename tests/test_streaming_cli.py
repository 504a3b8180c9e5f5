"""Streaming and `lmctl prepare` through the command line, as a user or CI job runs them."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import TINY_GPT2, corpus_lines, lmctl, slow_except


def test_streaming_without_max_steps_is_a_config_error(text_files: tuple[Path, Path]) -> None:
    train, _ = text_files
    proc = lmctl("train", "clm", *TINY_GPT2, "--tokenizer", "tok", "--train-file", train,
                 "--streaming")  # fmt: skip
    assert proc.returncode == 2
    assert "--streaming needs --max-steps" in proc.stderr
    assert "Traceback" not in proc.stderr


def test_prepare_refuses_streaming_from_a_config(
    tmp_path: Path, text_files: tuple[Path, Path]
) -> None:
    train, _ = text_files
    config = tmp_path / "c.yaml"
    config.write_text(f"train_file: {train}\ntokenizer_name: tok\nstreaming: true\n")
    proc = lmctl("prepare", "clm", "--config", config)
    assert proc.returncode == 2
    assert "does not stream" in proc.stderr


@pytest.mark.e2e
def test_streaming_train_run(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    train, valid = text_files
    out = tmp_path / "run"
    proc = lmctl(
        "train", "clm", *TINY_GPT2, "--tokenizer", bpe_tokenizer,
        "--train-file", train, "--validation-file", valid,
        "--streaming", "--max-steps", "10", "--block-size", "32",
        "--per-device-train-batch-size", "4", "--max-eval-samples", "16",
        "--dataloader-num-workers", "2", "--json", "-o", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["global_step"] == 10
    metrics = json.loads((out / "all_results.json").read_text())
    assert metrics["train_samples"] == 40
    assert metrics["eval_samples"] == 16
    assert "perplexity" in metrics
    assert "streaming" in proc.stderr
    assert (out / "model.safetensors").is_file()


@pytest.mark.e2e
@pytest.mark.parametrize("engine", slow_except(["accelerate", "trainer"], "accelerate"))
def test_streaming_output_counts_passes_and_samples(
    engine: str, tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    """A stream has no length: evaluating it says no step count and then the samples seen;
    its epoch is the passes completed (the same on both engines); a resumed run's
    train_samples count every segment."""
    train, valid = text_files
    out = tmp_path / "run"
    proc = lmctl(
        "train", "clm", *TINY_GPT2, "--tokenizer", bpe_tokenizer, "--train-file", train,
        "--validation-file", valid, "--streaming", "--max-steps", "4", "--save-steps", "2",
        "--block-size", "32", "--per-device-train-batch-size", "4", "--logging-steps", "2",
        "--max-eval-samples", "8", "--engine", engine, "--precision", "auto", "-o", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert re.search(r"training in (fp32|bf16) on cpu \(--precision auto\)", proc.stderr)
    assert "train: streaming " in proc.stderr and " in 1 shard, " in proc.stderr
    assert "steps" not in next(x for x in proc.stderr.splitlines() if "INFO  evaluating" in x)
    assert "evaluating: 8 samples" in proc.stderr
    assert re.search(r"step 4/4  epoch 0  ", proc.stderr), proc.stderr
    proc = lmctl("resume", out, "--max-steps", "6")
    assert proc.returncode == 0, proc.stderr
    assert json.loads((out / "all_results.json").read_text())["train_samples"] == 6 * 4
    epochs = [json.loads(line).get("epoch") for line in (out / "metrics.jsonl").open()]
    assert {epoch for epoch in epochs if epoch is not None} == {0.0}  # under one pass


@pytest.mark.e2e
def test_prepare_then_train_reuses_the_cache(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    train, valid = text_files
    data = ("--train-file", train, "--validation-file", valid, "--block-size", "32")
    cache = ("--prepared-cache-dir", tmp_path / "cache")
    proc = lmctl("prepare", "clm", "--tokenizer", bpe_tokenizer, *data, *cache, "--json")
    assert proc.returncode == 0, proc.stderr
    prepared = json.loads(proc.stdout)
    assert prepared["splits"]["train"]["rows"] > 0
    assert prepared["splits"]["validation"]["rows"] > 0
    assert "prepared data cached in" in proc.stderr

    proc = lmctl(
        "train", "clm", *TINY_GPT2, "--tokenizer", bpe_tokenizer, *data, *cache,
        "--max-steps", "2", "-o", tmp_path / "run",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    reuse = [line for line in proc.stderr.splitlines() if "reusing prepared data" in line]
    assert len(reuse) == 1, proc.stderr
    assert f"train {prepared['splits']['train']['rows']} rows" in reuse[0]
    assert "preparing" not in proc.stderr


@pytest.mark.slow
@pytest.mark.e2e
def test_resumed_stream_reads_on_from_the_checkpoint(tmp_path: Path, bpe_tokenizer: Path) -> None:
    """Resume restores the stream position exactly, even after the data wrapped around:
    the resumed steps see the same batches (hence the same losses) as the run they continue."""
    small = tmp_path / "small.txt"  # a few steps per pass, so 20 steps read it several times
    small.write_text("\n".join(corpus_lines()[:60]) + "\n")
    run = (
        "train", "clm", *TINY_GPT2, "--tokenizer", bpe_tokenizer, "--train-file", small,
        "--streaming", "--max-steps", "20", "--save-steps", "12", "--block-size", "32",
        "--per-device-train-batch-size", "8", "--logging-steps", "1", "--no-eval",
    )  # fmt: skip
    first = tmp_path / "first"
    proc = lmctl(*run, "-o", first)
    assert proc.returncode == 0, proc.stderr
    position = json.loads((first / "checkpoint-12" / "stream_position.json").read_text())
    assert position["epoch"] >= 1, "the test needs the stream to have wrapped around"
    # Where each shard's reader stopped, so that the resumed run seeks there.
    assert position["readers"] and all(len(row) == 5 for row in position["readers"].values())

    # Positions recorded by one dataloader layout mean nothing to another: refused, exit 2.
    proc = lmctl(*run, "-o", tmp_path / "other", "--resume-from-checkpoint",
                 first / "checkpoint-12", "--dataloader-num-workers", "1")  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "resume with --dataloader-num-workers 0" in proc.stderr
    assert "Traceback" not in proc.stderr

    proc = lmctl(*run, "-o", tmp_path / "second", "--resume-from-checkpoint",
                 first / "checkpoint-12")  # fmt: skip
    assert proc.returncode == 0, proc.stderr

    def losses(folder: Path) -> dict[int, float]:
        records = [json.loads(line) for line in (folder / "metrics.jsonl").open()]
        return {r["step"]: r["loss"] for r in records if "loss" in r}

    resumed = losses(tmp_path / "second")
    assert sorted(resumed) == list(range(13, 21))
    original = losses(first)
    for step, loss in resumed.items():
        assert loss == pytest.approx(original[step], abs=1e-6), step


@pytest.mark.e2e
def test_concurrent_processes_prepare_once(tmp_path: Path, bpe_tokenizer: Path) -> None:
    """As ranks of a distributed run: one process prepares, the other waits and reuses."""
    import os
    import subprocess
    import sys

    corpus = tmp_path / "corpus.txt"
    corpus.write_text(("\n".join(corpus_lines()) + "\n") * 4)
    args = [
        sys.executable, "-m", "lmctl", "prepare", "clm", "--tokenizer", str(bpe_tokenizer),
        "--train-file", str(corpus), "--no-eval", "--block-size", "64",
        "--prepared-cache-dir", str(tmp_path / "cache"),
    ]  # fmt: skip
    env = {**os.environ, "CI": "1"}
    procs = [
        subprocess.Popen(args, env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
        for _ in range(2)
    ]
    logs = [proc.communicate(timeout=600)[1] for proc in procs]
    assert [proc.returncode for proc in procs] == [0, 0], logs
    built = [log for log in logs if "prepared data cached in" in log]
    assert len(built) == 1, logs
    other = logs[1 - logs.index(built[0])]
    assert "waiting for it" in other or "reusing prepared data" in other


@pytest.mark.distributed
def test_trainer_ranks_read_disjoint_shards(tmp_path: Path) -> None:
    """Two DDP ranks (torchrun, CPU) with two dataloader workers each: every rank trains on
    lines from its own shards only, and no line twice."""
    import os
    import subprocess
    import sys

    lines = 4000
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("".join(f"w{n}\n" for n in range(lines)))
    probe = Path(__file__).parent / "distributed" / "stream_probe.py"
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2",
         str(probe), str(corpus), str(tmp_path), str(lines)],
        env={**os.environ, "ACCELERATE_USE_CPU": "true", "OMP_NUM_THREADS": "1"},
        capture_output=True, text=True, timeout=600, check=False,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    ranks = [json.loads((tmp_path / f"rank{r}.json").read_text()) for r in (0, 1)]
    shards = ranks[0]["shards"]
    assert sorted(n for shard in shards.values() for n in shard) == list(range(lines))
    seen = [rank["seen"] for rank in ranks]
    assert all(len(tokens) == 10 * 4 * 4 for tokens in seen)  # steps x batch x block
    assert not set(seen[0]) & set(seen[1]), "two ranks trained on the same line"

    opened: dict[str, list[str]] = {}  # shard -> the processes that read it
    for log in tmp_path.glob("reads-*.txt"):
        _, rank, pid = log.stem.split("-")
        if int(pid) == ranks[int(rank)]["main_pid"]:
            continue  # the up-front check for a first block, before training
        for shard in log.read_text().split():
            opened.setdefault(shard, []).append(f"rank {rank} pid {pid}")
    readers = {reader for names in opened.values() for reader in names}
    assert len(readers) == 4, f"2 ranks x 2 workers should all read: {opened}"
    assert all(len(names) == 1 for names in opened.values()), f"a shard was read twice: {opened}"
    shard_of = {n: start for start, shard in shards.items() for n in shard}
    for rank, tokens in enumerate(seen):
        own = {shard for shard, names in opened.items() if names[0].startswith(f"rank {rank} ")}
        assert {str(shard_of[n]) for n in tokens} <= own, "a rank trained on another's shard"
