"""swag from a reader source: a generator of multiple-choice records (the context, ending and
label columns), mixed with a file of the same records, trains and is evaluated per source."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
import yaml

from tests.conftest import TINY_BERT, lmctl, swag_records, write_jsonl

READER = '''
import json


def choices(shards):
    """The records of each JSON-lines file of ``shards`` (a shard list): one shard per file."""
    for path in shards:
        with open(path, encoding="utf-8") as handle:
            for line in handle:
                yield json.loads(line)
'''


@pytest.mark.e2e
def test_swag_trains_on_a_reader_of_records_mixed_with_a_file(
    tmp_path: Path, wordpiece_tokenizer: Path
) -> None:
    (tmp_path / "mc_readers.py").write_text(READER, encoding="utf-8")
    shards = [
        str(write_jsonl(tmp_path / f"part-{index}.jsonl", swag_records(30, seed=index)))
        for index in range(3)
    ]
    write_jsonl(tmp_path / "file.jsonl", swag_records(40, seed=7))
    write_jsonl(tmp_path / "valid.jsonl", swag_records(16, seed=8))
    reader = {"reader": "mc_readers.py:choices"}
    config = {
        "train_sources": [
            {"name": "table", **reader, "args": {"shards": shards}, "weight": 0.6},
            {"name": "file", "file": "file.jsonl", "weight": 0.4},
        ],
        "validation_sources": [
            {"name": "table", **reader, "args": {"shards": [str(tmp_path / "valid.jsonl")]}},
            {"name": "file", "file": "valid.jsonl"},
        ],
    }
    (tmp_path / "mc.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    out = tmp_path / "run"
    proc = lmctl(
        "train", "swag", "--config", "mc.yaml", *TINY_BERT, "--tokenizer-name",
        wordpiece_tokenizer, "--max-seq-length", "32", "--max-steps", "3",
        "--per-device-train-batch-size", "4", "--output-dir", out, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "training mixture: table (reader" in proc.stderr
    results = json.loads((out / "all_results.json").read_text())
    for name in ("table", "file"):
        assert 0 <= results[f"eval_{name}_accuracy"] <= 1
        assert results[f"eval_{name}_loss"] > 0
        assert f"eval_{name}_perplexity" not in results  # swag has no perplexity
        assert 0 < results[f"train_{name}_share"] < 1
    assert (
        results["train_samples"] == results["train_table_records"] + results["train_file_records"]
    )
    assert results["eval_samples"] == 2 * 16


@pytest.mark.e2e
def test_a_reader_record_without_the_label_column_exits_3(
    tmp_path: Path, wordpiece_tokenizer: Path
) -> None:
    (tmp_path / "mc_readers.py").write_text(READER, encoding="utf-8")
    records = swag_records(8, seed=1)
    for record in records:
        del record["label"]
    shard = write_jsonl(tmp_path / "nolabel.jsonl", records)
    config = {"train_sources": [{"name": "t", "reader": "mc_readers.py:choices",
                                 "args": {"shards": [str(shard)]}}]}  # fmt: skip
    (tmp_path / "mc.yaml").write_text(yaml.safe_dump(config), encoding="utf-8")
    proc = lmctl(
        "train", "swag", "--config", "mc.yaml", *TINY_BERT, "--tokenizer-name",
        wordpiece_tokenizer, "--max-steps", "1", "--no-eval", cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "train_sources[0] (t)" in proc.stderr and "label" in proc.stderr
