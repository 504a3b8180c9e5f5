"""The training losses that the fast paths install: a causal LM's loss taken from its output
layer tile by tile (``tiled-loss``) or by liger-kernel's fused kernels (``fused-linear-loss``),
and a masked LM's prediction head on the masked positions only (``masked-head``). Each gives
the model's own loss and gradients, and is installed only where the model's body and head
reproduce its logits and its loss (checked on a few token ids).

Training needs the whole row of a position's logits for its softmax gradient, so the tiled
loss is cut into tiles of rows, each spanning the vocabulary in spans of 1024 entries: a
span's logits are computed, less their maximum and exponentiated while they are in the cache;
the tile's normalisers come from the spans' maxima and sums; then span by span the softmax
becomes the gradient of the hidden states and of the output layer, and the target's one-hot
share is subtracted from both at the end. Every matmul is of a span of 512 rows x 1024
entries, whose logits (2 MB) are exponentiated while still in the cache, and the output layer
is read twice per tile (for the logits, then for the gradients). The batch's logits, their
softmax and their gradient (three full-vocabulary tensors) never exist, only one tile's: the
backward pass only scales the gradients already computed.
Measured on two cores, 8 x 128 tokens, the output layer's forward and backward in 256-row
tiles: 0.27 s against the model's own 0.43 s (30,522 entries, 256 hidden); 512-row tiles
take 8% less time than 256-row ones with 384 hidden (0.212 against 0.232 s), 11% with 768
hidden and 50,257 entries, 3% with 256 hidden, the same with 128; the one tile's
exponentiated logits are then 512 x the vocabulary (62 MB for 30,522 entries).

A loss replaces the model instance's ``forward`` (:func:`_train_through`) rather than being a
step the engine runs beside it: DistributedDataParallel syncs the gradients of a backward pass
only after a forward through its wrapper, which calls the model's ``forward`` (without it the
gradient hooks return unsynced, and each process would silently train on its own gradients).
Evaluation, calls without labels or gradients, and anything saved are the model's own.
"""

from __future__ import annotations

import inspect
from functools import partial
from typing import Any

from lmctl.metrics.lm_head import TiledHead, next_token_pairs, prediction_head, vocabulary_spans

#: Rows per tile, and vocabulary entries per span of a tile: 512 x 1024 fp32 logits are 2 MB.
ROWS = 512
ENTRIES = 1024


def next_token_loss(
    hidden: Any,
    weight: Any,
    bias: Any,
    labels: Any,
    num_items: Any = None,
    *,
    rows: int = ROWS,
    entries: int = ENTRIES,
) -> Any:
    """The causal-LM training loss of predicting ``labels[:, 1:]`` from ``hidden[:, :-1]``
    through the output layer, differentiable in ``hidden``, ``weight`` and ``bias``; the
    same number as the models' own loss (transformers' ``ForCausalLMLoss``): the mean over
    the positions not labelled -100, or with ``num_items`` their sum divided by it."""
    states, targets = next_token_pairs(hidden, labels)
    loss_sum, count = _tiled_loss_function().apply(states, weight, bias, targets, rows, entries)
    if num_items is not None:
        return loss_sum / num_items
    return loss_sum / count


def _exponentiated(
    state: Any, matrix: Any, offset: Any, spans: list[tuple[int, int]], buffer: Any
) -> tuple[list[Any], Any, Any]:
    """The logits ``state @ matrix.T + offset`` of each span of the vocabulary, less the
    span's maximum per row and exponentiated, in float32, in ``buffer`` (at least rows x
    vocabulary elements); with the maxima and the sums of the exponentials, spans x rows."""
    import torch

    count, device = state.shape[0], state.device
    maxima = torch.empty(len(spans), count, dtype=torch.float32, device=device)
    totals = torch.empty_like(maxima)
    pieces = []
    for index, (low, high) in enumerate(spans):
        piece = buffer[low * count : high * count].view(count, high - low)
        part = matrix[low:high].T
        if state.dtype != torch.float32:
            logits = state @ part if offset is None else torch.addmm(offset[low:high], state, part)
            piece.copy_(logits)
        elif offset is None:
            torch.mm(state, part, out=piece)
        else:
            torch.addmm(offset[low:high], state, part, out=piece)
        torch.amax(piece, dim=1, out=maxima[index])
        piece.sub_(maxima[index][:, None]).exp_()
        torch.sum(piece, dim=1, out=totals[index])
        pieces.append(piece)
    return pieces, maxima, totals


