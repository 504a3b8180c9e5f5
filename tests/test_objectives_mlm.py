"""``lmctl train mlm``: preprocessing, masking collators, metrics and tiny end-to-end runs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from lmctl.config.loader import build_config
from lmctl.config.slices import DataSpec, LoopSpec, take
from lmctl.console import Console, OutputOptions
from lmctl.distributed import native_bf16
from lmctl.objectives.mlm import OBJECTIVE, MlmConfig, MlmOptions
from tests.conftest import TINY_BERT, corpus_lines, lmctl, minilm_path


def _config(train: Path, **values: Any) -> MlmConfig:
    return build_config(
        MlmConfig,
        cli_values={"model_type": "bert", "tokenizer_name": "unused", "train_file": str(train)}
        | values,
    )


def _tokenizer(path: Path) -> Any:
    from transformers import AutoTokenizer

    return AutoTokenizer.from_pretrained(path)


def _features(tokenizer: Any, texts: list[str], **kwargs: Any) -> list[dict[str, Any]]:
    encoded = tokenizer(texts, return_special_tokens_mask=True, **kwargs)
    return [{key: encoded[key][i] for key in encoded} for i in range(len(texts))]


QUIET = Console(OutputOptions(quiet=True))


def test_line_by_line_skips_blank_lines_and_truncates(
    tmp_path: Path, wordpiece_tokenizer: Path
) -> None:
    import datasets

    from lmctl.objectives.common import tokenize_lines

    long_line = " ".join(corpus_lines()[:80])
    texts = ["To be, or not to be.", "", "   ", long_line, "\t", "Exeunt."]
    raw = datasets.DatasetDict({"train": datasets.Dataset.from_dict({"text": texts})})
    train = tmp_path / "t.txt"
    train.write_text("x\n")
    out = tokenize_lines(
        raw,
        _tokenizer(wordpiece_tokenizer),
        24,
        QUIET,
        data=take(DataSpec, _config(train)),
        loop=take(LoopSpec, _config(train)),
        text_options={},
        special_tokens_mask=True,
    )["train"]
    assert len(out) == 3  # three blank lines skipped
    lengths = [len(ids) for ids in out["input_ids"]]
    assert lengths[1] == 24  # the long line, truncated
    assert max(lengths) == 24 and lengths[0] < 24
    assert out["special_tokens_mask"][1][0] == 1 and out["special_tokens_mask"][1][-1] == 1


def test_group_into_blocks_keeps_offset_pairs() -> None:
    from lmctl.data.load import group_into_blocks

    out = group_into_blocks(
        {
            "input_ids": [[1, 2, 3], [], [4, 5]],
            "offset_mapping": [[[0, 1], [1, 2], [3, 4]], [], [[0, 2], [2, 3]]],
        },
        block_size=2,
    )
    assert out["input_ids"] == [[1, 2], [3, 4]]
    assert out["offset_mapping"] == [[[0, 1], [1, 2]], [[3, 4], [0, 2]]]


@pytest.mark.parametrize(
    "values,multiple_of_8",
    [
        ({"line_by_line": True, "bf16": True}, True),
        ({"line_by_line": True, "fp16": True}, True),
        ({"line_by_line": True}, False),
        ({"line_by_line": True, "bf16": True, "pad_to_max_length": True}, False),
    ],
)
def test_dynamic_padding_multiple_of_8_under_mixed_precision(
    tmp_path: Path, wordpiece_tokenizer: Path, values: dict[str, Any], multiple_of_8: bool
) -> None:
    train = tmp_path / "t.txt"
    train.write_text("x\n")
    tokenizer = _tokenizer(wordpiece_tokenizer)
    collator = OBJECTIVE.collator(
        take(MlmOptions, _config(train, **values)),
        tokenizer,
        8 if _config(train, **values).mixed_precision(native_bf16) else None,
    )
    features = _features(tokenizer, ["a short line", "a somewhat longer line of words here"])
    longest = max(len(f["input_ids"]) for f in features)
    assert longest % 8
    batch = collator(features)
    width = batch["input_ids"].shape[1]
    assert width == (-(-longest // 8) * 8 if multiple_of_8 else longest)
    assert batch["attention_mask"][0].sum() < width  # padding is masked out
    assert (batch["labels"][batch["attention_mask"] == 0] == -100).all()


def test_masks_never_hit_special_or_padding_tokens(
    tmp_path: Path, wordpiece_tokenizer: Path
) -> None:
    train = tmp_path / "t.txt"
    train.write_text("x\n")
    tokenizer = _tokenizer(wordpiece_tokenizer)
    collator = OBJECTIVE.collator(
        take(MlmOptions, _config(train, line_by_line=True, mlm_probability=0.9)), tokenizer, None
    )
    features = _features(tokenizer, ["the king is dead", "long live the king of all england"])
    batch = collator(features)
    special = set(tokenizer.all_special_ids)
    labelled = batch["labels"][batch["labels"] != -100].tolist()
    assert labelled and not special & set(labelled)


def test_unknown_tokens_are_never_drawn_and_the_draws_are_upstreams(
    tmp_path: Path, wordpiece_tokenizer: Path
) -> None:
    """run_mlm.py's Trainer drops the tokenizer's mask of added special tokens, so its
    collator marks every special id, [UNK] included: [UNK] is never a target. lmctl draws
    from the same tokens, and with the same random state the same masks."""
    import torch
    from transformers import DataCollatorForLanguageModeling

    train = tmp_path / "t.txt"
    train.write_text("x\n")
    tokenizer = _tokenizer(wordpiece_tokenizer)
    texts = ["the king \u2603 is \u2603 dead \u2603", "\u2603 long live the king \u2603 \u2603"]
    features = _features(tokenizer, texts)
    unknown = tokenizer.unk_token_id
    assert sum(ids.count(unknown) for ids in (f["input_ids"] for f in features)) >= 5
    collator = OBJECTIVE.collator(
        take(MlmOptions, _config(train, line_by_line=True, mlm_probability=0.9)), tokenizer, None
    )
    upstream = DataCollatorForLanguageModeling(tokenizer=tokenizer, mlm_probability=0.9)
    for seed in range(5):
        torch.manual_seed(seed)
        batch = collator([dict(f) for f in features])
        assert not (batch["labels"] == unknown).any()
        torch.manual_seed(seed)
        theirs = upstream([{"input_ids": f["input_ids"]} for f in features])
        assert torch.equal(batch["labels"], theirs["labels"])
        assert torch.equal(batch["input_ids"], theirs["input_ids"])


def test_a_batch_with_no_drawn_mask_gets_one_masked_token(
    tmp_path: Path, wordpiece_tokenizer: Path
) -> None:
    """With nothing drawn, the batch's loss would be a mean over no target (NaN): one of its
    non-special tokens is masked instead, and the rest stay as they were."""
    train = tmp_path / "t.txt"
    train.write_text("x\n")
    tokenizer = _tokenizer(wordpiece_tokenizer)
    config = _config(train, line_by_line=True, mlm_probability=1e-9)
    collator = OBJECTIVE.collator(take(MlmOptions, config), tokenizer, None)
    features = _features(tokenizer, ["the king", "long live the king"])
    original = [list(f["input_ids"]) for f in features]
    for _ in range(5):
        batch = collator([dict(f) for f in features])
        where = (batch["labels"] != -100).nonzero().tolist()
        assert len(where) == 1
        (row, column) = where[0]
        assert batch["input_ids"][row, column] == tokenizer.mask_token_id
        assert batch["labels"][row, column] == original[row][column]
        assert original[row][column] not in tokenizer.all_special_ids
        kept = batch["input_ids"].clone()
        kept[row, column] = original[row][column]
        assert [ids[: len(o)] for ids, o in zip(kept.tolist(), original, strict=True)] == original


def test_whole_word_mask_masks_every_piece_of_a_word(
    tmp_path: Path, wordpiece_tokenizer: Path
) -> None:
    train = tmp_path / "t.txt"
    train.write_text("x\n")
    tokenizer = _tokenizer(wordpiece_tokenizer)
    texts = ["unmeasurable forgetfulness overwhelming", "thunderstruck extraordinarily"] * 4
    features = _features(tokenizer, texts, return_offsets_mapping=True)
    assert any(
        tokenizer.convert_ids_to_tokens(f["input_ids"])[2].startswith("##") for f in features
    ), "the test needs words split into several pieces"
    collator = OBJECTIVE.collator(
        take(
            MlmOptions, _config(train, line_by_line=True, whole_word_mask=True, mlm_probability=0.5)
        ),
        tokenizer,
        None,
    )
    batch = collator(features)
    for row, feature in enumerate(features):
        tokens = tokenizer.convert_ids_to_tokens(feature["input_ids"])
        masked = (batch["labels"][row] != -100).tolist()
        word_start = 0
        for position, token in enumerate(tokens):
            if token.startswith("##"):
                assert masked[position] == masked[word_start], (tokens, masked)
            else:
                word_start = position
    assert (batch["labels"] != -100).any()


def test_eval_masks_are_deterministic_and_training_masks_are_not(
    tmp_path: Path, wordpiece_tokenizer: Path
) -> None:
    import torch

    train = tmp_path / "t.txt"
    train.write_text("x\n")
    tokenizer = _tokenizer(wordpiece_tokenizer)
    config = _config(train, line_by_line=True)
    features = _features(tokenizer, corpus_lines()[10:26])
    evaluate_1 = OBJECTIVE.eval_collator(take(MlmOptions, config), tokenizer, None, config.seed)(
        features
    )
    torch.rand(100)  # other use of the global generator in between
    evaluate_2 = OBJECTIVE.eval_collator(take(MlmOptions, config), tokenizer, None, config.seed)(
        features
    )
    again = OBJECTIVE.eval_collator(take(MlmOptions, config), tokenizer, None, config.seed)
    again(features[:4])
    evaluate_3 = again(features)
    for key in ("input_ids", "labels"):
        assert torch.equal(evaluate_1[key], evaluate_2[key])
        assert torch.equal(evaluate_1[key], evaluate_3[key])
    training = OBJECTIVE.collator(take(MlmOptions, config), tokenizer, None)
    first, second = training(features), training(features)
    assert not torch.equal(first["labels"], second["labels"])  # new masks every time


def test_accuracy_counts_masked_positions_only() -> None:
    import torch

    from lmctl.metrics import BatchMetrics
    from lmctl.objectives.collate import masked_positions

    logits = torch.zeros(1, 4, 5)
    logits[0, torch.arange(4), torch.tensor([1, 2, 3, 4])] = 1.0  # predicts 1, 2, 3, 4
    labels = torch.tensor([[-100, 2, 0, -100]])  # two masked positions: one right
    metrics = BatchMetrics(masked_positions)
    metrics.update(logits, labels)
    assert metrics.compute() == {"accuracy": 0.5}


def _results(run: Path) -> dict[str, Any]:
    results: dict[str, Any] = json.loads((run / "all_results.json").read_text())
    return results


@pytest.mark.slow
@pytest.mark.e2e
def test_mlm_from_scratch(
    tmp_path: Path, text_files: tuple[Path, Path], wordpiece_tokenizer: Path
) -> None:
    from transformers import AutoModelForMaskedLM, BertForMaskedLM

    train, valid = text_files
    out = tmp_path / "run"
    proc = lmctl(
        "train", "mlm", *TINY_BERT, "--tokenizer-name", wordpiece_tokenizer,
        "--train-file", train, "--validation-file", valid, "--max-seq-length", "64",
        "--max-steps", "20", "--learning-rate", "2e-3", "--output-dir", out, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert isinstance(AutoModelForMaskedLM.from_pretrained(out), BertForMaskedLM)
    results = _results(out)
    for key in ("train_loss", "eval_loss", "perplexity", "eval_accuracy", "train_samples"):
        assert key in results, key
    assert results["perplexity"] == pytest.approx(math.exp(results["eval_loss"]))
    assert 0 <= results["eval_accuracy"] <= 1
    assert results["eval_samples"] > 0 and results["train_samples"] > results["eval_samples"]
    assert "pipeline_tag: fill-mask" in (out / "README.md").read_text()
    assert "max sequence length: 64 tokens" in proc.stderr

    # Evaluating the saved model again, in another process, gives the very same numbers:
    # evaluation masks are drawn deterministically.
    again = tmp_path / "again"
    proc = lmctl(
        "train", "mlm", "--model", out, "--no-train", "--validation-file", valid,
        "--max-seq-length", "64", "--output-dir", again, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    evaluated = _results(again)
    assert evaluated["eval_loss"] == results["eval_loss"]
    assert evaluated["eval_accuracy"] == results["eval_accuracy"]


@pytest.mark.e2e
def test_mlm_line_by_line_blank_and_long_lines(tmp_path: Path, wordpiece_tokenizer: Path) -> None:
    lines = corpus_lines()[:120]
    text: list[str] = []
    for i, line in enumerate(lines):
        text.append(line)
        if i % 10 == 0:
            text += ["", "   "]
        if i % 40 == 0:
            text.append(" ".join(lines[i : i + 200]))  # thousands of tokens
    train = tmp_path / "lines.txt"
    train.write_text("\n".join(text) + "\n", encoding="utf-8")
    samples = sum(1 for line in text if line.strip())
    out = tmp_path / "run"
    proc = lmctl(
        "train", "mlm", *TINY_BERT, "--train-tokenizer", "300",
        "--train-file", train, "--line-by-line", "--max-seq-length", "32",
        "--validation-split-percentage", "10", "--max-steps", "10", "--output-dir", out,
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    results = _results(out)
    assert results["train_samples"] + results["eval_samples"] == samples
    assert "blank skipped" in proc.stderr
    tokenizer = _tokenizer(out)  # the WordPiece tokenizer trained on the data, saved
    assert tokenizer.tokenize("[CLS] [MASK] [SEP] [PAD]") == ["[CLS]", "[MASK]", "[SEP]", "[PAD]"]


@pytest.mark.e2e
def test_mlm_fine_tunes_pretrained_minilm_offline(
    tmp_path: Path, text_files: tuple[Path, Path]
) -> None:
    from transformers import AutoModelForMaskedLM

    train, valid = text_files
    out = tmp_path / "run"
    proc = lmctl(
        "train", "mlm", "--model", minilm_path(), "--train-file", train,
        "--validation-file", valid, "--max-seq-length", "64", "--max-train-samples", "200",
        "--max-eval-samples", "40", "--max-steps", "4", "--output-dir", out, cwd=tmp_path,
        env={"HF_HUB_OFFLINE": "1", "HF_ENDPOINT": "http://127.0.0.1:9"},
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    notes = [line for line in proc.stderr.splitlines() if "newly initialised" in line]
    assert len(notes) == 1 and "cls.predictions" in notes[0], proc.stderr
    model = AutoModelForMaskedLM.from_pretrained(out)
    assert model.config.hidden_size == 384
    assert {"eval_loss", "perplexity", "eval_accuracy"} <= set(_results(out))
    assert "base_model:" in (out / "README.md").read_text()
