"""``lmctl train swag``: columns, record checks, choice encoding, collators, and runs."""

from __future__ import annotations

import csv
import json
from pathlib import Path
from typing import Any

import pytest

from lmctl.config.loader import build_config
from lmctl.config.slices import DataSpec, take
from lmctl.distributed import native_bf16
from lmctl.errors import ConfigError
from lmctl.objectives.swag import OBJECTIVE, SwagConfig, SwagOptions, _encode_choices
from tests.conftest import TINY_BERT, lmctl, minilm_path, swag_records, write_jsonl


def _config(train: Path | None, **values: Any) -> SwagConfig:
    base: dict[str, Any] = {"model_type": "bert", "tokenizer_name": "unused"}
    if train is not None:
        base["train_file"] = str(train)
    return build_config(SwagConfig, cli_values=base | values)


def test_hub_swag_is_the_default_data(tmp_path: Path) -> None:
    config = _config(None)
    assert (config.dataset_name, config.dataset_config_name) == ("swag", "regular")
    assert config.endings == ["ending0", "ending1", "ending2", "ending3"]


def test_ending_columns_from_a_config_file_list(tmp_path: Path) -> None:
    train = write_jsonl(tmp_path / "t.jsonl", swag_records(2, seed=0))
    path = tmp_path / "c.yaml"
    path.write_text(f"model_type: bert\ntokenizer_name: x\ntrain_file: {train}\n"
                    "ending_columns: [a, b, c]\n")  # fmt: skip
    config = build_config(SwagConfig, cli_values={}, config_file=str(path))
    assert config.endings == ["a", "b", "c"]


@pytest.mark.parametrize(
    "values,needle",
    [
        ({"ending_columns": "ending0"}, "needs two or more columns"),
        ({"ending_columns": "a,b,a"}, "listed twice"),
        ({"label_column": "ending1"}, "must name different columns"),
    ],
)
def test_column_flags_checked(tmp_path: Path, values: dict[str, Any], needle: str) -> None:
    train = write_jsonl(tmp_path / "t.jsonl", swag_records(2, seed=0))
    with pytest.raises(ConfigError, match=needle):
        _config(train, **values)


def test_plain_text_refused(tmp_path: Path) -> None:
    train = tmp_path / "t.txt"
    train.write_text("hello\n")
    with pytest.raises(ConfigError, match="needs records with columns"):
        _config(train)


def test_choices_are_encoded_flat_and_regrouped(wordpiece_tokenizer: Path) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(wordpiece_tokenizer)
    records = swag_records(3, seed=5, choices=3)
    examples = {key: [record[key] for record in records] for key in records[0]}
    out = _encode_choices(
        examples, tokenizer=tokenizer, context="sent1", question="sent2",
        endings=["ending0", "ending1", "ending2"], label="label", max_length=64,
        pad_to_max_length=False,
    )  # fmt: skip
    assert out["labels"] == [record["label"] for record in records]
    assert [len(choices) for choices in out["input_ids"]] == [3, 3, 3]
    for record, choices, types in zip(
        records, out["input_ids"], out["token_type_ids"], strict=True
    ):
        for index, ids in enumerate(choices):
            text = tokenizer.decode(ids)
            assert text.startswith(f"[CLS] {record['sent1']}".replace(" .", "."))
            assert text.endswith(f"{record['sent2']} {record[f'ending{index}']} [SEP]")
        assert set(types[0]) == {0, 1}  # context and ending are two segments