_TILED_LOSS: Any = None


def _tiled_loss_function() -> Any:
    """The autograd function behind :func:`next_token_loss` (built once, torch imported
    only when a model trains)."""
    global _TILED_LOSS
    if _TILED_LOSS is not None:
        return _TILED_LOSS
    import torch

    class TiledNextTokenLoss(torch.autograd.Function):
        """Summed cross-entropy of ``states @ weight.T + bias`` against ``targets``, with its
        gradients computed tile by tile in the forward pass (see the module's docstring)."""

        @staticmethod
        def forward(  # noqa: PLR0917 (autograd passes its inputs by position)
            ctx: Any, states: Any, weight: Any, bias: Any, targets: Any, rows: int, entries: int
        ) -> Any:
            device = states.device.type
            # The matmuls run in the autocast dtype where autocast is on (as the output
            # layer's own forward and backward would), in the weights' dtype otherwise; the
            # softmax and the gradients' sums in float32.
            compute = (
                torch.get_autocast_dtype(device)
                if torch.is_autocast_enabled(device)
                else weight.dtype
            )
            matrix = weight.to(compute)
            offset = None if bias is None else bias.to(compute)
            spans = vocabulary_spans(weight.shape[0], entries)
            grad_states = torch.empty_like(states)
            grad_weight = torch.zeros_like(weight, dtype=torch.float32)
            grad_bias = None if bias is None else torch.zeros_like(bias, dtype=torch.float32)
            loss_sum = torch.zeros((), dtype=torch.float32, device=states.device)
            # One buffer for every tile's logits: a fresh one per tile would be mapped
            # anew, page by page, on each first write.
            buffer = torch.empty(
                min(rows, states.shape[0]) * weight.shape[0],
                dtype=torch.float32,
                device=states.device,
            )
            with torch.autocast(device, enabled=False):
                for start in range(0, states.shape[0], rows):
                    state = states[start : start + rows].to(compute)
                    target = targets[start : start + rows]
                    scored = target != -100
                    picked = target.clamp(min=0)
                    # Pass 1: each span's logits, less the span's maximum, exponentiated
                    # while they are in the cache; every span of the tile is kept.
                    pieces, maxima, totals = _exponentiated(state, matrix, offset, spans, buffer)
                    top = maxima.amax(dim=0)
                    rescale = (maxima - top).exp_()
                    total = (totals * rescale).sum(dim=0)
                    chosen = (state.float() * matrix[picked].float()).sum(dim=-1)
                    if offset is not None:
                        chosen += offset[picked].float()
                    loss_sum += ((top + total.log() - chosen) * scored).sum()
                    # Pass 2: d(loss)/d(logits) = softmax - one-hot, on the scored rows
                    # only; the softmax span by span, the one-hot's share after.
                    factor = rescale.div_(total).mul_(scored)
                    grad_state = torch.zeros(state.shape, dtype=torch.float32, device=state.device)
                    for piece, row_factor, (low, high) in zip(pieces, factor, spans, strict=True):
                        gradient = piece.mul_(row_factor[:, None])
                        if grad_bias is not None:
                            grad_bias[low:high] += gradient.sum(dim=0)
                        part = matrix[low:high]
                        if compute == torch.float32:
                            grad_state.addmm_(gradient, part)
                            grad_weight[low:high].addmm_(gradient.T, state)
                        else:
                            gradient = gradient.to(compute)
                            grad_state += (gradient @ part).float()
                            grad_weight[low:high] += (gradient.T @ state).float()
                    hits = scored.nonzero().squeeze(1)
                    grad_state[hits] -= matrix[picked[hits]].float()
                    grad_weight.index_add_(0, picked[hits], state[hits].float(), alpha=-1)
                    if grad_bias is not None:
                        grad_bias.index_add_(
                            0, picked[hits], hits.new_ones(len(hits)).float(), alpha=-1
                        )
                    grad_states[start : start + rows] = grad_state
            # Kept on ctx rather than saved, so that the backward pass can hand them on
            # without a copy (autograd copies a gradient something else still holds).
            ctx.gradients = (grad_states, grad_weight, grad_bias)
            ctx.dtypes = (weight.dtype, None if bias is None else bias.dtype)
            count = (targets != -100).sum()
            ctx.mark_non_differentiable(count)
            return loss_sum, count

        @staticmethod
        def backward(ctx: Any, grad_loss: Any, grad_count: Any) -> Any:
            if ctx.gradients is None:
                raise RuntimeError(
                    "the tiled training loss hands its gradients on once: backward through "
                    "it a second time (retain_graph) is not supported"
                )
            grad_states, grad_weight, grad_bias = ctx.gradients
            ctx.gradients = None
            weight_dtype, bias_dtype = ctx.dtypes
            return (
                grad_states.mul_(grad_loss.to(grad_states.dtype)),
                grad_weight.mul_(grad_loss).to(weight_dtype),
                None if grad_bias is None else grad_bias.mul_(grad_loss).to(bias_dtype),
                None,
                None,
                None,
            )

    _TILED_LOSS = TiledNextTokenLoss
    return _TILED_LOSS


