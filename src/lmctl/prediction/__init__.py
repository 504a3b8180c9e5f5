"""Predictions of a trained model (``lmctl predict PATH``): continuations (clm, plm), filled
masks (mlm) and scored endings (swag).

PATH is resolved exactly as ``lmctl eval`` resolves it (:func:`lmctl.evaluation.target.
resolve_target`): a run, one of its checkpoints, a model directory or a storage URL, with the
run's objective or the one its architecture implies. The inputs are read and checked before
the model loads, so that a mistake in them answers at once.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lmctl.evaluation.target import resolve_target
from lmctl.prediction.generate import Generation
from lmctl.prediction.inputs import input_path, read_records, read_texts
from lmctl.storage.paths import is_remote

if TYPE_CHECKING:
    from lmctl.console import Console

__all__ = ["Generation", "predict", "sample_line"]

#: What each objective predicts, as the key of its results.
KINDS = {"clm": "continuation", "plm": "continuation", "mlm": "masks", "swag": "choices"}


def predict(
    path: str,
    *,
    task: str | None,
    prompts: list[str],
    input_file: str | None,
    generation: Generation,
    top_k: int,
    console: Console,
) -> dict[str, Any]:
    """The predictions of the model at ``path`` for every prompt and line of ``input_file``,
    shown on stdout (unless ``--json``) and returned as the command's result."""
    from lmctl.prediction.load import load_model, load_tokenizer
    from lmctl.prediction.show import show

    if input_file is not None:
        input_path(input_file)  # a missing file answers before a remote PATH is fetched
    target = resolve_target(path, task)
    objective = target.objective.name
    kind = KINDS[objective]
    swag_options = None
    if kind == "choices":
        from lmctl.prediction.choices import check_records, record_options

        items = read_records(prompts, input_file)
        swag_options = record_options(target.saved)
        check_records(items, swag_options)
    else:
        items = read_texts(prompts, input_file)
    console.info(f"predicting with {target.weights} ({objective}, {target.kind})")
    tokenizer = load_tokenizer(target, console)
    if kind == "masks":
        from lmctl.prediction.masks import check_masks, mask_token

        check_masks(items, mask_token(tokenizer, path))
    loaded = load_model(target, tokenizer, console)
    settings: dict[str, Any]
    if kind == "continuation":
        from lmctl.prediction.generate import continuations

        predictions = continuations(loaded, items, generation, console)
        settings = generation.shown()
    elif kind == "masks":
        from lmctl.prediction.masks import fill_masks

        predictions = fill_masks(loaded, items, top_k)
        settings = {"top_k": top_k}
    else:
        from lmctl.prediction.choices import score_endings

        assert swag_options is not None
        predictions = score_endings(loaded, items, swag_options)
        settings = {"ending_columns": swag_options.endings}
    show(console, kind, predictions)
    return {
        "path": path,
        "kind": target.kind,
        "objective": objective,
        "model": target.weights,
        "prediction": kind,
        "settings": settings,
        "predictions": predictions,
    }


def sample_line(run_dir: str, prompt: str, console: Console, max_new_tokens: int = 12) -> None:
    """Say one short greedy continuation of ``prompt`` by the final model of a clm run, as a
    taste of what it learnt; never fails (a problem is a warning)."""
    from dataclasses import replace

    from lmctl.console import Console
    from lmctl.prediction.load import load_model, load_tokenizer

    if is_remote(run_dir):
        return  # a run uploaded to a store is not fetched back for a taste
    # Loading the model again is no news: only its warnings are said.
    quiet = Console(replace(console.options, quiet=True), console.out)
    try:
        target = resolve_target(run_dir, None)
        tokenizer = load_tokenizer(target, quiet)
        loaded = load_model(target, tokenizer, quiet)
        from lmctl.prediction.generate import continuations
        from lmctl.prediction.inputs import Item

        generation = Generation(max_new_tokens=max_new_tokens)
        (result,) = continuations(loaded, [Item("sample", text=prompt)], generation, quiet)
    except Exception as exc:  # a taste of the model must never fail its run
        console.warn(f"no sample continuation: {type(exc).__name__}: {exc}")
        return
    continuation = " ".join(result["continuation"].split())
    console.info(f"sample: {prompt} → {continuation}")
