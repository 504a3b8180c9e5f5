"""Dropout drawn from 16 random bits an element while a model trains on a CPU: the same
expectation as PyTorch's dropout, every dropout of the model (attention included) drawn
this way, seeded runs repeatable, and evaluation and saved models untouched."""

from __future__ import annotations

import copy
import json
import pickle
import statistics
from pathlib import Path
from typing import Any

import pytest
import torch
from torch.utils._python_dispatch import TorchDispatchMode
from transformers import (
    AutoModelForMultipleChoice,
    BertConfig,
    BertForMultipleChoice,
    GPT2Config,
    GPT2LMHeadModel,
)

from lmctl.fastpaths import dropout as fast
from lmctl.fastpaths.dropout import ATTENTION, draw_scale, dropout, train_with_fast_dropout


@pytest.fixture
def every_size(monkeypatch: pytest.MonkeyPatch) -> None:
    """These tiny models' tensors are drawn the fast way too (by default tensors under
    ``SMALLEST`` elements keep PyTorch's dropout)."""
    monkeypatch.setattr(fast, "SMALLEST", 1)


def _bert(drop: float = 0.1, attention: str = "sdpa") -> BertForMultipleChoice:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=97, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32, hidden_dropout_prob=drop,
        attention_probs_dropout_prob=drop, attn_implementation=attention,
    )  # fmt: skip
    return BertForMultipleChoice(config)


def _gpt2(drop: float = 0.1) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=97, n_layer=2, n_embd=16, n_head=2, n_positions=32, resid_pdrop=drop,
        embd_pdrop=drop, attn_pdrop=drop,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def _choices() -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 97, (3, 2, 12), generator=generator)
    mask = torch.ones_like(ids)
    mask[0, 1, 7:] = 0  # choices of different lengths, padded
    mask[2, 0, 4:] = 0
    return {"input_ids": ids, "attention_mask": mask, "labels": torch.tensor([0, 1, 1])}


def _text() -> dict[str, torch.Tensor]:
    ids = torch.randint(0, 97, (2, 10), generator=torch.Generator().manual_seed(2))
    return {"input_ids": ids, "labels": ids}


MODELS = [(_bert, _choices), (_gpt2, _text)]


class _Ops(TorchDispatchMode):
    """The names of the operators a block of code runs."""

    def __init__(self) -> None:
        super().__init__()
        self.names: set[str] = set()

    def __torch_dispatch__(self, func: Any, types: Any, args: Any = (), kwargs: Any = None) -> Any:
        self.names.add(func.overloadpacket.__name__)
        return func(*args, **(kwargs or {}))


@pytest.mark.parametrize("dtype", [torch.float32, torch.bfloat16])
@pytest.mark.parametrize("p", [0.1, 0.5])
def test_masks_drop_p_and_keep_the_expectation(p: float, dtype: torch.dtype) -> None:
    torch.manual_seed(0)
    scale = draw_scale(torch.empty(1000, 1000, dtype=dtype), p)
    assert scale.dtype == dtype and scale.shape == (1000, 1000)
    values = set(scale.unique().tolist())
    rounded = round(p * 65536) / 65536
    assert values == {0.0, float(torch.tensor(1 / (1 - rounded), dtype=dtype))}
    dropped = float((scale == 0).float().mean())
    assert abs(dropped - p) < 5 * (p * (1 - p) / 1e6) ** 0.5  # five standard errors
    if dtype == torch.float32:
        assert float(scale.double().mean()) == pytest.approx(
            1.0, abs=5 * (p / (1 - p) / 1e6) ** 0.5
        )


def test_seeded_draws_repeat_and_the_gradient_is_the_mask() -> None:
    inputs = torch.randn(64, 33, requires_grad=True)
    torch.manual_seed(3)
    first = dropout(inputs, 0.2)
    torch.manual_seed(3)
    again = dropout(inputs, 0.2)
    assert torch.equal(first, again)
    assert not torch.equal(first, dropout(inputs, 0.2))  # the generator moved on
    first.backward(torch.ones_like(first))
    assert inputs.grad is not None
    assert torch.equal(inputs.grad, torch.where(first != 0, 1 / (1 - 13107 / 65536), 0.0))