def tile_training_loss(model: Any) -> bool:
    """Make a causal LM's training forward compute its loss with :func:`next_token_loss`,
    where its body and linear output layer reproduce its logits and its loss; returns
    whether it does."""

    def loss(split: TiledHead, inputs: dict[str, Any], labels: Any, num_items: Any) -> Any:
        head = split.head
        return next_token_loss(split.hidden(inputs), head.weight, head.bias, labels, num_items)

    return _install(model, None, loss, "CausalLMOutput")


def fused_linear_training_loss(model: Any) -> bool:
    """Make a causal LM's training forward compute its loss with liger-kernel's fused linear
    cross-entropy (Triton kernels on a GPU: the output layer and the cross-entropy taken
    chunk by chunk of rows, the logits of one chunk at a time), where its body and linear
    output layer reproduce its logits and its loss and liger-kernel is installed; returns
    whether it does. The split is checked on the CPU with PyTorch's cross-entropy (the
    kernels themselves run on the GPU only)."""
    try:
        from liger_kernel.transformers.functional import liger_fused_linear_cross_entropy
    except ImportError:
        return False
    import torch

    def pairs(split: TiledHead, inputs: dict[str, Any], labels: Any) -> tuple[Any, Any, Any]:
        """The positions' hidden states, the output layer's weight (both in the autocast dtype
        where autocast is on, as the model's own output layer computes) and the targets."""
        states, targets = next_token_pairs(split.hidden(inputs), labels)
        weight = split.head.weight
        device = states.device.type
        if torch.is_autocast_enabled(device):
            dtype = torch.get_autocast_dtype(device)
            states, weight = states.to(dtype), weight.to(dtype)
        return states, weight, targets

    def loss(split: TiledHead, inputs: dict[str, Any], labels: Any, num_items: Any) -> Any:
        states, weight, targets = pairs(split, inputs, labels)
        reduction = "mean" if num_items is None else "sum"
        value = liger_fused_linear_cross_entropy(
            states, weight, targets, split.head.bias, reduction=reduction
        )
        return value if num_items is None else value / num_items

    def checked_by(split: TiledHead, inputs: dict[str, Any], labels: Any, _: Any) -> Any:
        states, weight, targets = pairs(split, inputs, labels)
        logits = torch.nn.functional.linear(states, weight, split.head.bias).float()
        return torch.nn.functional.cross_entropy(logits, targets)

    return _install(model, None, loss, "CausalLMOutput", checked_by=checked_by)


