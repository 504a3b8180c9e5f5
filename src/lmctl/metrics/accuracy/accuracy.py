"""Accuracy as an ``evaluate`` module shipped inside lmctl.

``evaluate.load("accuracy")`` fetches its script from the Hub, so offline runs fail; this
module is loaded from the installed package instead and computes the same number.
"""

import datasets
import evaluate
import numpy as np

_DESCRIPTION = "Accuracy: the fraction of predictions equal to their references."
_INPUTS = """
Args:
    predictions (list of int): predicted labels or token ids.
    references (list of int): true labels or token ids.
Returns:
    accuracy (float): correct / total, NaN when there is nothing to score.
"""


class Accuracy(evaluate.Metric):
    def _info(self):
        return evaluate.MetricInfo(
            description=_DESCRIPTION,
            citation="",
            inputs_description=_INPUTS,
            features=datasets.Features(
                {"predictions": datasets.Value("int64"), "references": datasets.Value("int64")}
            ),
        )

    def _compute(self, predictions, references):
        predictions = np.asarray(predictions)
        references = np.asarray(references)
        if references.size == 0:
            return {"accuracy": float("nan")}
        return {"accuracy": float((predictions == references).mean())}
