"""Linear layers that skip the padding positions while an encoder trains: the loss and
gradients are the model's own, the same dropout masks are drawn, the padding really is
skipped, and evaluation, other models and the saved weights are untouched."""

from __future__ import annotations

import copy
import json
from pathlib import Path
from typing import Any

import pytest
import torch
import transformers

from lmctl.fastpaths.padding import LEAST_PADDING, PaddingFreeLinear, skip_padding

from .conftest import corpus_lines, lmctl, slow_except

SMALL = {"hidden_size": 16, "num_attention_heads": 2, "intermediate_size": 32}


def _model(kind: str) -> Any:
    torch.manual_seed(0)
    if kind == "distilbert":
        config: Any = transformers.DistilBertConfig(
            vocab_size=97, dim=16, n_layers=2, n_heads=2, hidden_dim=32, max_position_embeddings=32
        )
        return transformers.DistilBertForMaskedLM(config)
    if kind == "electra":
        config = transformers.ElectraConfig(
            vocab_size=97, embedding_size=16, num_hidden_layers=2, max_position_embeddings=32,
            **SMALL,
        )  # fmt: skip
        return transformers.ElectraForMaskedLM(config)
    if kind == "xlm-roberta":
        config = transformers.XLMRobertaConfig(
            vocab_size=97, num_hidden_layers=2, max_position_embeddings=40, pad_token_id=1, **SMALL
        )
        return transformers.XLMRobertaForMaskedLM(config)
    if kind == "roberta":
        config = transformers.RobertaConfig(
            vocab_size=97, num_hidden_layers=2, max_position_embeddings=40, pad_token_id=1, **SMALL
        )
        return transformers.RobertaForMaskedLM(config)
    config = transformers.BertConfig(
        vocab_size=97, num_hidden_layers=2, max_position_embeddings=32, **SMALL
    )
    if kind == "bert-choice":
        return transformers.BertForMultipleChoice(config)
    return transformers.BertForMaskedLM(config)


def _batch(kind: str) -> dict[str, torch.Tensor]:
    """A padded batch with about half its positions padding; masked-LM labels at a few real
    positions (-100 elsewhere), or a choice per example."""
    generator = torch.Generator().manual_seed(1)
    shape = (3, 2, 20) if kind == "bert-choice" else (4, 20)
    ids = torch.randint(3, 97, shape, generator=generator)
    lengths = torch.tensor([20, 6, 11, 3, 17, 9][: ids.numel() // 20])  # the first sets it
    mask = (torch.arange(20)[None] < lengths[:, None]).long().reshape(shape)
    ids = ids.masked_fill(mask == 0, 1 if "roberta" in kind else 0)
    if kind == "bert-choice":
        return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 1])}
    scored = (torch.rand(shape, generator=generator) < 0.3) & (mask == 1)
    return {"input_ids": ids, "attention_mask": mask, "labels": ids.where(scored, -100)}


def _step(model: Any, batch: dict[str, torch.Tensor]) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.train()
    model.zero_grad()
    torch.manual_seed(2)  # the dropout masks; both models must draw the same
    loss = model(**batch).loss
    loss.backward()
    return loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None]


def _padding_rows_of_first_linear(model: Any, batch: dict[str, torch.Tensor]) -> torch.Tensor:
    """The first linear layer's output at the batch's padding positions, in a training step."""
    first = next(m for m in model.modules() if isinstance(m, torch.nn.Linear))
    seen: list[torch.Tensor] = []
    handle = first.register_forward_hook(lambda module, args, out: seen.append(out.detach()))
    try:
        _step(model, batch)
    finally:
        handle.remove()
    padding = batch["attention_mask"].reshape(-1) == 0
    return seen[0].reshape(padding.numel(), -1)[padding]


@pytest.mark.parametrize(
    "kind", ["bert", "bert-choice", "roberta", "xlm-roberta", "distilbert", "electra"]
)
def test_the_loss_gradients_and_dropout_are_the_models_own(kind: str) -> None:
    stock = _model(kind)
    model = copy.deepcopy(stock)
    assert skip_padding(model) == sum(type(m) is torch.nn.Linear for m in stock.modules())
    batch = _batch(kind)
    loss, grads = _step(model, batch)
    stock_loss, stock_grads = _step(stock, batch)
    torch.testing.assert_close(loss, stock_loss, rtol=1e-6, atol=1e-6)
    for got, expected in zip(grads, stock_grads, strict=True):
        torch.testing.assert_close(got, expected, rtol=1e-5, atol=1e-6)
    # The same number of random draws: the generator stands where the stock model left it.
    _step(model, batch)
    after = torch.rand(4)
    _step(stock, batch)
    assert torch.equal(after, torch.rand(4))
    # The padding is skipped: zeros there, where the stock model computes a value.
    assert _padding_rows_of_first_linear(model, batch).abs().sum() == 0
    assert _padding_rows_of_first_linear(stock, batch).abs().sum() > 0


