"""Metrics computed batch by batch, so evaluation memory does not grow with the eval set.

Bottom layer: imports nothing else of lmctl.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

METRICS_DIR = Path(__file__).parent

# (predictions, labels) -> (predictions, references) at the scored positions.
Selector = Callable[[Any, Any], tuple[Any, Any]]


def load_metric(name: str) -> Any:
    """Load an ``evaluate`` module shipped inside lmctl (works offline)."""
    import evaluate

    return evaluate.load(str(METRICS_DIR / name))


def predictions_of(outputs: Any) -> Any:
    """Argmax predictions of a model's logits (the first of a tuple); integer tensors are
    taken to be predictions already. Reducing before any gather keeps only one integer per
    position, never a batch of full-vocabulary logits, once the batch has been scored."""
    if isinstance(outputs, (tuple, list)):
        outputs = outputs[0]
    if outputs.is_floating_point():
        return outputs.argmax(dim=-1)
    return outputs


class BatchMetrics:
    """Accuracy counted batch by batch with two integers (right, scored), so evaluation
    memory does not grow with the eval set and nothing is written per batch."""

    def __init__(self, select: Selector) -> None:
        self.select = select
        self._right = 0
        self._scored = 0
        self._updated = False

    def update(self, outputs: Any, labels: Any) -> None:
        """Score one batch: logits or the argmax predictions of :func:`predictions_of`."""
        predictions, references = self.select(predictions_of(outputs), labels)
        self.add(int((predictions == references).sum()), int(references.numel()))

    def add(self, right: int, scored: int) -> None:
        """Count a batch scored elsewhere (see :mod:`lmctl.metrics.lm_head`)."""
        self._right += right
        self._scored += scored
        self._updated = True

    def compute(self) -> dict[str, float]:
        if not self._updated:
            return {}
        accuracy = self._right / self._scored if self._scored else float("nan")
        self._right = self._scored = 0
        self._updated = False
        return {"accuracy": accuracy}

    def trainer_hook(self) -> Callable[..., dict[str, float]]:
        """``compute_metrics`` for a Trainer run with ``batch_eval_metrics=True`` and
        ``preprocess_logits_for_metrics=reduce_logits``."""

        def compute_metrics(eval_pred: Any, compute_result: bool = False) -> dict[str, float]:
            self.update(eval_pred.predictions, eval_pred.label_ids)
            return self.compute() if compute_result else {}

        return compute_metrics


def reduce_logits(logits: Any, labels: Any) -> Any:
    """The Trainer's ``preprocess_logits_for_metrics``: predictions before the gather."""
    return predictions_of(logits)


def perplexity(loss: float) -> float:
    try:
        return math.exp(loss)
    except OverflowError:
        return float("inf")


#: Decimals that reported losses are rounded to.
LOSS_DECIMALS = 4


def loss_metrics(loss: float, *, with_perplexity: bool) -> dict[str, float]:
    """``eval_loss``, rounded once, and the perplexity of that rounded loss.

    Training's final evaluation and ``lmctl eval`` both report through here, so the same
    weights on the same data show the same numbers (their loss sums differ in the last bits
    of float precision).
    """
    rounded = round(loss, LOSS_DECIMALS)
    out = {"eval_loss": rounded}
    if with_perplexity:
        out["perplexity"] = perplexity(rounded)
    return out
