"""Next-token loss and accuracy of a causal LM computed from its last hidden states, tile by
tile, without the full-vocabulary logits; and :class:`TiledHead`, the split of a model into
body and head that evaluation and the training losses (``lmctl.fastpaths.losses``) go through.

With a large vocabulary the output layer is most of evaluation's work and memory: 8 blocks
of 128 tokens against 50,257 entries are 200 MB of logits, written by the matmul and read
again by the softmax and the argmax. Cut into tiles of rows x vocabulary entries small
enough to stay in the CPU's cache, with the log-sum-exp, the target's logit and the argmax
carried from one tile to the next, the same numbers come out in about 60% of the time and
the logits of only one tile exist at once.

Bottom layer: imports nothing else of lmctl.
"""

from __future__ import annotations

import inspect
from dataclasses import dataclass
from typing import Any

#: Hidden-state rows and vocabulary entries per tile: 1024 x 1024 fp32 logits are 4 MB.
ROWS = 1024
ENTRIES = 1024


@dataclass(frozen=True)
class Scores:
    """A batch's summed next-token loss, its scored positions and the right predictions."""

    loss_sum: float
    scored: int
    right: int


def next_token_pairs(hidden: Any, labels: Any) -> tuple[Any, Any]:
    """Each position's hidden state, one row per position, and the token it predicts (the
    next one): ``hidden[:, :-1]`` against ``labels[:, 1:]``."""
    states = hidden[:, :-1].reshape(-1, hidden.shape[-1])
    return states, labels[:, 1:].reshape(-1).to(states.device)


def vocabulary_spans(vocabulary: int, entries: int) -> list[tuple[int, int]]:
    """The vocabulary cut into spans of ``entries`` (the last one shorter), as (low, high)."""
    return [(low, min(low + entries, vocabulary)) for low in range(0, vocabulary, entries)]


def next_token_scores(
    hidden: Any,
    weight: Any,
    bias: Any,
    labels: Any,
    *,
    rows: int = ROWS,
    entries: int = ENTRIES,
) -> Scores:
    """Loss and argmax accuracy of predicting ``labels[:, 1:]`` from ``hidden[:, :-1]``
    through the output layer ``weight`` (vocabulary x hidden) and ``bias``; positions labelled
    -100 are not scored. Logits are taken in float32, as the models' own loss takes them;
    ties in the argmax go to the lowest token id, as ``torch.argmax`` breaks them."""
    import torch

    states, targets = next_token_pairs(hidden, labels)
    kept = targets != -100
    states, targets = states[kept], targets[kept]
    loss_sum, right = 0.0, 0
    vocabulary = weight.shape[0]
    for start in range(0, targets.shape[0], rows):
        state, target = states[start : start + rows], targets[start : start + rows]
        count = target.shape[0]
        best = torch.full((count,), -torch.inf, dtype=torch.float32, device=state.device)
        total = torch.zeros(count, dtype=torch.float32, device=state.device)
        picked = torch.zeros(count, dtype=torch.long, device=state.device)
        target_logit = torch.zeros(count, dtype=torch.float32, device=state.device)
        for low, high in vocabulary_spans(vocabulary, entries):
            logits = state @ weight[low:high].T
            if bias is not None:
                logits = logits + bias[low:high]
            logits = logits.float()
            tile_best, tile_picked = logits.max(dim=-1)
            new_best = torch.maximum(best, tile_best)
            rescaled = torch.exp(logits - new_best[:, None]).sum(dim=-1)
            total = total * torch.exp(best - new_best) + rescaled
            picked = torch.where(tile_best > best, tile_picked + low, picked)
            best = new_best
            inside = ((target >= low) & (target < high)).nonzero().squeeze(1)
            if inside.numel():
                target_logit[inside] = logits[inside, target[inside] - low]
        loss_sum += float((best + total.log() - target_logit).sum())
        right += int((picked == target).sum())
    return Scores(loss_sum, int(targets.shape[0]), right)


def labelled_scores(hidden: Any, head: Any, labels: Any, *, rows: int = ROWS) -> Scores:
    """Loss and argmax accuracy at the positions labelled (not -100), with ``head`` applied to
    those positions only, ``rows`` at a time: a masked LM's evaluation, whose other
    positions are not scored."""
    import torch

    scored = labels != -100
    states, targets = hidden[scored], labels[scored].to(hidden.device)
    loss_sum, right = 0.0, 0
    for start in range(0, targets.shape[0], rows):
        logits = head(states[start : start + rows]).float()
        target = targets[start : start + rows]
        loss_sum += float(torch.nn.functional.cross_entropy(logits, target, reduction="sum"))
        right += int((logits.argmax(dim=-1) == target).sum())
    return Scores(loss_sum, int(targets.shape[0]), right)


class TiledHead:
    """A language model split into its body (``model.base_model``) and the head that turns
    each position's last hidden state into logits: by default the linear output layer, for
    :func:`next_token_scores`. :meth:`of` builds one only where the split reproduces the
    model's own logits on a real sample: architectures that rescale, cap or otherwise
    change the logits after the head keep the plain forward."""

    def __init__(self, model: Any, head: Any = None, *, shifted: bool = True) -> None:
        self.body = model.base_model
        self.head = head if head is not None else model.get_output_embeddings()
        #: Next-token scoring (a causal LM); otherwise the labelled positions themselves.
        self.shifted = shifted
        self._accepted = set(inspect.signature(self.body.forward).parameters)

    def hidden(self, inputs: dict[str, Any]) -> Any:
        arguments = {k: v for k, v in inputs.items() if k in self._accepted and k != "labels"}
        return self.body(**arguments, return_dict=True).last_hidden_state

    def scores(self, inputs: dict[str, Any]) -> Scores:
        hidden, labels = self.hidden(inputs), inputs["labels"]
        if self.shifted:
            return next_token_scores(hidden, self.head.weight, self.head.bias, labels)
        return labelled_scores(hidden, self.head, labels)

    @classmethod
    def of(
        cls, model: Any, sample: dict[str, Any], head: Any = None, *, shifted: bool = True
    ) -> TiledHead | None:
        """The split of ``model`` at ``head`` (default: a linear output layer), if its logits
        on ``sample`` (one batch of model inputs with labels) equal those of the plain
        forward; otherwise None."""
        import torch

        if head is None:
            head = _output_layer(model)
            if not isinstance(head, torch.nn.Linear):
                return None
        body = getattr(model, "base_model", None)
        if head is None or body is None or body is model:
            return None
        tiled = cls(model, head, shifted=shifted)
        first = {k: v[:1] if hasattr(v, "shape") else v for k, v in sample.items()}
        try:
            expected = model(**{k: v for k, v in first.items() if k != "labels"}).logits
            got = tiled.head(tiled.hidden(first))
        except (TypeError, ValueError, AttributeError, RuntimeError):
            return None
        if expected.shape != got.shape or not torch.allclose(
            expected.float(), got.float(), rtol=1e-4, atol=1e-5
        ):
            return None
        return tiled


def _output_layer(model: Any) -> Any:
    return model.get_output_embeddings() if hasattr(model, "get_output_embeddings") else None


def prediction_head(model: Any) -> Any:
    """The module that turns a masked LM's hidden states into logits (BERT's ``cls``,
    RoBERTa's ``lm_head``, ALBERT's ``predictions``): the one child besides the body, holding
    the output layer; None where the model is built otherwise."""
    output = _output_layer(model)
    body = getattr(model, "base_model", None)
    others = [child for child in model.children() if child is not body]
    if output is None or len(others) != 1:
        return None
    head = others[0]
    return head if any(module is output for module in head.modules()) else None
