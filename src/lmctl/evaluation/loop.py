"""The one evaluation loop: of ``lmctl eval`` and of both engines' evaluations.

The loop walks the batches, scores each, adds up the sample-weighted loss (the Trainer's
``eval_loss``) and shows its progress; how a batch is scored is the caller's: in one process
from the model's body, so that only a tile or one sample's logits are ever held
(:func:`memory_scorer`), or through a distributed model with the losses and predictions
gathered across processes; evaluations inside training (both engines) choose between the two
(:func:`training_scorer`).
"""

from __future__ import annotations

import math
from collections.abc import Callable, Iterable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmctl.metrics import BatchMetrics
    from lmctl.metrics.lm_head import TiledHead
    from lmctl.objectives.base import Objective

#: Scores one batch into the metrics it was built with: (the batch's loss times the samples
#: it counts, those samples).
Scorer = Callable[[dict[str, Any]], tuple[float, int]]


@dataclass
class Tally:
    loss_sum: float = 0.0
    samples: int = 0
    steps: int = 0

    @property
    def loss(self) -> float:
        return self.loss_sum / max(self.samples, 1)


def evaluation_loop(
    batches: Iterable[dict[str, Any]],
    score: Scorer,
    on_step: Callable[[int], Any],
) -> Tally:
    """Score every batch; ``on_step`` is told each step done (the progress display)."""
    tally = Tally()
    for step, batch in enumerate(batches, 1):
        loss_sum, samples = score(batch)
        tally.loss_sum += loss_sum
        tally.samples += samples
        tally.steps = step
        on_step(step)
    return tally


def model_inputs(model: Any) -> Callable[[dict[str, Any]], dict[str, Any]]:
    """A filter for collated batches: the arguments the model's forward accepts, plus labels,
    as the Trainer keeps them. It runs after the collator, which may read columns that are
    not model arguments (special-tokens masks, word offsets)."""
    import inspect

    accepted = set(inspect.signature(model.forward).parameters) | {"label", "label_ids", "labels"}

    def keep(batch: dict[str, Any]) -> dict[str, Any]:
        return {key: value for key, value in batch.items() if key in accepted}

    return keep


def memory_scorer(model: Any, objective: Objective, metrics: BatchMetrics, device: Any) -> Scorer:
    """Scores a batch in one process without its full logits: a model whose logits are its
    head applied to its body's last hidden states is scored from those states (the
    objective's ``head_split``): a causal LM tile by tile, a masked LM at its masked positions
    only; any other model one sample at a time."""
    keep = model_inputs(model)
    shifted = objective.shifts_labels
    tiled: TiledHead | None = None
    checked = False

    def score(batch: dict[str, Any]) -> tuple[float, int]:
        nonlocal tiled, checked
        inputs = {k: v.to(device) if hasattr(v, "to") else v for k, v in keep(batch).items()}
        size = int(inputs["labels"].shape[0])
        if not checked:
            tiled, checked = objective.head_split(model, inputs), True
        if tiled is not None:
            scores = tiled.scores(inputs)
            metrics.add(scores.right, scores.scored)
            loss = scores.loss_sum / scores.scored if scores.scored else math.nan
        else:
            loss = batch_loss(model, inputs, metrics, shifted)
        return loss * size, size

    return score


def scores_in_memory(accelerator: Any) -> bool:
    """Whether an evaluation inside training scores as ``lmctl eval`` does: one process, and
    a model that neither DeepSpeed nor FSDP wraps."""
    from accelerate.utils import DistributedType

    return bool(
        accelerator.num_processes == 1 and accelerator.distributed_type == DistributedType.NO
    )


def training_scorer(
    accelerator: Any, model: Any, objective: Objective, metrics: BatchMetrics, *, is_main: bool
) -> Scorer:
    """How an evaluation inside training scores a batch: a plain model in one process as
    ``lmctl eval`` scores it (:func:`memory_scorer`, on the unwrapped model under the run's
    autocast: the same numbers, without the batch's full logits; a masked LM's head runs on
    the masked positions only); a model of several processes or one that DeepSpeed or FSDP
    wraps through :func:`gathered_scorer`."""
    import torch

    if not scores_in_memory(accelerator):
        return gathered_scorer(accelerator, model, metrics, is_main=is_main)
    plain = memory_scorer(accelerator.unwrap_model(model), objective, metrics, accelerator.device)

    def score(batch: dict[str, Any]) -> tuple[float, int]:
        # Not inference mode: tensors a model caches while scoring are used in training next.
        with torch.no_grad(), accelerator.autocast():
            return plain(batch)

    return score


def gathered_scorer(
    accelerator: Any, model: Any, metrics: BatchMetrics, *, is_main: bool
) -> Scorer:
    """Scores a batch through a (distributed) model on every process: its losses and argmax
    predictions are gathered, never its logits; the main process counts the metrics."""
    import torch

    from lmctl.metrics import predictions_of

    def score(batch: dict[str, Any]) -> tuple[float, int]:
        with torch.no_grad():
            outputs = model(**batch)
        size = int(next(iter(batch.values())).shape[0])
        losses = accelerator.gather_for_metrics(outputs.loss.detach().float().repeat(size))
        labels = batch.get("labels")
        if labels is not None:
            predictions = predictions_of(outputs.logits)
            del outputs
            predictions = accelerator.pad_across_processes(predictions, dim=1, pad_index=-100)
            labels = accelerator.pad_across_processes(labels, dim=1, pad_index=-100)
            predictions, labels = accelerator.gather_for_metrics((predictions, labels))
            if is_main:
                metrics.update(predictions, labels)
        return float(losses.sum()), int(losses.numel())

    return score


def batch_loss(model: Any, inputs: dict[str, Any], metrics: Any, shifted: bool) -> float:
    """The model's loss over a batch, computed one sample at a time.

    A model averages its loss over the batch's scored positions (labels not -100, shifted
    by one for causal LMs); weighting each sample's loss by its scored positions gives the
    same number, while only one sample's logits (not the batch's, with the loss's copy of
    them) are ever held: with a large vocabulary they are most of evaluation's memory.
    """
    loss_sum, scored = 0.0, 0
    for row in range(int(inputs["labels"].shape[0])):
        sample = {k: v[row : row + 1] if hasattr(v, "shape") else v for k, v in inputs.items()}
        labels = sample["labels"]
        count = int(((labels[..., 1:] if shifted else labels) != -100).sum())
        outputs = model(**sample)
        metrics.update(outputs.logits, labels)
        if count:
            loss_sum += float(outputs.loss) * count
            scored += count
        del outputs
    return loss_sum / scored if scored else math.nan
