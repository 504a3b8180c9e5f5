"""Evaluations inside training: scored as ``lmctl eval`` scores (one process, a plain model),
with the Trainer's keys, and the last step evaluated once."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmctl.engine import ENGINES
from lmctl.evaluation.loop import scores_in_memory
from tests.conftest import lmctl, slow_except, tiny_clm_args

TRAINER_KEYS = {
    "eval_loss",
    "eval_accuracy",
    "eval_runtime",
    "eval_samples_per_second",
    "eval_steps_per_second",
    "epoch",
}


@pytest.mark.e2e
@pytest.mark.parametrize("engine", slow_except(list(ENGINES), "trainer"))
def test_the_last_step_is_evaluated_once_with_the_numbers_of_lmctl_eval(
    engine: str, bpe_tokenizer: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    args = tiny_clm_args(
        bpe_tokenizer, text_files, "--engine", engine, "--eval-strategy", "steps",
        "--eval-steps", "2", "--max-eval-samples", "40", "-o", run, block_size=32,
    )  # fmt: skip
    proc = lmctl(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    evaluations = [record for record in records if "eval_loss" in record]
    assert [record["step"] for record in evaluations] == [2, 4]  # step 4 once, not twice
    last = evaluations[-1]
    assert set(last) >= TRAINER_KEYS
    final = json.loads((run / "eval_results.json").read_text())
    assert final["eval_loss"] == round(last["eval_loss"], 4)
    assert final["eval_accuracy"] == last["eval_accuracy"]
    separate = lmctl("eval", run, "--max-eval-samples", "40", "--output", tmp_path / "e.json")
    assert separate.returncode == 0, separate.stderr[-3000:]
    again = json.loads((tmp_path / "e.json").read_text())
    assert again["eval_accuracy"] == pytest.approx(last["eval_accuracy"], abs=1e-9)
    assert again["eval_loss"] == round(last["eval_loss"], 4)
    assert again["eval_samples"] == final["eval_samples"] == 40


def test_one_process_without_a_wrapper_scores_in_memory() -> None:
    from accelerate import Accelerator

    assert scores_in_memory(Accelerator(cpu=True))
