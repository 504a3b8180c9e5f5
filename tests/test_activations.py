"""The tanh approximation of GELU as one fused kernel: the same outputs, loss and gradients as
the model's Python activation, and nothing of it saved (that `lmctl train clm` runs with it:
tests/test_train_clm.py)."""

from __future__ import annotations

import copy
import json
from pathlib import Path

import pytest
import torch
from transformers import GPT2Config, GPT2LMHeadModel
from transformers.activations import FastGELUActivation, GELUTanh, NewGELUActivation

from lmctl.fastpaths.activations import fuse_tanh_gelu


def _gpt2(activation: str = "gelu_new") -> GPT2LMHeadModel:
    torch.manual_seed(0)
    config = GPT2Config(
        vocab_size=97, n_layer=2, n_embd=32, n_head=2, n_positions=32, resid_pdrop=0.0,
        embd_pdrop=0.0, attn_pdrop=0.0, activation_function=activation,
    )  # fmt: skip
    return GPT2LMHeadModel(config)


@pytest.mark.parametrize("kind", [NewGELUActivation, FastGELUActivation])
def test_the_fused_kernel_computes_the_python_formula(kind: type) -> None:
    x = torch.linspace(-12, 12, 4001, dtype=torch.float64).to(torch.float32)
    x.requires_grad_(True)
    own = kind()(x)
    (own_grad,) = torch.autograd.grad(own.sum(), x)
    fused = GELUTanh()(x)
    (fused_grad,) = torch.autograd.grad(fused.sum(), x)
    torch.testing.assert_close(fused, own, rtol=1e-5, atol=1e-6)
    torch.testing.assert_close(fused_grad, own_grad, rtol=1e-5, atol=1e-5)


@pytest.mark.parametrize("activation", ["gelu_new", "gelu_fast"])
def test_training_loss_and_gradients_stay_the_same(activation: str) -> None:
    own = _gpt2(activation)
    fused = copy.deepcopy(own)
    assert fuse_tanh_gelu(fused) == 2
    assert fuse_tanh_gelu(fused) == 0, "a second call finds nothing left to replace"
    assert all(type(block.mlp.act) is GELUTanh for block in fused.transformer.h)
    ids = torch.randint(0, 97, (4, 24), generator=torch.Generator().manual_seed(1))
    losses = []
    for model in (own, fused):
        model.train()
        loss = model(input_ids=ids, labels=ids).loss
        loss.backward()
        losses.append(loss)
    torch.testing.assert_close(losses[1], losses[0], rtol=1e-6, atol=1e-6)
    for (name, a), (_, b) in zip(own.named_parameters(), fused.named_parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-4, atol=1e-6, msg=name)


def test_other_activations_are_left_alone() -> None:
    model = _gpt2("relu")
    before = [type(m) for m in model.modules()]
    assert fuse_tanh_gelu(model) == 0
    assert [type(m) for m in model.modules()] == before


def test_nothing_of_it_is_saved(tmp_path: Path) -> None:
    own = _gpt2()
    fused = copy.deepcopy(own)
    fuse_tanh_gelu(fused)
    own.save_pretrained(tmp_path / "own")
    fused.save_pretrained(tmp_path / "fused")
    assert json.loads((tmp_path / "fused" / "config.json").read_text()) == json.loads(
        (tmp_path / "own" / "config.json").read_text()
    )
    reloaded = GPT2LMHeadModel.from_pretrained(tmp_path / "fused")
    assert type(reloaded.transformer.h[0].mlp.act) is NewGELUActivation
