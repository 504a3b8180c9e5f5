"""Tiled scoring of a causal LM's output layer gives the model's own loss and accuracy (and
in training its gradients), and is used only where it reproduces the model's logits."""

from __future__ import annotations

import math

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel

from lmctl.fastpaths.losses import masked_training_loss, next_token_loss, tile_training_loss
from lmctl.metrics.lm_head import TiledHead, next_token_scores, prediction_head


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


def _gradients(model: GPT2LMHeadModel, inputs: dict, autocast: bool = False) -> tuple:
    model.zero_grad()
    torch.manual_seed(3)  # the same dropout draws on both sides
    with torch.autocast("cpu", dtype=torch.bfloat16, enabled=autocast):
        loss = model(**inputs).loss
    loss.backward()
    return float(loss.detach()), {name: p.grad.clone() for name, p in model.named_parameters()}


@pytest.mark.parametrize("num_items", [None, 50])
def test_the_tiled_training_loss_has_the_models_loss_and_gradients(num_items: int | None) -> None:
    import copy

    own = _model().train()
    tiled = copy.deepcopy(own)
    assert tile_training_loss(tiled)
    ids = torch.randint(0, 301, (3, 20))
    labels = ids.clone()
    labels[1, 5:9] = -100
    inputs = {"input_ids": ids, "labels": labels}
    if num_items is not None:  # what the Trainer hands over with gradient accumulation
        inputs["num_items_in_batch"] = torch.tensor(num_items)
    loss, expected = _gradients(own, inputs)
    tiled_loss, got = _gradients(tiled, inputs)
    assert tiled_loss == pytest.approx(loss, rel=1e-6)
    for name, gradient in expected.items():  # the tied embedding/output weight included
        assert torch.allclose(got[name], gradient, rtol=1e-4, atol=1e-6), name
    # Evaluation keeps the model's own forward, logits included.
    with torch.no_grad():
        assert tiled(input_ids=ids, labels=labels).logits is not None


def test_the_tiled_training_loss_under_bf16_autocast_stays_close() -> None:
    import copy

    own = _model().train()
    tiled = copy.deepcopy(own)
    assert tile_training_loss(tiled)
    ids = torch.randint(0, 301, (4, 24))
    inputs = {"input_ids": ids, "labels": ids}
    loss, expected = _gradients(own, inputs, autocast=True)
    tiled_loss, got = _gradients(tiled, inputs, autocast=True)
    assert tiled_loss == pytest.approx(loss, rel=1e-2)
    for name, gradient in expected.items():
        scale = float(gradient.abs().max()) or 1.0
        assert float((got[name] - gradient).abs().max()) <= 0.05 * scale, name


@pytest.mark.parametrize(("rows", "entries"), [(5, 7), (3, 40), (256, 1024), (4, 13)])
@pytest.mark.parametrize("spread", [1.0, 300.0])
def test_the_tiled_training_loss_with_a_bias_matches_cross_entropy(
    rows: int, entries: int, spread: float
) -> None:
    """Tiles of rows and spans of the vocabulary in any cut (a last span shorter than the
    others, a tile of unscored rows, a target repeated), and logits far apart (spans whose
    maxima differ by hundreds), give cross-entropy's loss and gradients."""
    torch.manual_seed(2)
    hidden = torch.randn(2, 9, 8, requires_grad=True)
    weight = (torch.randn(40, 8) * spread).requires_grad_()
    bias = torch.randn(40, requires_grad=True)
    labels = torch.randint(0, 40, (2, 9))
    labels[0, 3] = -100
    labels[1, 1:5] = -100
    labels[1, 6:] = 11
    logits = hidden @ weight.T + bias
    expected = torch.nn.functional.cross_entropy(
        logits[:, :-1].reshape(-1, 40), labels[:, 1:].reshape(-1), ignore_index=-100
    )
    wanted = torch.autograd.grad(expected, (hidden, weight, bias))
    got_loss = next_token_loss(hidden, weight, bias, labels, rows=rows, entries=entries)
    got = torch.autograd.grad(got_loss, (hidden, weight, bias))
    assert float(got_loss.detach()) == pytest.approx(float(expected.detach()), rel=1e-5)
    for a, b in zip(got, wanted, strict=True):
        scale = float(b.abs().max())
        assert float((a - b).abs().max()) <= 1e-5 * scale, (a - b).abs().max()


def test_the_tiled_training_loss_scales_its_gradients_and_hands_them_on_once() -> None:
    """The backward pass scales the gradients computed in the forward pass in place: a loss
    multiplied by 3 has 3 times the gradients; a second backward through the same graph
    (``retain_graph``) is refused with a clear error instead of scaling them twice."""
    torch.manual_seed(3)
    hidden = torch.randn(2, 6, 8, requires_grad=True)
    weight = torch.randn(30, 8, requires_grad=True)
    labels = torch.randint(0, 30, (2, 6))
    once = torch.autograd.grad(next_token_loss(hidden, weight, None, labels), (hidden, weight))
    loss = next_token_loss(hidden, weight, None, labels) * 3
    thrice = torch.autograd.grad(loss, (hidden, weight), retain_graph=True)
    for a, b in zip(thrice, once, strict=True):
        torch.testing.assert_close(a, 3 * b)
    with pytest.raises(RuntimeError, match="a second time"):
        torch.autograd.grad(loss, (hidden, weight))