def test_evaluation_runs_the_models_own_forward() -> None:
    stock = _model("bert")
    model = copy.deepcopy(stock)
    skip_padding(model)
    batch = _batch("bert")
    stock.eval()
    model.eval()
    with torch.no_grad():
        assert torch.equal(model(**batch).logits, stock(**batch).logits)


def test_a_loss_on_padding_positions_or_little_padding_computes_every_position() -> None:
    model = _model("bert")
    skip_padding(model)
    batch = _batch("bert")
    # A label at a padding position: that position counts, so it is computed.
    labelled = dict(batch, labels=batch["labels"].where(batch["attention_mask"] == 1, 5))
    assert _padding_rows_of_first_linear(model, labelled).abs().sum() > 0
    # Padding under LEAST_PADDING of the positions: not worth skipping.
    mask = torch.ones_like(batch["attention_mask"])
    mask[1, -int(LEAST_PADDING * mask.numel()) + 1 :] = 0
    few = dict(batch, attention_mask=mask, labels=batch["labels"].where(mask == 1, -100))
    assert _padding_rows_of_first_linear(model, few).abs().sum() > 0
    # Padded on the left: the first position, which a pooler reads, may be padding.
    left = dict(batch, attention_mask=batch["attention_mask"].flip(-1))
    left["labels"] = batch["labels"].where(left["attention_mask"] == 1, -100)
    assert _padding_rows_of_first_linear(model, left).abs().sum() > 0
    # A batch without a mask.
    bare = {"input_ids": batch["input_ids"], "labels": batch["labels"]}
    model.train()
    assert model(**bare).loss.isfinite()


def test_other_models_are_left_as_they_are_and_saved_weights_are_the_models_own(
    tmp_path: Path,
) -> None:
    gpt2 = transformers.GPT2LMHeadModel(
        transformers.GPT2Config(vocab_size=97, n_layer=1, n_embd=16, n_head=2, n_positions=32)
    )
    assert skip_padding(gpt2) == 0
    model = _model("bert")
    keys = set(model.state_dict())
    skip_padding(model)
    assert any(type(m) is PaddingFreeLinear for m in model.modules())
    assert set(model.state_dict()) == keys
    model.save_pretrained(tmp_path)
    reloaded = transformers.BertForMaskedLM.from_pretrained(tmp_path)
    assert not any(type(m) is PaddingFreeLinear for m in reloaded.modules())
    for name, value in reloaded.state_dict().items():
        assert torch.equal(value, model.state_dict()[name]), name


@pytest.mark.parametrize("engine", slow_except(["trainer", "accelerate"], "trainer"))
def test_mlm_line_by_line_trains_as_without_it(
    tmp_path: Path, wordpiece_tokenizer: Path, engine: str
) -> None:
    """Through ``lmctl train mlm --line-by-line`` on lines of mixed length: the default
    (the path on) and every other path without it reach the same eval losses."""
    torch.manual_seed(0)
    tokenizer = transformers.AutoTokenizer.from_pretrained(wordpiece_tokenizer)
    bert = transformers.BertConfig(
        vocab_size=len(tokenizer), hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64, max_position_embeddings=64, pad_token_id=tokenizer.pad_token_id,
    )  # fmt: skip
    model_dir = tmp_path / "model"
    transformers.BertForMaskedLM(bert).save_pretrained(model_dir)
    tokenizer.save_pretrained(model_dir)
    words = " ".join(corpus_lines()).split()
    lines = [f"{n} " + " ".join(words[n * 7 : n * 7 + 2 + (n * 37) % 40]) for n in range(160)]
    train = tmp_path / "train.txt"
    train.write_text("\n".join(lines[:128]) + "\n")
    valid = tmp_path / "valid.txt"
    valid.write_text("\n".join(lines[128:]) + "\n")
    others = "masked-head,fused-gelu,fused-adamw,allocator"
    losses = []
    for paths in ("auto", others):
        out = tmp_path / paths.replace(",", "-")
        proc = lmctl(
            "train", "mlm", "--model", model_dir, "--train-file", train, "--validation-file",
            valid, "--line-by-line", "--max-seq-length", 48, "--max-steps", 8,
            "--per-device-train-batch-size", 8, "--eval-strategy", "steps", "--eval-steps", 4,
            "--learning-rate", "2e-3", "--engine", engine, "--fast-paths", paths,
            "--save-strategy", "no", "-o", out,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr[-3000:]
        line = next(x for x in proc.stderr.splitlines() if "fast paths (" in x)
        assert ("skip-padding" in line.split("; off:")[0]) is (paths == "auto"), line
        records = [json.loads(x) for x in (out / "metrics.jsonl").read_text().splitlines()]
        losses.append([r["eval_loss"] for r in records if "eval_loss" in r])
    assert len(losses[0]) >= 2
    assert losses[0] == pytest.approx(losses[1], rel=1e-5), losses
