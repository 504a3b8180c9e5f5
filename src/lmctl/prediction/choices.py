"""Scored endings (swag): each record's context paired with every ending, as in training, and
the probability of each ending (a softmax over the record's endings, summing to 1)."""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lmctl.config.slices import field_names
from lmctl.errors import DataError
from lmctl.objectives.swag import SwagConfig, SwagOptions, label_value, question_column

if TYPE_CHECKING:
    from lmctl.prediction.inputs import Item
    from lmctl.prediction.load import Loaded


def record_options(saved: dict[str, Any]) -> SwagOptions:
    """The columns (and sequence length) the run was trained with; the defaults of
    ``lmctl train swag`` for a bare model directory."""
    fields = SwagConfig.model_fields
    values = {
        name: saved.get(name, fields[name].get_default(call_default_factory=True))
        for name in field_names(SwagOptions)
    }
    if isinstance(values["ending_columns"], (list, tuple)):
        values["ending_columns"] = ",".join(map(str, values["ending_columns"]))
    return SwagOptions(**values)


def check_records(items: list[Item], options: SwagOptions) -> None:
    """Every record has a context and every ending; checked before the model loads."""
    hint = "give records with the columns the run was trained with: " + ", ".join(
        _needed(options, [options.question_column])
    )
    for item in items:
        record = item.record
        assert record is not None
        columns = list(record)
        missing = [name for name in _needed(options, columns) if name not in record]
        if missing:
            shown = ", ".join(f"'{name}'" for name in missing)
            raise DataError(
                f"{item.where}: no column {shown} (columns: {', '.join(columns)})", hint
            )
        for name in (options.context_column, *options.endings):
            if _text(record[name]) == "":
                raise DataError(f"{item.where}: '{name}' is empty", hint)


def score_endings(loaded: Loaded, items: list[Item], options: SwagOptions) -> list[dict[str, Any]]:
    import torch

    model, tokenizer = loaded.model, loaded.tokenizer
    limits = [
        value
        for value in (options.max_seq_length, tokenizer.model_max_length, loaded.max_length)
        if isinstance(value, int) and 0 < value < 1_000_000
    ]
    max_length = min(limits) if limits else 512
    results = []
    for item in items:
        record = item.record
        assert record is not None
        question = question_column(options, list(record))
        header = _text(record[question]) if question else ""
        context = _text(record[options.context_column])
        endings = [_text(record[name]) for name in options.endings]
        encoded = tokenizer(
            [context] * len(endings),
            [f"{header} {ending}".strip() for ending in endings],
            truncation=True,
            max_length=max_length,
            padding=True,
            return_tensors="pt",
        )
        inputs = {key: value.unsqueeze(0).to(loaded.device) for key, value in encoded.items()}
        with torch.inference_mode():
            logits = model(**inputs).logits[0]
        probabilities = torch.softmax(logits.float(), dim=-1).tolist()
        choice = max(range(len(endings)), key=lambda index: probabilities[index])
        result: dict[str, Any] = {
            "input": item.where,
            "context": context,
            "question": header,
            "endings": [
                {"column": name, "ending": text, "probability": probability}
                for name, text, probability in zip(
                    options.endings, endings, probabilities, strict=True
                )
            ],
            "choice": choice,
            "chosen": endings[choice],
        }
        label = label_value(record.get(options.label_column), len(endings))
        if label is not None:
            result["label"] = label
            result["correct"] = label == choice
        results.append(result)
    return results


def _needed(options: SwagOptions, columns: list[str]) -> list[str]:
    question = question_column(options, columns)
    return [options.context_column, *([question] if question else []), *options.endings]


def _text(value: Any) -> str:
    return "" if value is None else str(value).strip()