def test_a_model_whose_split_changes_the_logits_keeps_its_own_training_forward() -> None:
    model = _model()
    plain = model.forward

    def capped(*args, **kwargs):  # type: ignore[no-untyped-def]
        outputs = plain(*args, **kwargs)
        if outputs.logits is not None:
            outputs.logits = torch.tanh(outputs.logits)
        return outputs

    model.forward = capped  # type: ignore[method-assign]
    assert not tile_training_loss(model)
    assert model.forward is capped


def test_a_model_that_adds_to_its_loss_keeps_its_own_training_forward() -> None:
    """A term added to the loss (a mixture of experts' balancing loss, say) would be lost by
    a loss taken from the output layer alone."""
    model = _model()
    plain = model.forward

    def balanced(*args, **kwargs):  # type: ignore[no-untyped-def]
        outputs = plain(*args, **kwargs)
        if outputs.loss is not None:
            outputs.loss = outputs.loss + 0.01
        return outputs

    model.forward = balanced  # type: ignore[method-assign]
    assert not tile_training_loss(model)
    assert model.forward is balanced


def _masked_lm(kind: str) -> torch.nn.Module:
    import transformers

    torch.manual_seed(0)
    sizes = {
        "vocab_size": 301,
        "num_hidden_layers": 1,
        "hidden_size": 16,
        "num_attention_heads": 2,
        "intermediate_size": 32,
        "max_position_embeddings": 40,
    }
    if kind == "bert":
        return transformers.BertForMaskedLM(transformers.BertConfig(**sizes)).train()
    if kind == "roberta":
        config = transformers.RobertaConfig(**sizes, pad_token_id=1)
        return transformers.RobertaForMaskedLM(config).train()
    config = transformers.DistilBertConfig(
        vocab_size=301, n_layers=1, dim=16, n_heads=2, hidden_dim=32, max_position_embeddings=40
    )
    return transformers.DistilBertForMaskedLM(config).train()


@pytest.mark.parametrize("kind", ["bert", "roberta"])
@pytest.mark.parametrize("num_items", [None, 9])
def test_the_masked_head_on_masked_positions_has_the_models_loss_and_gradients(
    kind: str, num_items: int | None
) -> None:
    import copy

    own = _masked_lm(kind)
    masked = copy.deepcopy(own)
    assert masked_training_loss(masked)
    ids = torch.randint(5, 301, (3, 20))
    labels = torch.full_like(ids, -100)
    chosen = torch.rand(ids.shape) < 0.2
    chosen[0, 3] = True
    labels[chosen] = ids[chosen]
    inputs = {"input_ids": ids, "attention_mask": torch.ones_like(ids), "labels": labels}
    if num_items is not None:
        inputs["num_items_in_batch"] = torch.tensor(num_items)
        own_inputs = {k: v for k, v in inputs.items() if k != "num_items_in_batch"}
        loss, expected = _gradients(own, own_inputs)
        # The model's own loss is a mean; with an item count it is the sum over that count.
        loss = loss * int(chosen.sum()) / num_items
        expected = {k: v * int(chosen.sum()) / num_items for k, v in expected.items()}
    else:
        loss, expected = _gradients(own, inputs)
    masked_loss, got = _gradients(masked, inputs)
    assert masked_loss == pytest.approx(loss, rel=1e-5)
    for name, gradient in expected.items():
        assert torch.allclose(got[name], gradient, rtol=1e-4, atol=1e-6), name
    with torch.no_grad():  # evaluation: the model's own forward, with every position's logits
        assert masked(input_ids=ids, labels=labels).logits.shape == (3, 20, 301)


def test_a_masked_lm_built_otherwise_keeps_its_own_forward() -> None:
    model = _masked_lm("distilbert")  # its head is four separate modules
    assert prediction_head(model) is None
    plain = model.forward
    assert not masked_training_loss(model)
    assert model.forward == plain


@pytest.mark.parametrize("rows", [1024, 3])
def test_a_masked_lm_is_scored_at_its_labelled_positions_only(rows: int) -> None:
    from lmctl.metrics.lm_head import labelled_scores

    model = _masked_lm("bert").eval()
    ids = torch.randint(5, 301, (3, 20))
    labels = torch.full_like(ids, -100)
    chosen = torch.rand(ids.shape) < 0.3
    labels[chosen] = ids[chosen]
    inputs = {"input_ids": ids, "labels": labels}
    with torch.inference_mode():
        outputs = model(**inputs)
        split = TiledHead.of(model, inputs, prediction_head(model), shifted=False)
        assert split is not None
        got = split.scores(inputs)
        again = labelled_scores(split.hidden(inputs), split.head, labels, rows=rows)
    scored = labels != -100
    assert got.scored == again.scored == int(scored.sum())
    assert got.right == again.right == int((outputs.logits.argmax(-1)[scored] == ids[scored]).sum())
    assert got.loss_sum / got.scored == pytest.approx(float(outputs.loss), rel=1e-5)
    assert again.loss_sum == pytest.approx(got.loss_sum, rel=1e-6)
