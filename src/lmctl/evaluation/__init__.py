"""Evaluating a model outside training: a run directory, one of its checkpoints, or a bare
model directory.

A run (or a checkpoint inside one) brings its objective and data from the saved
``lmctl.yaml``; a bare model needs the objective (``--task``, or inferred from the
architecture in its ``config.json``) and data. Either way the shared pipeline
(:func:`lmctl.pipeline.prepare`) loads the model, tokenizer and validation data exactly as
training does, and the loop below feeds the objective's deterministic eval collator and
per-batch metrics, so memory does not grow with the evaluation set and two evaluations of the
same weights on the same data give identical numbers.

Where results go: ``--output FILE`` writes them there. Otherwise, for a run or checkpoint
directory, ``eval_results.json`` is written into it only when it has none yet (training's
final evaluation writes one); ``--overwrite-results`` replaces it. The eval keys of
``all_results.json`` are updated with it; its train keys are never touched. For a bare model
directory nothing is written without ``--output``.
"""

from __future__ import annotations

import time
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.config.slices import slice_config
from lmctl.errors import Interrupted
from lmctl.evaluation.loop import evaluation_loop, memory_scorer
from lmctl.evaluation.results import record_in_run, results_destination, save
from lmctl.evaluation.target import SOURCE_FIELDS, eval_config, resolve_target
from lmctl.metrics import loss_metrics
from lmctl.run import checkpoints
from lmctl.run.runtime import resolve_runtime

if TYPE_CHECKING:
    from lmctl.console import Console
    from lmctl.pipeline import Prepared


def run_evaluation(
    path: str,
    *,
    task: str | None,
    options: dict[str, Any],
    output: str | None,
    overwrite_results: bool,
    console: Console,
    allow_random_head: bool = False,
) -> dict[str, Any]:
    target = resolve_target(path, task)
    config = eval_config(target, options)
    destination = results_destination(target, output, overwrite_results, console)
    console.info(f"evaluating {target.weights} ({target.objective.name}, {target.kind})")
    if target.kind == "run" and checkpoints.CHECKPOINT_PATTERN.match(Path(target.weights).name):
        console.info(f"{path} has no final model yet: evaluating its newest checkpoint")
    saved = target.saved
    if (
        saved.get("do_eval") is False
        and saved.get("train_file")
        and not saved.get("validation_file")
        and not any(key in options for key in ("validation_file", "dataset_name"))
    ):
        console.warn(
            f"{path} trained with --no-eval on all of {saved['train_file']}: the part held out "
            "for evaluation here was seen in training; give --validation-file for a fair number"
        )
    from lmctl.pipeline import prepare

    # The one place of evaluation that reads the whole document: to cut it into slices.
    spec = slice_config(config, target.objective.options_class)
    weights = Path(target.weights)
    try:
        runtime = resolve_runtime(spec, weights, console)
        prepared = prepare(
            spec, runtime, target.objective, weights, console, random_head_ok=allow_random_head
        )
        metrics = evaluate_prepared(prepared, console)
    except KeyboardInterrupt:
        console.stop_progress()
        raise Interrupted("evaluation interrupted; nothing was written") from None
    if destination is not None:
        save(target, destination, metrics)
        console.info(f"results written to {destination}")
    if not any(key in options for key in SOURCE_FIELDS):
        record_in_run(target, metrics, console)
    return {
        "path": path,
        "kind": target.kind,
        "objective": target.objective.name,
        "model": target.weights,
        "metrics": metrics,
        "results_file": str(destination) if destination is not None else None,
    }


def evaluate_prepared(prepared: Prepared, console: Console) -> dict[str, Any]:
    """Loss, perplexity and the objective's accuracy over the evaluation split, in the one
    evaluation loop, scored without the batch's full logits (see ``memory_scorer``). Loss is
    the per-sample-weighted mean of batch losses, as the Trainer reports ``eval_loss``."""
    import torch
    from torch.utils.data import DataLoader
    from transformers import set_seed

    dataset = prepared.eval_dataset
    assert dataset is not None
    model, objective = prepared.model, prepared.objective
    device = torch.device(prepared.runtime.device)
    model.to(device)
    model.eval()
    loop = prepared.spec.loop
    loader = DataLoader(
        dataset,
        batch_size=loop.per_device_eval_batch_size,
        shuffle=False,
        collate_fn=prepared.eval_collator,
    )
    metrics = objective.metrics()
    # Same random state for every evaluation, whatever loading consumed before.
    set_seed(loop.seed)
    start = time.perf_counter()
    console.start_progress(len(loader) if hasattr(dataset, "__len__") else None, "evaluating")
    with torch.inference_mode():
        tally = evaluation_loop(
            loader,
            memory_scorer(model, objective, metrics, device),
            lambda step: console.update_progress(step, {}, log_line=False),
        )
    console.stop_progress(tally.samples)
    runtime = time.perf_counter() - start
    results: dict[str, Any] = loss_metrics(tally.loss, with_perplexity=objective.reports_perplexity)
    results.update({f"eval_{key}": value for key, value in metrics.compute().items()})
    results["eval_samples"] = tally.samples
    results["eval_runtime"] = round(runtime, 4)
    results["eval_samples_per_second"] = round(tally.samples / runtime, 3) if runtime else 0.0
    results["eval_steps_per_second"] = round(tally.steps / runtime, 3) if runtime else 0.0
    return results
