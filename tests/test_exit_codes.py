"""Ordinary mistakes exit with their documented code and one line, before any work, and
leave no half-made run directory behind."""

from __future__ import annotations

import shutil
from collections.abc import Callable
from pathlib import Path

import pytest

from tests.conftest import (
    assert_clean_failure,
    lmctl,
    tiny_clm_args,
    without_packages,
)

pytestmark = pytest.mark.e2e

Case = Callable[[Path, Path, Path], list[str | Path]]


def _train(tmp: Path, train: Path, tokenizer: Path, *extra: str | Path) -> list[str | Path]:
    return tiny_clm_args(
        tokenizer, (train, None), "--output-dir", tmp / "run", *extra, block_size=None, steps=1
    )


def _deepspeed_config(tmp: Path, train: Path, tokenizer: Path) -> list[str | Path]:
    config = tmp / "lmctl.yaml"
    config.write_text("training_args:\n  deepspeed: {zero_optimization: {stage: 2}}\n")
    return _train(tmp, train, tokenizer, "--config", config)


def _nested_negative_batch(tmp: Path, train: Path, tokenizer: Path) -> list[str | Path]:
    config = tmp / "lmctl.yaml"
    config.write_text("training_args:\n  per_device_train_batch_size: -4\n")
    return _train(tmp, train, tokenizer, "--config", config)


def _output_under_a_file(tmp: Path, train: Path, tokenizer: Path) -> list[str | Path]:
    (tmp / "notes.txt").write_text("a file\n")
    args = _train(tmp, train, tokenizer)
    args[args.index(tmp / "run")] = tmp / "notes.txt" / "run"
    return args


CASES: dict[str, tuple[Case, int, str]] = {
    "unknown tracker, trainer": (
        lambda t, d, k: _train(t, d, k, "--report-to", "nosuchtracker"),
        2,
        "--report-to nosuchtracker",
    ),
    "unknown tracker, accelerate": (
        lambda t, d, k: _train(t, d, k, "--report-to", "nosuchtracker", "--engine", "accelerate"),
        2,
        "--report-to nosuchtracker",
    ),
    "tracker not installed, trainer": (
        lambda t, d, k: _train(t, d, k, "--report-to", "comet_ml"),
        2,
        "not installed",
    ),
    "deepspeed not installed": (_deepspeed_config, 2, "needs the deepspeed package"),
    "output dir under a file": (_output_under_a_file, 2, "notes.txt"),
    "negative batch size under training_args": (
        _nested_negative_batch,
        2,
        "training_args.per_device_train_batch_size: Input should be greater than 0 (got -4)",
    ),
}


@pytest.mark.parametrize("name", list(CASES))
def test_train_mistakes_exit_with_their_code(
    name: str, tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    build, code, needle = CASES[name]
    hidden = without_packages(tmp_path, "comet_ml", "deepspeed")
    proc = lmctl(*build(tmp_path, text_files[0], bpe_tokenizer), env=hidden)
    assert_clean_failure(proc, code, needle)
    assert not (tmp_path / "run").exists(), "a half-made run directory was left behind"


def test_truncated_weights_exit_5(
    tiny_clm_run: Path, tmp_path: Path, text_files: tuple[Path, Path]
) -> None:
    model = tmp_path / "model"
    shutil.copytree(tiny_clm_run, model, ignore=shutil.ignore_patterns("checkpoint-*"))
    weights = model / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[: weights.stat().st_size // 2])
    before = weights.read_bytes()
    proc = lmctl("eval", model, "--validation-file", text_files[1], "--block-size", "64")
    assert_clean_failure(proc, 5, str(model))
    assert weights.read_bytes() == before
