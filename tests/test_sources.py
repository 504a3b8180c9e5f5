"""Named sources: readers with shard lists, weighted mixtures, per-source evaluation, secrets
in reader arguments and the errors of each (``train_sources``/``validation_sources``)."""

from __future__ import annotations

import json
import sqlite3
from pathlib import Path
from typing import Any

import pytest
import yaml

from tests.conftest import TINY_GPT2, lmctl

EXAMPLE = Path(__file__).resolve().parents[1] / "examples" / "sources"
SECRET = "s3cret-value-for-the-table-42"


def make_table(path: Path, rows: int = 400, partitions: int = 8) -> None:
    with sqlite3.connect(path) as connection:
        connection.execute("CREATE TABLE corpus (id INTEGER PRIMARY KEY, partition INT, text TEXT)")
        connection.executemany(
            "INSERT INTO corpus VALUES (?, ?, ?)",
            [(i, i % partitions, f"row {i} of the table") for i in range(rows)],
        )


def test_reader_shards_split_between_ranks_and_workers_are_disjoint_and_whole(
    tmp_path: Path,
) -> None:
    """The training stream of a reader, as a run builds it, cut for two processes as
    Accelerate cuts it (``IterableDataset.shard``) and read by two dataloader workers each:
    no row is read twice, none is missed."""
    from torch.utils.data import DataLoader

    from lmctl.config.loader import build_config
    from lmctl.config.slices import Access, DataSpec, take
    from lmctl.console import Console, OutputOptions
    from lmctl.data.stream import example_streams
    from lmctl.data.stream.mixture import stream_named_sources
    from lmctl.data.stream.sources import Readers
    from lmctl.objectives.clm import ClmConfig

    database = tmp_path / "corpus.db"
    make_table(database)
    source = {
        "name": "table",
        "reader": f"{EXAMPLE / 'readers.py'}:rows",
        "args": {"db": str(database), "partitions": list(range(8))},
    }
    config = build_config(
        ClmConfig,
        cli_values={"train_sources": [source], "model_type": "gpt2", "tokenizer_name": "t",
                    "streaming": True, "max_steps": 1, "do_eval": False},
    )  # fmt: skip
    data = take(DataSpec, config)
    sources = stream_named_sources(
        data, take(Access, config), Readers(2, 2),
        need_train=True, need_eval=False, text_options={}, records=True,
    )  # fmt: skip

    def ids(batch: list[dict[str, Any]]) -> dict[str, list[Any]]:
        return {"id": [record["id"] for record in batch]}

    console = Console(OutputOptions(quiet=True))
    train = example_streams(data, sources, {"train": ids}, console, seed=1, unit="record")["train"]
    seen: list[list[int]] = []
    for rank in range(2):
        part = train.shard(num_shards=2, index=rank)
        loader = DataLoader(part, batch_size=None, num_workers=2)  # type: ignore[arg-type]
        seen.append([int(example["id"]) for example in loader])
    first, second = set(seen[0]), set(seen[1])
    assert len(first) == len(seen[0]) and len(second) == len(seen[1])
    assert not first & second
    assert first | second == set(range(400))


def test_a_mixture_draws_each_source_by_its_weight() -> None:
    import datasets

    from lmctl.data.mixture import mix, mixture_counts

    parts = [
        datasets.Dataset.from_dict({"source": [name] * 20_000}) for name in ("first", "second")
    ]
    mixed = mix(parts, [0.7, 0.3], seed=42, stopping_strategy="first_exhausted")
    share = mixed.select(range(10_000))["source"].count("first") / 10_000
    assert abs(share - 0.7) <= 0.02
    counts = mixture_counts(
        [20_000, 20_000], [0.7, 0.3], seed=42, stopping_strategy="first_exhausted"
    )
    assert counts == [mixed["source"].count("first"), mixed["source"].count("second")]


def test_a_reference_to_an_environment_variable_is_kept_and_its_value_is_not() -> None:
    from lmctl import secrets

    kept = secrets.redact({"args": {"token": "${DB_TOKEN}", "password": "plain"}}, drop=True)
    assert kept == {"args": {"token": "${DB_TOKEN}"}}


def write_config(folder: Path, **extra: Any) -> Path:
    data = {
        "train_sources": [
            {
                "name": "table",
                "reader": "readers.py:rows",
                "args": {
                    "db": "corpus.db",
                    "partitions": [0, 1, 2, 3, 4, 5, 6],
                    "token": "${DB_TOKEN}",
                },
                "weight": 0.7,
            },
            {"name": "books", "file": "books.txt", "weight": 0.3},
        ],
        "validation_sources": [
            {
                "name": "table",
                "reader": "readers.py:rows",
                "args": {"db": "corpus.db", "partitions": [7]},
            },
            {"name": "books", "file": "books-valid.txt"},
        ],
        **extra,
    }
    path = folder / "sources.yaml"
    path.write_text(yaml.safe_dump(data), encoding="utf-8")
    return path


