"""Exact resume for every objective on every engine: a run killed with SIGKILL after a
checkpoint and continued with ``lmctl resume`` ends with exactly the weights of a run that was
never interrupted (random masks and permutations included)."""

from __future__ import annotations

import signal
from pathlib import Path

import pytest

from lmctl.engine import ENGINES
from lmctl.run import checkpoints
from tests.conftest import TINY_BERT, TINY_GPT2, TINY_XLNET, corpus_lines, lmctl
from tests.test_resume import _max_weight_diff, _run_until

MAX_STEPS = 24
SAVE_STEPS = 8
KILL_AFTER = SAVE_STEPS + 3


@pytest.fixture(scope="module")
def data(
    tmp_path_factory: pytest.TempPathFactory,
    swag_files: tuple[Path, Path],
    bpe_tokenizer: Path,
    wordpiece_tokenizer: Path,
) -> dict[str, Path]:
    """Text of about 15 batches of 4 lines (so that 24 steps cross an epoch boundary),
    multiple-choice records and the tokenizers."""
    lines = tmp_path_factory.mktemp("exact-data") / "train.txt"
    lines.write_text("\n".join(corpus_lines()[:60]) + "\n", encoding="utf-8")
    return {
        "lines": lines,
        "swag": swag_files[0],
        "bpe": bpe_tokenizer,
        "wordpiece": wordpiece_tokenizer,
    }


def _objective_args(objective: str, data: dict[str, Path]) -> list[str | Path]:
    lines, wordpiece = data["lines"], data["wordpiece"]
    if objective == "clm":
        return [*TINY_GPT2, "--tokenizer-name", data["bpe"], "--train-file", lines,
                "--block-size", "32"]  # fmt: skip
    if objective == "mlm":
        return [*TINY_BERT, "--tokenizer-name", wordpiece, "--train-file", lines,
                "--line-by-line", "--max-seq-length", "32"]  # fmt: skip
    if objective == "plm":
        return [*TINY_XLNET, "--tokenizer-name", wordpiece, "--train-file", lines,
                "--max-seq-length", "32"]  # fmt: skip
    return [*TINY_BERT, "--tokenizer-name", wordpiece, "--train-file", data["swag"],
            "--max-seq-length", "32", "--max-train-samples", "60"]  # fmt: skip


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("objective", ["clm", "mlm", "plm", "swag"])
def test_sigkill_then_resume_is_exact(
    objective: str, engine: str, data: dict[str, Path], tmp_path: Path
) -> None:
    specific = _objective_args(objective, data)

    def args(out: Path) -> list[str]:
        return [str(arg) for arg in (
            "train", objective, "--engine", engine, *specific, "--no-eval",
            "--per-device-train-batch-size", "4", "--learning-rate", "1e-3",
            "--max-steps", MAX_STEPS, "--save-steps", SAVE_STEPS, "--logging-steps", "1",
            "-o", out,
        )]  # fmt: skip

    reference = tmp_path / "reference"
    proc = lmctl(*args(reference))
    assert proc.returncode == 0, proc.stderr

    out = tmp_path / "killed"
    killed = _run_until(args(out), out, KILL_AFTER, signal.SIGKILL)
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    latest = checkpoints.latest_checkpoint(out)
    assert latest is not None and checkpoints.checkpoint_step(latest) < MAX_STEPS, killed.stderr
    resumed = lmctl("resume", out)
    assert resumed.returncode == 0, resumed.stderr
    assert f"from {latest.name}" in resumed.stderr
    assert _max_weight_diff(reference, out) == 0.0
