"""What a new user meets first: results that must be trustworthy, and the messages around
them. Each test runs the command a user would type."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import TINY_GPT2, assert_clean_failure, lmctl, minilm_path

pytestmark = pytest.mark.e2e


def warnings_of(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if " WARN " in line]


def test_eval_refuses_a_model_without_the_objective_head(
    tmp_path: Path, text_files: tuple[Path, Path]
) -> None:
    _, valid = text_files
    args = (
        "eval", minilm_path(), "--task", "mlm", "--validation-file", valid,
        "--max-eval-samples", "8", "--max-seq-length", "32",
    )  # fmt: skip
    proc = lmctl(*args, cwd=tmp_path)
    assert_clean_failure(proc, 5, "no mlm head", "cls.predictions", "--allow-random-head")
    assert "learnt by this run" not in proc.stderr
    assert proc.stdout == ""

    proc = lmctl(*args, "--allow-random-head", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert any("randomly initialised" in line for line in warnings_of(proc)), proc.stderr
    assert "eval_loss" in json.loads(proc.stdout)["metrics"]


@pytest.fixture(scope="module")
def encoder_as_clm(
    tmp_path_factory: pytest.TempPathFactory, text_files: tuple[Path, Path]
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    work = tmp_path_factory.mktemp("encoder-clm")
    train, _ = text_files
    out = work / "run"
    proc = lmctl(
        "train", "clm", "--model", minilm_path(), "--train-file", train,
        "--max-train-samples", "40", "--block-size", "32", "--per-device-train-batch-size", "2",
        "--max-steps", "1", "--save-steps", "1", "--no-eval", "-o", out, cwd=work,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_clm_trains_an_encoder_as_a_decoder_and_says_so(
    encoder_as_clm: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, proc = encoder_as_clm
    saved = json.loads((out / "config.json").read_text())
    assert saved["architectures"] == ["BertLMHeadModel"]
    assert saved["is_decoder"] is True
    assert "bert is an encoder: using it as a causal LM with is_decoder=True" in proc.stderr
    # The head that the encoder lacks is learnt by this run, and the log says so.
    assert "newly initialised (not in the checkpoint, learnt by this run): cls." in proc.stderr


def test_resume_says_the_head_comes_from_the_checkpoint(
    encoder_as_clm: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, _ = encoder_as_clm
    proc = lmctl("resume", out, "--max-steps", "2", cwd=out.parent)
    assert proc.returncode == 0, proc.stderr
    assert "learnt by this run" not in proc.stderr
    assert "are restored from checkpoint-1" in proc.stderr, proc.stderr


def test_re_evaluating_a_run_is_quiet_and_matches_training(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    train, valid = text_files
    out = tmp_path / "run"
    proc = lmctl(
        "train", "clm", *TINY_GPT2, "--tokenizer-name", bpe_tokenizer, "--train-file", train,
        "--validation-file", valid, "--max-train-samples", "200", "--max-eval-samples", "40",
        "--block-size", "32", "--max-steps", "3", "-o", out, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    trained = json.loads((out / "all_results.json").read_text())

    proc = lmctl("eval", out, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert warnings_of(proc) == [], proc.stderr
    metrics = json.loads(proc.stdout)["metrics"]
    assert metrics["eval_loss"] == trained["eval_loss"]
    assert metrics["perplexity"] == trained["perplexity"]

    # Asking for a file that replaces one is worth a warning.
    proc = lmctl("eval", out, "--overwrite-results", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert any("replacing" in line for line in warnings_of(proc)), proc.stderr
