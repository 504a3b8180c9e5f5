"""--train-tokenizer: the tokenizer trained for a run is kept in the prepared-data cache under
a hash of the texts it learnt from, so the same command trains the same model again and data
`lmctl prepare` tokenized with it is reused (two WordPiece trainings on one text differ)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import TINY_BERT, lmctl

SHAPE = ("--line-by-line", "--max-seq-length", "32")


def _mlm(command: str, train: Path, cache: Path, *extra: str | Path) -> str:
    """The log of a successful ``lmctl <command> mlm`` with a trained tokenizer."""
    proc = lmctl(
        command, "mlm", *TINY_BERT, "--train-tokenizer", "300", "--train-file", train, *SHAPE,
        *extra, env={"LMCTL_CACHE": str(cache)},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    return proc.stderr


def _vocabulary(run: Path) -> dict[str, int]:
    return dict(json.loads((run / "tokenizer.json").read_text())["model"]["vocab"])


@pytest.mark.slow
def test_prepare_then_train_twice_use_one_tokenizer_and_one_prepared_cache(
    tmp_path: Path, text_files: tuple[Path, Path]
) -> None:
    train, _ = text_files
    cache = tmp_path / "cache"
    log = _mlm("prepare", train, cache)
    assert "trained a wordpiece tokenizer" in log
    kept = list((cache / "prepared" / "tokenizers").glob("wordpiece-300-*.json"))
    assert len(kept) == 1
    runs = [tmp_path / "first", tmp_path / "second"]
    for run in runs:
        log = _mlm("train", train, cache, "--max-steps", "4", "-o", run)
        assert f"using the wordpiece tokenizer trained on these texts before: {kept[0]}" in log
        assert "reusing prepared data" in log and "preparing it again" not in log
    assert _vocabulary(runs[0]) == _vocabulary(runs[1])
    assert _vocabulary(runs[0]) == json.loads(kept[0].read_text())["model"]["vocab"]
    results = [json.loads((run / "all_results.json").read_text()) for run in runs]
    assert results[0]["eval_loss"] == results[1]["eval_loss"]


@pytest.mark.slow
def test_other_texts_train_another_and_overwrite_cache_trains_anew(
    tmp_path: Path, text_files: tuple[Path, Path]
) -> None:
    train, _ = text_files
    cache = tmp_path / "cache"
    folder = cache / "prepared" / "tokenizers"
    _mlm("prepare", train, cache)
    (kept,) = folder.iterdir()
    fewer = tmp_path / "fewer.txt"
    fewer.write_text("".join(train.read_text().splitlines(keepends=True)[:-5]))
    log = _mlm("prepare", fewer, cache)
    assert "trained a wordpiece tokenizer" in log
    assert len(list(folder.iterdir())) == 2
    kept.write_text('{"not": "a tokenizer"}')
    log = _mlm("prepare", train, cache)
    assert f"{kept} is not a tokenizer file" in log and "trained a wordpiece tokenizer" in log
    assert json.loads(kept.read_text())["model"]["type"] == "WordPiece"
    log = _mlm("prepare", train, cache, "--overwrite-cache")
    assert "trained a wordpiece tokenizer" in log and "using the" not in log
    assert json.loads(kept.read_text())["model"]["type"] == "WordPiece"
