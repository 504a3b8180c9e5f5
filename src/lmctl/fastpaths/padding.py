"""Linear layers that skip the padding positions of a padded batch while an encoder trains.

Line by line (mlm) and multiple choice, every batch is padded to its longest sequence, and the
model computes every layer on the padding too: with lines of mixed length (2 to 120 words),
about 45% of a batch's positions are padding. In the encoders listed in
:data:`MODEL_TYPES`, a padding position reaches no other position (attention masks it out as
a key) and no loss (its label is -100; multiple choice scores the first position), so what the
model computes there is never used. Here each ``nn.Linear`` of the model computes the rows of
the real positions only and leaves zeros at the padding: the linear layers are most of a
step's arithmetic, and a BERT 4 x 256 step on lines of mixed length takes about a sixth less
time on two CPU cores. Everything else keeps its padded shape, dropout above all: its masks
are drawn for the whole padded tensor, so a seeded run draws exactly the random numbers
PyTorch's own forward draws, and the loss and gradients are the model's own (equal up to the
rounding of a matrix product over fewer rows).

It applies while the model trains (evaluation runs the model's own forward), to a batch with
an ``attention_mask`` and at least :data:`LEAST_PADDING` of its positions padding, and only
where every padding position's label, if the batch has labels per position, is -100 and every
sequence starts with a real position (a pooler or a multiple-choice head reads the first). The
modules keep their weights and the saved model is the model's own.
"""

from __future__ import annotations

from typing import Any

import torch
import torch.nn.functional as F

#: Encoders in which a padding position influences nothing but itself (attention masks it as
#: a key, and every other layer works position by position).
MODEL_TYPES = frozenset({"bert", "roberta", "xlm-roberta", "camembert", "distilbert", "electra"})
#: The least share of padding positions worth skipping: gathering the real rows and putting
#: them back costs a few operators per layer, and with a tenth of a batch padding that took
#: as long as the rows saved (BERT 4 x 256 and 4 x 384, 8 x 64 and 8 x 128 positions, two
#: CPU cores); with 30% it saved 3-14% of a step, with 45% 17-22%.
LEAST_PADDING = 0.15
#: Label of a position no loss counts (PyTorch's cross-entropy ``ignore_index``).
IGNORED = -100


class RealRows:
    """The flat indices of the non-padding positions of the batch being trained on (None:
    compute every position), and how many positions the batch has."""

    def __init__(self) -> None:
        self.index: torch.Tensor | None = None
        self.rows = 0

    def set(self, module: Any, kwargs: dict[str, Any]) -> None:
        self.index = None
        mask = kwargs.get("attention_mask")
        if not module.training or not torch.is_grad_enabled() or mask is None:
            return
        if not isinstance(mask, torch.Tensor) or mask.dim() < 2 or mask.is_floating_point():
            return
        real = mask.reshape(-1) != 0
        if not bool(real.view(-1, mask.shape[-1])[:, 0].all()):
            return  # padded on the left: a head may read the first position
        if int(real.sum()) > (1 - LEAST_PADDING) * real.numel():
            return
        labels = kwargs.get("labels")
        if (
            isinstance(labels, torch.Tensor)
            and labels.shape == mask.shape
            and bool((labels.reshape(-1)[~real] != IGNORED).any())
        ):
            return  # a loss counts a padding position: compute it
        self.index = real.nonzero().squeeze(1)
        self.rows = real.numel()

    def clear(self) -> None:
        self.index = None


class PaddingFreeLinear(torch.nn.Linear):
    """``nn.Linear`` computed on the real positions only while :class:`RealRows` names them;
    zeros at the padding positions."""

    real_rows: RealRows

    def forward(self, input: torch.Tensor) -> torch.Tensor:
        index = self.real_rows.index
        # Training only, whatever the rows say: a forward that raised leaves them set, and
        # evaluation may call the model's body directly.
        if (
            index is None
            or not self.training
            or input.dim() < 3
            or input.shape[:-1].numel() != self.real_rows.rows
        ):
            return F.linear(input, self.weight, self.bias)
        flat = input.reshape(-1, input.shape[-1])
        real = F.linear(flat.index_select(0, index), self.weight, self.bias)
        out = real.new_zeros(flat.shape[0], real.shape[-1]).index_copy(0, index, real)
        return out.view(*input.shape[:-1], real.shape[-1])


def skip_padding(model: Any) -> int:
    """Make ``model``'s linear layers skip the padding positions while it trains, where it is
    one of :data:`MODEL_TYPES`; returns how many layers do (0: the model is left as it is)."""
    if getattr(getattr(model, "config", None), "model_type", None) not in MODEL_TYPES:
        return 0
    rows = RealRows()
    count = 0
    for module in model.modules():
        if type(module) is torch.nn.Linear:
            module.__class__ = PaddingFreeLinear
            object.__setattr__(module, "real_rows", rows)
            count += 1
    if count:
        model.register_forward_pre_hook(
            lambda module, args, kwargs: rows.set(module, kwargs), with_kwargs=True
        )
        model.register_forward_hook(lambda module, args, output: rows.clear())
    return count
