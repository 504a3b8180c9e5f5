"""The gradient of an input embedding tied to the output layer, taken sparse: the weight gets
the same dense gradient, training takes the same steps, and it is used only where the weight
is tied and trained."""

from __future__ import annotations

import copy

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

from lmctl.fastpaths.embedding import sparse_tied_embedding_gradient
from lmctl.fastpaths.losses import masked_training_loss, tile_training_loss


def _gpt2(**extra: object) -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=97, n_layer=2, n_embd=16, n_head=2, n_positions=32, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, **extra,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


def _bert() -> BertForMaskedLM:
    torch.manual_seed(0)
    config = BertConfig(
        vocab_size=97, hidden_size=16, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=32, max_position_embeddings=32, hidden_dropout_prob=0.0,
        attention_probs_dropout_prob=0.0,
    )  # fmt: skip
    return BertForMaskedLM(config)


def _batch(masked: bool = False) -> dict[str, torch.Tensor]:
    generator = torch.Generator().manual_seed(1)
    ids = torch.randint(1, 97, (3, 12), generator=generator)
    labels = ids.clone()
    if masked:
        labels[:, ::3] = -100
    return {"input_ids": ids, "labels": labels}


def _gradients(model: torch.nn.Module, batch: dict[str, torch.Tensor]) -> dict[str, torch.Tensor]:
    model.train()
    model.zero_grad(set_to_none=True)
    model(**batch).loss.backward()
    return {name: p.grad for name, p in model.named_parameters() if p.grad is not None}


@pytest.mark.parametrize("tiled", [False, True], ids=["own-forward", "tiled-loss"])
def test_a_tied_embeddings_gradient_is_the_same_dense_gradient(tiled: bool) -> None:
    dense = _gpt2()
    sparse = copy.deepcopy(dense)
    if tiled:
        assert tile_training_loss(dense) and tile_training_loss(sparse)
    assert sparse_tied_embedding_gradient(sparse)
    assert sparse.get_input_embeddings().sparse
    batch = _batch()
    expected, got = _gradients(dense, batch), _gradients(sparse, batch)
    assert expected.keys() == got.keys()
    for name, gradient in got.items():
        assert gradient.layout == torch.strided, name
        torch.testing.assert_close(gradient, expected[name], rtol=1e-5, atol=1e-7, msg=name)
    # the embedding's rows of the batch's tokens have both gradients in them
    tokens = batch["input_ids"].unique()
    weight = "transformer.wte.weight"
    assert not torch.equal(got[weight][tokens], torch.zeros_like(got[weight][tokens]))


def test_a_masked_lms_tied_embedding_gets_the_same_gradient() -> None:
    dense = _bert()
    sparse = copy.deepcopy(dense)
    assert masked_training_loss(dense) and masked_training_loss(sparse)
    assert sparse_tied_embedding_gradient(sparse)
    batch = _batch(masked=True)
    expected, got = _gradients(dense, batch), _gradients(sparse, batch)
    for name, gradient in got.items():
        assert gradient.layout == torch.strided, name
        torch.testing.assert_close(gradient, expected[name], rtol=1e-5, atol=1e-7, msg=name)


def test_training_takes_the_same_steps() -> None:
    """AdamW over a few steps with gradient clipping: the same losses and weights either way.
    (The key projection's bias has a zero gradient, softmax being blind to a constant added
    to a row's scores: AdamW turns its float rounding, about 1e-9 either way, into steps of
    up to 1e-5 at this learning rate, hence the weights' tolerance.)"""
    dense = _gpt2()
    sparse = copy.deepcopy(dense)
    assert sparse_tied_embedding_gradient(sparse)
    losses, weights = [], []
    for model in (dense, sparse):
        assert tile_training_loss(model)
        optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
        seen = []
        for step in range(4):
            batch = _batch()
            batch["input_ids"] = (batch["input_ids"] + step) % 97
            batch["labels"] = batch["input_ids"]
            model.zero_grad(set_to_none=True)
            loss = model(**batch).loss
            loss.backward()
            seen.append(loss.item())
            torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
            optimizer.step()
        losses.append(seen)
        weights.append(model.state_dict())
    assert losses[1] == pytest.approx(losses[0], rel=1e-6)
    for name, value in weights[1].items():
        torch.testing.assert_close(value, weights[0][name], rtol=1e-5, atol=1e-4, msg=name)


def test_used_only_where_the_weight_is_tied_and_trained() -> None:
    untied = _gpt2(tie_word_embeddings=False)
    assert not sparse_tied_embedding_gradient(untied)
    assert not untied.get_input_embeddings().sparse  # it would keep a sparse gradient

    frozen = _gpt2()
    frozen.get_input_embeddings().weight.requires_grad_(False)
    assert not sparse_tied_embedding_gradient(frozen)
    assert not frozen.get_input_embeddings().sparse

    assert not sparse_tied_embedding_gradient(torch.nn.Linear(4, 4))


def test_nothing_saved_changes() -> None:
    model = _gpt2()
    keys = set(model.state_dict())
    assert sparse_tied_embedding_gradient(model)
    assert set(model.state_dict()) == keys
    assert "sparse" not in model.config.to_dict()
