"""Tiled scoring of a causal LM's output layer gives the model's own loss and accuracy, and
is used only where it reproduces the model's logits."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from lmctl.metrics.lm_head import TiledHead, next_token_scores


def _model(vocab: int = 301) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=vocab, n_layer=1, n_embd=16, n_head=2, n_positions=32)
    return GPT2LMHeadModel(config).eval()


def _reference(model: GPT2LMHeadModel, ids: torch.Tensor, labels: torch.Tensor) -> tuple:
    with torch.no_grad():
        outputs = model(input_ids=ids, labels=labels)
    targets = labels[:, 1:]
    scored = targets != -100
    right = int(((outputs.logits[:, :-1].argmax(-1) == targets) & scored).sum())
    return float(outputs.loss), int(scored.sum()), right


@pytest.mark.parametrize(("rows", "entries"), [(1024, 1024), (7, 50), (1, 301), (5, 1)])
def test_tiles_of_any_size_give_the_models_loss_and_accuracy(rows: int, entries: int) -> None:
    model = _model()
    ids = torch.randint(0, 301, (3, 20))
    labels = ids.clone()
    labels[1, 5:9] = -100  # positions a collator leaves unscored
    labels[2, -3:] = -100
    loss, scored, right = _reference(model, ids, labels)
    with torch.inference_mode():
        hidden = model.transformer(input_ids=ids).last_hidden_state
        got = next_token_scores(
            hidden, model.lm_head.weight, None, labels, rows=rows, entries=entries
        )
    assert got.scored == scored
    assert got.right == right
    assert got.loss_sum / got.scored == pytest.approx(loss, rel=1e-5)


def test_a_bias_on_the_output_layer_is_added() -> None:
    torch.manual_seed(1)
    hidden = torch.randn(2, 6, 8)
    weight, bias = torch.randn(40, 8), torch.randn(40) * 5
    labels = torch.randint(0, 40, (2, 6))
    logits = hidden @ weight.T + bias
    expected = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, 40), labels[:, 1:].reshape(-1), reduction="sum"
    )
    got = next_token_scores(hidden, weight, bias, labels, rows=3, entries=7)
    assert got.loss_sum == pytest.approx(float(expected), rel=1e-5)
    assert got.right == int((logits[:, :-1].argmax(-1) == labels[:, 1:]).sum())


def test_ties_go_to_the_lowest_token_id_as_argmax_breaks_them() -> None:
    hidden = torch.ones(1, 2, 1)
    weight = torch.ones(10, 1)  # every logit equal: argmax is token 0
    labels = torch.tensor([[0, 0]])
    got = next_token_scores(hidden, weight, None, labels, rows=1, entries=3)
    assert got.right == 1
    assert got.loss_sum == pytest.approx(math.log(10), rel=1e-6)


def test_the_split_is_used_only_where_it_reproduces_the_logits() -> None:
    model = _model()
    ids = torch.randint(0, 301, (2, 12))
    sample = {"input_ids": ids, "labels": ids}
    with torch.inference_mode():
        assert TiledHead.of(model, sample) is not None
        # An architecture that changes its logits after the output layer (a scale, a cap)
        # keeps the plain forward.
        plain = model.forward

        def scaled(*args, **kwargs):  # type: ignore[no-untyped-def]
            outputs = plain(*args, **kwargs)
            outputs.logits = outputs.logits * 0.5
            return outputs

        model.forward = scaled  # type: ignore[method-assign]
        assert TiledHead.of(model, sample) is None