def masked_training_loss(model: Any) -> bool:
    """Make a masked LM's training forward apply its prediction head to the masked positions
    only (the loss is taken there alone; the head works position by position), where its
    body and head reproduce its logits and its loss; returns whether it does.

    With 15% of the positions masked, the head, which for a small model with a large
    vocabulary is most of the work, runs on 15% of them; the loss and gradients are the
    model's own."""
    import torch

    head = prediction_head(model)
    if head is None:
        return False

    def loss(split: TiledHead, inputs: dict[str, Any], labels: Any, num_items: Any) -> Any:
        scored = labels != -100
        logits = split.head(split.hidden(inputs)[scored]).float()
        reduction = "mean" if num_items is None else "sum"
        value = torch.nn.functional.cross_entropy(logits, labels[scored], reduction=reduction)
        return value if num_items is None else value / num_items

    return _install(model, head, loss, "MaskedLMOutput")


def _install(model: Any, head: Any, loss: Any, output: str, *, checked_by: Any = None) -> bool:
    """Train ``model`` through ``loss(split, inputs, labels, num_items)`` where the split at
    ``head`` reproduces the model's logits and its loss (a model that adds to its loss, such
    as a mixture of experts' balancing term, keeps its own forward). Checked on a few token
    ids, in eval mode and without drawing random numbers, so that checking changes nothing a
    seeded run depends on; through ``checked_by`` instead where the loss itself runs on
    another device only."""
    import torch

    positions = getattr(model.config, "max_position_embeddings", None)
    length = min(8, positions or getattr(model.config, "n_positions", None) or 8)
    ids = torch.arange(1, length + 1)[None] % model.config.vocab_size
    sample = {"input_ids": ids, "labels": ids}
    training = model.training
    model.eval()
    try:
        with torch.no_grad(), torch.random.fork_rng(devices=[]):
            split = TiledHead.of(model, sample, head)
            if split is None:
                return False
            checked = (checked_by or loss)(split, sample, ids, None)
            own = model(**sample).loss
            if own is None or not torch.allclose(
                checked.float(), own.float(), rtol=1e-4, atol=1e-5
            ):
                return False
    finally:
        model.train(training)
    _train_through(model, partial(loss, split), output)
    return True


def _train_through(model: Any, loss: Any, output: str) -> None:
    """Replace this instance's forward: a training call with labels returns ``loss(inputs,
    labels, num_items_in_batch)`` in a transformers ``output`` (no logits); evaluation,
    calls without labels and calls without gradients keep the model's own forward, and so
    does anything saved."""
    import types

    import torch
    from transformers import modeling_outputs

    own = model.forward
    result = getattr(modeling_outputs, output)

    def forward(self: Any, *args: Any, **kwargs: Any) -> Any:
        labels = kwargs.get("labels")
        if args or labels is None or not self.training or not torch.is_grad_enabled():
            return own(*args, **kwargs)
        inputs = dict(kwargs)
        num_items = inputs.pop("num_items_in_batch", None)
        return result(loss=loss(inputs, labels, num_items))

    # The function's signature, ``self`` first: a bound method's signature drops the first
    # parameter, which would otherwise be the model's first input.
    signature = inspect.signature(own)
    this = inspect.Parameter("self", inspect.Parameter.POSITIONAL_OR_KEYWORD)
    forward.__signature__ = signature.replace(  # type: ignore[attr-defined]
        parameters=[this, *signature.parameters.values()]
    )
    model.forward = types.MethodType(forward, model)
