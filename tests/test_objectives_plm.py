"""``lmctl train plm``: even lengths, permutation collators, and tiny XLNet runs."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from lmctl.config.loader import build_config
from lmctl.config.slices import take
from lmctl.distributed import native_bf16
from lmctl.errors import ConfigError
from lmctl.objectives.plm import OBJECTIVE, PlmConfig, PlmOptions
from tests.conftest import TINY_XLNET, corpus_lines, lmctl


def _config(train: Path, **values: Any) -> PlmConfig:
    return build_config(
        PlmConfig,
        cli_values={"model_type": "xlnet", "tokenizer_name": "unused", "train_file": str(train)}
        | values,
    )


@pytest.fixture
def train(tmp_path: Path) -> Path:
    path = tmp_path / "t.txt"
    path.write_text("x\n")
    return path


def _features(tokenizer_path: Path, count: int) -> list[dict[str, Any]]:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    encoded = tokenizer(corpus_lines()[30 : 30 + count], truncation=True, max_length=40)
    return [{key: encoded[key][i] for key in encoded} for i in range(count)]


def test_defaults_are_upstream(train: Path) -> None:
    config = _config(train)
    assert (config.max_seq_length, config.max_span_length) == (512, 5)
    assert config.plm_probability == pytest.approx(1 / 6)


def test_odd_length_and_other_architectures_rejected_before_work(train: Path) -> None:
    with pytest.raises(ConfigError, match=r"--max-seq-length 127: .* even") as info:
        _config(train, max_seq_length=127)
    assert "128" in (info.value.hint or "")
    with pytest.raises(ConfigError, match="--model-type bert: plm trains XLNet models only"):
        _config(train, model_type="bert")


@pytest.mark.parametrize("values,multiple", [({}, 2), ({"bf16": True}, 8)])
def test_batches_are_even_by_construction(
    train: Path, wordpiece_tokenizer: Path, values: dict[str, Any], multiple: int
) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(wordpiece_tokenizer)
    features = _features(wordpiece_tokenizer, 6)
    lengths = [len(f["input_ids"]) for f in features]
    odd = [f for f in features if len(f["input_ids"]) % 2]
    assert odd, "the test needs odd-length samples"
    collator = OBJECTIVE.collator(
        take(PlmOptions, _config(train, line_by_line=True, **values)),
        tokenizer,
        8 if _config(train, line_by_line=True, **values).mixed_precision(native_bf16) else None,
    )
    for batch_features in (odd[:1], features):
        batch = collator(batch_features)
        width = batch["input_ids"].shape[1]
        assert width % multiple == 0
        assert width - max(len(f["input_ids"]) for f in batch_features) < multiple
    batch = collator(features)
    width = batch["input_ids"].shape[1]
    assert batch["perm_mask"].shape == (6, width, width)
    assert batch["target_mapping"].shape == (6, width, width)
    for row, length in enumerate(lengths):
        assert batch["attention_mask"][row].sum() == length
        assert (batch["labels"][row, length:] == -100).all()
    assert (batch["labels"] != -100).any()


def test_a_batch_with_no_drawn_target_gets_one(train: Path, wordpiece_tokenizer: Path) -> None:
    """With no span drawn over a real token, the loss would be a mean over no target (NaN):
    one non-special token becomes the target, and no position may see it."""
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(wordpiece_tokenizer)
    # Spans this rare almost never land on two short lines.
    config = _config(train, line_by_line=True, plm_probability=1e-6)
    collator = OBJECTIVE.collator(take(PlmOptions, config), tokenizer, None)
    encoded = tokenizer(["the king", "long live the king"])
    features = [{key: encoded[key][i] for key in encoded} for i in range(2)]
    for _ in range(5):
        batch = collator([dict(f) for f in features])
        where = (batch["labels"] != -100).nonzero().tolist()
        assert len(where) == 1
        (row, column) = where[0]
        token = features[row]["input_ids"][column]
        assert batch["labels"][row, column] == token
        assert token not in tokenizer.all_special_ids
        assert batch["input_ids"][row, column] == token  # XLNet hides it by the mask only
        assert (batch["perm_mask"][row, :, column] == 1).all()
        assert batch["target_mapping"][row, column, column] == 1


def test_eval_permutations_are_deterministic(train: Path, wordpiece_tokenizer: Path) -> None:
    import torch
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(wordpiece_tokenizer)
    config = _config(train, line_by_line=True)
    features = _features(wordpiece_tokenizer, 8)
    first = OBJECTIVE.eval_collator(take(PlmOptions, config), tokenizer, None, config.seed)(
        features
    )
    torch.rand(10)
    second = OBJECTIVE.eval_collator(take(PlmOptions, config), tokenizer, None, config.seed)(
        features
    )
    for key in ("input_ids", "perm_mask", "labels"):
        assert torch.equal(first[key], second[key]), key
    training = OBJECTIVE.collator(take(PlmOptions, config), tokenizer, None)
    assert not torch.equal(training(features)["perm_mask"], training(features)["perm_mask"])


def _results(run: Path) -> dict[str, Any]:
    results: dict[str, Any] = json.loads((run / "all_results.json").read_text())
    return results


@pytest.mark.slow
@pytest.mark.e2e
def test_plm_from_scratch_with_its_own_tokenizer(
    tmp_path: Path, text_files: tuple[Path, Path]
) -> None:
    from transformers import AutoModelForCausalLM, AutoTokenizer, XLNetLMHeadModel

    train, valid = text_files
    out = tmp_path / "run"
    proc = lmctl(
        "train", "plm", *TINY_XLNET, "--train-tokenizer", "400", "--train-file", train,
        "--validation-file", valid, "--max-seq-length", "64", "--max-steps", "12",
        "--learning-rate", "2e-3", "--output-dir", out, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    model = AutoModelForCausalLM.from_pretrained(out)
    assert isinstance(model, XLNetLMHeadModel)
    assert model.config.d_model == 32 and model.config.d_head == 16
    tokenizer = AutoTokenizer.from_pretrained(out)
    assert tokenizer.mask_token is not None and tokenizer.pad_token is not None
    results = _results(out)
    for key in ("train_loss", "eval_loss", "perplexity", "train_samples", "eval_samples"):
        assert key in results, key
    assert results["perplexity"] == pytest.approx(math.exp(results["eval_loss"]))
    assert results["eval_loss"] < math.log(len(tokenizer))  # learnt something beyond uniform
    card = (out / "README.md").read_text()
    assert "pipeline_tag: text-generation" in card and "permutation-language-modeling" in card

    again = tmp_path / "again"
    proc = lmctl(
        "train", "plm", "--model", out, "--no-train", "--validation-file", valid,
        "--max-seq-length", "64", "--output-dir", again, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert _results(again)["eval_loss"] == results["eval_loss"]  # deterministic permutations


@pytest.mark.e2e
def test_plm_line_by_line_pads_odd_batches(tmp_path: Path, wordpiece_tokenizer: Path) -> None:
    train = tmp_path / "lines.txt"
    train.write_text("\n".join(corpus_lines()[:200]) + "\n\n\n", encoding="utf-8")
    out = tmp_path / "run"
    proc = lmctl(
        "train", "plm", *TINY_XLNET, "--tokenizer-name", wordpiece_tokenizer,
        "--train-file", train, "--line-by-line", "--max-seq-length", "48",
        "--per-device-train-batch-size", "3", "--max-steps", "8", "--output-dir", out,
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert {"eval_loss", "perplexity"} <= set(_results(out))