@pytest.fixture
def work(tmp_path: Path) -> Path:
    make_table(tmp_path / "corpus.db", rows=600)
    (tmp_path / "readers.py").write_text((EXAMPLE / "readers.py").read_text(), encoding="utf-8")
    lines = [f"line {i} of a book about the sea and the ships" for i in range(400)]
    (tmp_path / "books.txt").write_text("\n".join(lines[:300]) + "\n", encoding="utf-8")
    (tmp_path / "books-valid.txt").write_text("\n".join(lines[300:]) + "\n", encoding="utf-8")
    return tmp_path


def train(work: Path, config: Path, tokenizer: Path, *extra: str) -> Any:
    return lmctl(
        "train",
        "clm",
        "--config",
        config,
        *TINY_GPT2,
        "--tokenizer-name",
        tokenizer,
        "--block-size",
        "16",
        "--max-steps",
        "3",
        "--output-dir",
        work / "out",
        *extra,
        cwd=work,
        env={"DB_TOKEN": SECRET},
    )


@pytest.mark.e2e
def test_a_mixture_trains_and_reports_each_source_without_its_secret(
    work: Path, bpe_tokenizer: Path
) -> None:
    proc = train(work, write_config(work), bpe_tokenizer)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((work / "out" / "all_results.json").read_text())
    for name in ("table", "books"):
        assert results[f"eval_{name}_loss"] > 0
        assert results[f"eval_{name}_perplexity"] > 1
        assert f"eval_{name}_accuracy" in results
        assert 0 < results[f"train_{name}_share"] < 1
    assert abs(results["train_table_share"] - 0.7) < 0.1
    assert "eval_loss" in results and "perplexity" in results
    assert "training mixture: table (reader" in proc.stderr
    assert "declares no version" not in proc.stderr  # the example's reader has one
    for text in (proc.stdout, proc.stderr):
        assert SECRET not in text
    for path in (work / "out").rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
    saved = yaml.safe_load((work / "out" / "lmctl.yaml").read_text())
    assert saved["train_sources"][0]["args"]["token"] == "${DB_TOKEN}"


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("change", "code", "expected"),
    [
        ({"reader": "no_such_module:rows"}, 2, "no module named 'no_such_module'"),
        ({"reader": "readers.py:missing"}, 2, "has no function 'missing'"),
        ({"args": {"db": "corpus.db", "shards": [0]}}, 2, "the args do not fit"),
        ({"weight": -1}, 2, "train_sources[0].weight"),
        ({"name": "books"}, 2, "train_sources[1].name: 'books' names another source"),
        ({"args": {"db": "missing-dir/x.db", "partitions": [0, 1]}}, 3, "raised on shard"),
        ({"reader": "readers.py:partial_rows"}, 3, "a record without column 'text'"),
    ],
)
def test_source_errors_exit_with_their_code_and_no_traceback(
    work: Path, bpe_tokenizer: Path, change: dict[str, Any], code: int, expected: str
) -> None:
    (work / "readers.py").write_text(
        (EXAMPLE / "readers.py").read_text()
        + "\n\ndef partial_rows(db, partitions):\n"
        + "    yield {'id': 0, 'text': 'a'}\n    yield {'id': 1}\n",
        encoding="utf-8",
    )
    config = write_config(work)
    data = yaml.safe_load(config.read_text())
    data["train_sources"][0].update(change)
    if "reader" in change and change["reader"].endswith("partial_rows"):
        data["train_sources"][0]["args"] = {"db": "corpus.db", "partitions": [0]}
    config.write_text(yaml.safe_dump(data), encoding="utf-8")
    proc = train(work, config, bpe_tokenizer)
    assert proc.returncode == code, proc.stderr
    assert expected in proc.stderr
    assert "Traceback" not in proc.stderr
    if code == 3 and "shard" in expected:
        assert "train_sources[0] (table)" in proc.stderr and "partitions=[0]" in proc.stderr
    if "record without" in expected:
        assert "{'id': 1}" in proc.stderr


@pytest.mark.e2e
def test_a_streamed_mixture_trains_and_evaluates_each_source_without_its_secret(
    work: Path, bpe_tokenizer: Path
) -> None:
    proc = train(work, write_config(work), bpe_tokenizer, "--streaming", "--max-eval-samples",
                 "16", "--dataloader-num-workers", "2")  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "train: streaming train_sources (table, books) in 2 sources" in proc.stderr
    assert "validation_table: streaming validation_sources[0] (table) in 1 shard" in proc.stderr
    results = json.loads((work / "out" / "all_results.json").read_text())
    for name in ("table", "books"):
        assert results[f"eval_{name}_loss"] > 0
        assert results[f"eval_{name}_perplexity"] > 1
    assert "eval_loss" in results
    # The examples of each source that training read, over the two dataloader workers.
    examples = {name: results[f"train_{name}_examples"] for name in ("table", "books")}
    assert sum(examples.values()) == results["train_samples"] == 3 * 8
    for name, count in examples.items():
        assert 0 < count < 3 * 8
        assert results[f"train_{name}_share"] == round(count / (3 * 8), 4)
        assert f"train_{name}_share" in proc.stdout  # in the end-of-run summary
    for text in (proc.stdout, proc.stderr):
        assert SECRET not in text
    for path in (work / "out").rglob("*"):
        if path.is_file():
            assert SECRET.encode() not in path.read_bytes(), path