@pytest.mark.parametrize(("build", "batch"), MODELS)
@pytest.mark.usefixtures("every_size")
def test_every_dropout_of_a_training_forward_is_drawn_so(build: Any, batch: Any) -> None:
    stock, model = build(), build()
    assert train_with_fast_dropout(model)
    inputs = batch()
    for each in (stock, model):
        each.train()
        with _Ops() as ops:
            each(**inputs).loss.backward()
        each.ops = ops.names
    assert "bernoulli_" in stock.ops or "native_dropout" in stock.ops
    assert not {"bernoulli_", "bernoulli", "native_dropout"} & model.ops, model.ops
    assert "randint" in model.ops or "random_" in model.ops
    # calls without gradients, and evaluation, are the model's own
    model.eval()
    stock.eval()
    with torch.no_grad():
        got, expected = model(**inputs), stock(**inputs)
    assert torch.allclose(got.logits, expected.logits, rtol=1e-5, atol=1e-6)


@pytest.mark.parametrize(("build", "batch"), MODELS)
@pytest.mark.usefixtures("every_size")
def test_training_loss_has_the_stock_expectation(build: Any, batch: Any) -> None:
    """Over 300 draws, the mean training loss of each way is within four standard errors."""
    inputs = batch()
    losses: dict[str, list[float]] = {}
    for name in ("stock", "fast"):
        model = build(0.3)
        if name == "fast":
            assert train_with_fast_dropout(model)
        model.train()
        torch.manual_seed(4)
        with torch.enable_grad():
            losses[name] = [float(model(**inputs).loss.detach()) for _ in range(300)]
    error = (
        statistics.variance(losses["stock"]) / 300 + statistics.variance(losses["fast"]) / 300
    ) ** 0.5
    gap = abs(statistics.mean(losses["stock"]) - statistics.mean(losses["fast"]))
    assert gap < 4 * error, (gap, error)


@pytest.mark.usefixtures("every_size")
def test_seeded_training_repeats() -> None:
    inputs = _choices()
    losses = []
    for _ in range(2):
        model = _bert()
        assert train_with_fast_dropout(model)
        model.train()
        torch.manual_seed(5)
        loss = model(**inputs).loss
        loss.backward()
        losses.append(
            (loss.detach(), [p.grad.clone() for p in model.parameters() if p.grad is not None])
        )
    assert torch.equal(losses[0][0], losses[1][0])
    assert all(torch.equal(a, b) for a, b in zip(losses[0][1], losses[1][1], strict=True))


def test_a_model_without_dropout_is_left_alone() -> None:
    model = _bert(0.0)
    forward = model.forward
    assert not train_with_fast_dropout(model)
    assert model.forward == forward
    assert model.config._attn_implementation == "sdpa"


def test_nothing_of_it_is_saved(tmp_path: Path) -> None:
    model = _bert()
    assert train_with_fast_dropout(model)
    assert model.config._attn_implementation == ATTENTION
    model.save_pretrained(tmp_path)
    assert ATTENTION not in (tmp_path / "config.json").read_text()
    assert json.loads((tmp_path / "config.json").read_text())["attention_probs_dropout_prob"] == 0.1
    reloaded = AutoModelForMultipleChoice.from_pretrained(tmp_path)
    assert reloaded.config._attn_implementation == "sdpa"


def test_small_tensors_keep_pytorchs_dropout() -> None:
    """Under ``SMALLEST`` elements a few fixed operators cost more than the draw saves."""
    model = _bert()
    assert train_with_fast_dropout(model)
    model.train()
    inputs = _choices()
    with _Ops() as ops:
        model(**inputs).loss.backward()
    assert "bernoulli_" in ops.names or "native_dropout" in ops.names
    assert "randint" not in ops.names and "random_" not in ops.names


def test_the_model_still_pickles_and_copies() -> None:
    model = _bert()
    assert train_with_fast_dropout(model)
    for copied in (pickle.loads(pickle.dumps(model)), copy.deepcopy(model)):
        droppers = [m for m in copied.modules() if isinstance(m, torch.nn.Dropout)]
        assert droppers and all(type(m) is fast.CpuDropout for m in droppers)
