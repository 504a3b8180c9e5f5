"""The one installer: every fast path that a run's decision turns on, put on a built model.
The objective names the training losses it can take (``Objective.training_losses``); the
allocator alone is set elsewhere, for the process, before the data and the model allocate.
"""

from __future__ import annotations

from collections.abc import Callable
from functools import partial
from typing import TYPE_CHECKING, Any

from lmctl import install_hint
from lmctl.fastpaths import losses
from lmctl.fastpaths.activations import fuse_tanh_gelu
from lmctl.fastpaths.dropout import train_with_fast_dropout
from lmctl.fastpaths.embedding import sparse_tied_embedding_gradient
from lmctl.fastpaths.padding import skip_padding
from lmctl.fastpaths.table import FastPaths, fused_adamw_available

if TYPE_CHECKING:
    from lmctl.config.values import FastPathName

LINEAR = "the model's logits are not its body's through a linear output layer"
#: How each path is put on a model, and why a model may not fit it.
ON_THE_MODEL: dict[FastPathName, tuple[Callable[[Any], object], str]] = {
    "fused-gelu": (fuse_tanh_gelu, "the model has no tanh GELU in Python"),
    "fused-linear-loss": (
        losses.fused_linear_training_loss,
        f"liger-kernel is not installed ({install_hint('liger')}), or {LINEAR}",
    ),
    "tiled-loss": (losses.tile_training_loss, LINEAR),
    "masked-head": (
        losses.masked_training_loss,
        "the model's logits are not its body's through one prediction head",
    ),
    "skip-padding": (
        skip_padding,
        "not an encoder whose padding only attention masks (BERT, RoBERTa, DistilBERT, ELECTRA)",
    ),
    "fast-dropout": (train_with_fast_dropout, "the model has no dropout"),
    "sparse-embedding": (
        sparse_tied_embedding_gradient,
        "no trained input embedding tied to the output layer",
    ),
}


def install_fast_paths(paths: FastPaths, objective: Any, model: Any, *, training: bool) -> None:
    """Install on ``model`` the fast paths that ``paths`` turns on and the model fits (those of
    training where the run trains; of the losses, the first of the objective's
    ``training_losses`` that fits), and decide fused AdamW once."""

    def install(name: FastPathName) -> bool:
        put_on, unfit = ON_THE_MODEL[name]
        return paths.apply(name, partial(put_on, model), unfit)

    install("fused-gelu")
    if not training:
        return
    taken: tuple[FastPathName, ...] = objective.training_losses
    for index, name in enumerate(taken):
        if install(name):
            for other in taken[index + 1 :]:
                paths.set_off(other, f"{name} computes the loss")
            break
    for path in ("skip-padding", "fast-dropout", "sparse-embedding"):
        install(path)
    device = paths.setting.device
    unfit = f"this torch has no fused AdamW for {device}"
    paths.apply("fused-adamw", partial(fused_adamw_available, device), unfit)
