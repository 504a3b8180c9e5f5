"""Metrics computed batch by batch, so evaluation memory does not grow with the eval set.

Bottom layer: imports nothing else of lmctl.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from pathlib import Path
from typing import Any

METRICS_DIR = Path(__file__).parent

# (logits, labels) -> (predictions, references), both flat integer arrays of scored positions.
Selector = Callable[[Any, Any], tuple[Any, Any]]


def load_metric(name: str) -> Any:
    """Load an ``evaluate`` module shipped inside lmctl (works offline)."""
    import evaluate

    return evaluate.load(str(METRICS_DIR / name))


class BatchMetrics:
    """Feeds each evaluation batch's argmax predictions to an ``evaluate`` accuracy module.

    Only integer predictions of the current batch are held in memory (the module spills them
    to its Arrow cache), never the logits of the whole evaluation set.
    """

    def __init__(self, select: Selector, metric_name: str = "accuracy") -> None:
        self.select = select
        self.metric_name = metric_name
        self._metric: Any = None

    def update(self, logits: Any, labels: Any) -> None:
        if isinstance(logits, (tuple, list)):
            logits = logits[0]
        predictions, references = self.select(logits, labels)
        if self._metric is None:
            self._metric = load_metric(self.metric_name)
        self._metric.add_batch(
            predictions=predictions.detach().cpu().numpy().ravel(),
            references=references.detach().cpu().numpy().ravel(),
        )

    def compute(self) -> dict[str, float]:
        if self._metric is None:
            return {}
        result = self._metric.compute() or {}
        self._metric = None
        return {key: float(value) for key, value in result.items()}

    def trainer_hook(self) -> Callable[..., dict[str, float]]:
        """``compute_metrics`` for a Trainer run with ``batch_eval_metrics=True``."""

        def compute_metrics(eval_pred: Any, compute_result: bool = False) -> dict[str, float]:
            self.update(eval_pred.predictions, eval_pred.label_ids)
            return self.compute() if compute_result else {}

        return compute_metrics


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
