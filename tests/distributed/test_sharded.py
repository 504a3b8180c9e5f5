"""DeepSpeed ZeRO and FSDP (version 2) on two CPU processes: train, checkpoint, SIGKILL,
``lmctl resume``, finish; the final weights equal an uninterrupted run's. A ZeRO-2 or ZeRO-3
checkpoint of two processes also goes on on one, with the uninterrupted run's eval loss within
1%."""

from __future__ import annotations

import json
import shutil
from pathlib import Path

import pytest

from lmctl.run import checkpoints
from tests.distributed.conftest import (
    RECORDER,
    TINY_GPT2,
    kill_when,
    lmctl_command,
    max_difference,
    results,
    run,
    start,
    weights,
)

pytestmark = pytest.mark.distributed

SHARDING = {
    "zero2-trainer": ("--deepspeed", "2"),
    "zero3-trainer": ("--deepspeed", "3"),
    "fsdp2-trainer": ("--fsdp", "--fsdp-auto-wrap"),
    "zero2-accelerate": ("--deepspeed", "2", "--engine", "accelerate"),
}


#: Resumed on one process from a checkpoint of two (the others are refused, with the reason).
RESHARDED = {"zero2-trainer", "zero3-trainer"}
REFUSED = {
    "fsdp2-trainer": "FSDP states are sharded per process",
    "zero2-accelerate": "the accelerate engine does not reshard DeepSpeed ZeRO states",
}


def _args(tokenizer: Path, data: tuple[Path, Path], out: Path, *extra: str) -> list[str]:
    train, valid = data
    return [
        "train", "clm", *TINY_GPT2, "--tokenizer", str(tokenizer), "--train-file", str(train),
        "--validation-file", str(valid), "--block-size", "32", "--max-steps", "10",
        "--per-device-train-batch-size", "4", "--learning-rate", "1e-3", "--save-steps", "5",
        "--import", str(RECORDER), "-o", str(out), "--nproc", "2", *extra,
    ]  # fmt: skip


@pytest.mark.parametrize("name", list(SHARDING))
def test_sharded_run_resumes_after_sigkill_to_the_same_weights(
    name: str,
    deepspeed_ops: None,
    bpe_tokenizer: Path,
    unique_lines: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    options = SHARDING[name]
    full, killed = tmp_path / "full", tmp_path / "killed"
    proc = run(lmctl_command(*_args(bpe_tokenizer, unique_lines, full, *options)), tmp_path)
    assert proc.returncode == 0, proc.stderr[-4000:]
    assert proc.stdout.count("lmctl train clm:") == 1
    # Accelerate applies FSDP on accelerators only: on these CPU processes the run says so.
    assert ("--fsdp on CPU processes" in proc.stderr) == name.startswith("fsdp")

    def saved_first() -> bool:  # checkpoints are renamed into place once complete
        return (killed / "checkpoint-5").is_dir()

    slow = {"LMCTL_STEP_DELAY": "1"}
    proc = start(
        lmctl_command(*_args(bpe_tokenizer, unique_lines, killed, *options)), tmp_path, slow
    )
    kill_when(proc, saved_first)
    assert not (killed / "model.safetensors").exists()
    if name in RESHARDED:
        # A copy goes on on one process: DeepSpeed's states through their universal form.
        alone = tmp_path / "alone"
        shutil.copytree(killed, alone)
        resumed = run(lmctl_command("resume", alone, "--nproc", "1"), tmp_path)
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        assert "into a universal checkpoint" in resumed.stderr
        assert "continuing on 1 with the same global batch of 8" in resumed.stderr
        latest = checkpoints.latest_checkpoint(alone)
        assert latest is not None and checkpoints.checkpoint_world_size(latest) == 1
        assert checkpoints.checkpoint_step(latest) == 10
        final, expected = results(alone)["eval_loss"], results(full)["eval_loss"]
        assert abs(final - expected) <= 0.01 * expected, (final, expected)
    else:
        refused = run(lmctl_command("resume", killed, "--nproc", "1"), tmp_path)
        assert refused.returncode == 2, refused.stderr[-2000:]
        assert "saved by 2 process(es) and cannot continue on 1" in refused.stderr
        assert REFUSED[name] in refused.stderr
    resumed = run(lmctl_command("resume", killed, "--nproc", "2"), tmp_path)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert checkpoints.checkpoint_step(checkpoints.latest_checkpoint(killed)) == 10  # type: ignore[arg-type]
    assert max_difference(weights(full), weights(killed)) <= 1e-5
    assert results(killed)["eval_loss"] == pytest.approx(results(full)["eval_loss"], rel=1e-5)
    records = [json.loads(line) for line in (killed / "metrics.jsonl").open()]
    assert any(record.get("event") == "resume" for record in records)