def test_collators_dynamic_multiple_of_8_or_fixed(
    tmp_path: Path, wordpiece_tokenizer: Path
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(wordpiece_tokenizer)
    train = write_jsonl(tmp_path / "t.jsonl", swag_records(2, seed=0))
    records = swag_records(4, seed=3)
    examples = {key: [record[key] for record in records] for key in records[0]}
    shapes = {}
    for name, values in {
        "plain": {},
        "fp16": {"fp16": True},
        "fixed": {"pad_to_max_length": True},
    }.items():
        config = _config(train, max_seq_length=40, **values)
        out = _encode_choices(
            examples, tokenizer=tokenizer, context="sent1", question="sent2",
            endings=config.endings, label="label", max_length=40,
            pad_to_max_length=config.pad_to_max_length,
        )  # fmt: skip
        features = [{key: out[key][i] for key in out} for i in range(4)]
        batch = OBJECTIVE.collator(
            take(SwagOptions, config),
            tokenizer,
            8 if config.mixed_precision(native_bf16) else None,
        )(features)
        assert batch["labels"].tolist() == [record["label"] for record in records]
        shapes[name] = tuple(batch["input_ids"].shape)
    longest = shapes["plain"][2]
    assert shapes["plain"][:2] == (4, 4) and longest % 8
    assert shapes["fp16"] == (4, 4, -(-longest // 8) * 8)
    assert shapes["fixed"] == (4, 4, 40)


def test_train_tokenizer_learns_from_the_choice_columns(tmp_path: Path) -> None:
    import datasets

    from lmctl.console import Console, OutputOptions
    from lmctl.models.tokenizer import train_tokenizer

    records = swag_records(50, seed=7)
    train = write_jsonl(tmp_path / "t.jsonl", records)
    config = _config(train, train_tokenizer=120, tokenizer_name=None)
    dataset = datasets.Dataset.from_list(records)
    texts = [
        text
        for batch in OBJECTIVE.training_texts(
            take(SwagOptions, config), take(DataSpec, config), dataset, "t"
        )
        for text in batch
    ]
    assert str(records[0]["sent1"]) in texts and str(records[0]["sent2"]) in texts
    assert str(records[0]["ending3"]) in texts and len(texts) == 50 * 6
    tokenizer = train_tokenizer(
        lambda: OBJECTIVE.training_texts(
            take(SwagOptions, config), take(DataSpec, config), dataset, "t"
        ),
        vocab_size=120,
        algorithm=OBJECTIVE.tokenizer_algorithm,
        model_max_length=64,
        console=Console(OutputOptions(quiet=True)),
        world_size=1,
    )
    assert tokenizer.tokenize("the lamp looks yellow") == ["the", "lamp", "looks", "yellow"]
    pair = tokenizer("the car is red .", "so the car looks red")
    assert tokenizer.convert_ids_to_tokens(pair["input_ids"])[0] == "[CLS]"
    assert set(pair["token_type_ids"]) == {0, 1}
    assert None not in (tokenizer.pad_token, tokenizer.mask_token, tokenizer.sep_token)


def test_record_lines_in_csv_and_jsonl(tmp_path: Path) -> None:
    from lmctl.data.load import record_location

    table = tmp_path / "t.csv"
    table.write_text('a,b\n1,"two\nlines"\n\n3,x\n4,y\n')
    assert [record_location(str(table), i) for i in range(3)] == ["line 2", "line 5", "line 6"]
    lines = tmp_path / "t.jsonl"
    lines.write_text('{"a": 1}\n\n{"a": 2}\n{"a": 3}\n')
    assert record_location(str(lines), 2) == "line 4"
    assert record_location(None, 4) == "record 5"


def _results(run: Path) -> dict[str, Any]:
    results: dict[str, Any] = json.loads((run / "all_results.json").read_text())
    return results


def _write_csv(path: Path, records: list[dict[str, Any]]) -> Path:
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(records[0]))
        writer.writeheader()
        writer.writerows(records)
    return path


def _renamed(records: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """Three choices under other column names, without a question column."""
    return [
        {"premise": r["sent1"], "a": r["ending0"], "b": r["ending1"], "c": r["ending2"],
         "answer": r["label"]}
        for r in records
    ]  # fmt: skip


@pytest.mark.e2e
def test_swag_from_scratch_with_custom_columns(tmp_path: Path, wordpiece_tokenizer: Path) -> None:
    from transformers import AutoModelForMultipleChoice, BertForMultipleChoice

    train = _write_csv(tmp_path / "train.csv", _renamed(swag_records(120, seed=1, choices=3)))
    valid = _write_csv(tmp_path / "valid.csv", _renamed(swag_records(30, seed=2, choices=3)))
    out = tmp_path / "run"
    proc = lmctl(
        "train", "swag", *TINY_BERT, "--tokenizer-name", wordpiece_tokenizer,
        "--train-file", train, "--validation-file", valid, "--context-column", "premise",
        "--question-column", "", "--ending-columns", "a,b,c", "--label-column", "answer",
        "--max-steps", "10", "--fast-paths", "fast-dropout", "--output-dir", out, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # named, every dropout is drawn by lmctl.fastpaths.dropout; nothing of it is saved
    assert "on: fast-dropout (named by --fast-paths)" in " ".join(proc.stderr.split())
    assert "lmctl" not in (out / "config.json").read_text()
    assert isinstance(AutoModelForMultipleChoice.from_pretrained(out), BertForMultipleChoice)
    results = _results(out)
    for key in ("train_loss", "eval_loss", "eval_accuracy", "train_samples", "eval_samples"):
        assert key in results, key
    assert "perplexity" not in results
    assert (results["train_samples"], results["eval_samples"]) == (120, 30)
    assert "pipeline_tag: multiple-choice" in (out / "README.md").read_text()


@pytest.mark.slow
@pytest.mark.e2e
def test_swag_learns_from_pretrained_minilm_offline(
    tmp_path: Path, swag_files: tuple[Path, Path]
) -> None:
    """The right ending is the colour named in the context: far above chance (0.25)."""
    train, valid = swag_files
    out = tmp_path / "run"
    proc = lmctl(
        "train", "swag", "--model", minilm_path(), "--train-file", train,
        "--validation-file", valid, "--max-seq-length", "32", "--max-steps", "30",
        "--learning-rate", "1e-4", "--per-device-train-batch-size", "8",
        "--output-dir", out, cwd=tmp_path,
        env={"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "newly initialised" in line]
    assert len(notes) == 1 and "classifier.weight" in notes[0], proc.stderr
    results = _results(out)
    assert results["eval_samples"] == 60
    assert results["eval_accuracy"] >= 0.9, results


def test_hub_default_dataset_offline_fails_fast(tmp_path: Path, wordpiece_tokenizer: Path) -> None:
    proc = lmctl(
        "train", "swag", *TINY_BERT, "--tokenizer-name", wordpiece_tokenizer,
        "--output-dir", tmp_path / "run", cwd=tmp_path,
        env={"HF_ENDPOINT": "http://127.0.0.1:9"}, timeout=120,
    )  # fmt: skip
    assert proc.returncode == 6, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "--dataset-name swag" in proc.stderr and "unreachable" in proc.stderr
