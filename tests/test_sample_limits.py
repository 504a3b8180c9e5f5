"""``--max-train-samples``/``--max-eval-samples`` mean what they mean upstream, on every path:
blocks after grouping (clm, mlm, plm), samples after tokenizing (--line-by-line), examples
(swag); and the prepared-data cache holds whole splits, so a limit never needs a rebuild."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import TINY_BERT, TINY_GPT2, TINY_XLNET, corpus_lines, lmctl

COMMON = ("--per-device-train-batch-size", "2", "--max-steps", "1", "--save-strategy", "no")


def _results(run: Path) -> dict[str, Any]:
    results: dict[str, Any] = json.loads((run / "all_results.json").read_text())
    return results


@pytest.fixture(scope="module")
def gapped_lines(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Train/validation text with a blank line after every line of text."""
    lines = corpus_lines()
    folder = tmp_path_factory.mktemp("gapped")
    train, valid = folder / "train.txt", folder / "valid.txt"
    train.write_text("".join(f"{line}\n\n" for line in lines[:300]), encoding="utf-8")
    valid.write_text("".join(f"{line}\n\n" for line in lines[300:400]), encoding="utf-8")
    return train, valid


@pytest.mark.e2e
@pytest.mark.parametrize(
    "case",
    [
        ("clm", TINY_GPT2, ["--block-size", "32"]),
        pytest.param(("mlm", TINY_BERT, ["--max-seq-length", "32"]), marks=pytest.mark.slow),
        pytest.param(
            ("mlm", TINY_BERT, ["--max-seq-length", "32", "--line-by-line"]),
            marks=pytest.mark.slow,
        ),
        pytest.param(
            ("plm", TINY_XLNET, ["--max-seq-length", "32", "--line-by-line"]),
            marks=pytest.mark.slow,
        ),
    ],
    ids=["clm-blocks", "mlm-blocks", "mlm-lines", "plm-lines"],
)
def test_limits_count_model_samples(
    case: tuple[str, tuple[str, ...], list[str]],
    gapped_lines: tuple[Path, Path],
    bpe_tokenizer: Path,
    wordpiece_tokenizer: Path,
    tmp_path: Path,
) -> None:
    """Upstream selects the first N blocks (or non-blank line samples) after tokenizing; N
    raw lines would give fewer (blank lines) or more (short blocks) samples."""
    objective, model, layout = case
    train, valid = gapped_lines
    tokenizer = bpe_tokenizer if objective == "clm" else wordpiece_tokenizer
    for streaming in ([], ["--streaming"]):
        out = tmp_path / f"run{len(streaming)}"
        proc = lmctl(
            "train", objective, *model, "--tokenizer-name", tokenizer, *layout, *COMMON,
            "--train-file", train, "--validation-file", valid, *streaming,
            "--max-train-samples", "7", "--max-eval-samples", "5", "-o", out,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        results = _results(out)
        assert results["eval_samples"] == 5, (streaming, results)
        if not streaming:  # a stream counts the examples consumed by the steps
            assert results["train_samples"] == 7, results


@pytest.mark.e2e
@pytest.mark.slow
def test_swag_limits_count_examples(
    swag_files: tuple[Path, Path], wordpiece_tokenizer: Path, tmp_path: Path
) -> None:
    train, valid = swag_files
    for streaming in ([], ["--streaming"]):
        out = tmp_path / f"run{len(streaming)}"
        proc = lmctl(
            "train", "swag", *TINY_BERT, "--tokenizer-name", wordpiece_tokenizer, *COMMON,
            "--train-file", train, "--validation-file", valid, "--max-seq-length", "32",
            *streaming, "--max-train-samples", "7", "--max-eval-samples", "5", "-o", out,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        results = _results(out)
        assert results["eval_samples"] == 5, (streaming, results)
        if not streaming:
            assert results["train_samples"] == 7, results


@pytest.mark.e2e
@pytest.mark.slow
def test_prepared_cache_holds_whole_splits(
    gapped_lines: tuple[Path, Path], bpe_tokenizer: Path, tmp_path: Path
) -> None:
    """A limit is applied to the cached blocks: changing it reuses the cache, and a cache
    prepared with one limit gives the full split to a run without one."""
    train, valid = gapped_lines
    data = ("--train-file", train, "--validation-file", valid, "--block-size", "32",
            "--tokenizer-name", bpe_tokenizer,
            "--prepared-cache-dir", tmp_path / "cache")  # fmt: skip
    proc = lmctl("prepare", "clm", *data, "--max-train-samples", "3", "--json")
    assert proc.returncode == 0, proc.stderr
    full = json.loads(proc.stdout)["splits"]["train"]
    assert full["rows"] == 3
    assert full["blocks"] > 3  # the cache entry holds every block

    proc = lmctl("train", "clm", *TINY_GPT2, *data, *COMMON, "-o", tmp_path / "run")
    assert proc.returncode == 0, proc.stderr
    assert "preparing" not in proc.stderr and "reusing prepared data" in proc.stderr
    assert _results(tmp_path / "run")["train_samples"] == full["blocks"]
