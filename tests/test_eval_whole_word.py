"""``lmctl eval`` of a whole-word-masking mlm run: the collator gets the word offsets it reads,
and the numbers equal the final evaluation of training (the same deterministic masks)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TINY_BERT, lmctl


@pytest.mark.e2e
@pytest.mark.parametrize(
    "layout",
    [["--line-by-line"], pytest.param([], marks=pytest.mark.slow)],
    ids=["line-by-line", "grouped"],
)
def test_eval_of_a_whole_word_mask_run(
    layout: list[str], text_files: tuple[Path, Path], wordpiece_tokenizer: Path, tmp_path: Path
) -> None:
    train, valid = text_files
    run = tmp_path / "run"
    proc = lmctl(
        "train", "mlm", *TINY_BERT, "--tokenizer-name", wordpiece_tokenizer,
        "--train-file", train, "--validation-file", valid, *layout, "--whole-word-mask",
        "--max-seq-length", "32", "--max-train-samples", "64", "--max-eval-samples", "24",
        "--per-device-train-batch-size", "8", "--max-steps", "4", "-o", run,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    trained = json.loads((run / "eval_results.json").read_text())

    proc = lmctl("eval", run, "--json", "--output", tmp_path / "again.json")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    metrics = json.loads(proc.stdout)["metrics"]
    assert metrics["eval_samples"] == trained["eval_samples"] == 24
    assert metrics["eval_loss"] == pytest.approx(trained["eval_loss"], rel=1e-5)
    assert metrics["eval_accuracy"] == pytest.approx(trained["eval_accuracy"], abs=1e-6)
