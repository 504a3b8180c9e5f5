"""The ``trainer`` engine's evaluations, scored as ``lmctl eval`` scores where they can.

The Trainer's own loop computes each batch's full logits and gathers them; for a plain model
in one process, :func:`lmctl.evaluation.loop.training_scorer` gives the same numbers without
holding them (a masked LM runs its head on the masked positions only: MiniLM's evaluation took
two thirds of the time on a CPU), and the same numbers as ``lmctl eval``.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lmctl.evaluation.loop import evaluation_loop, scores_in_memory, training_scorer
from lmctl.run.lifecycle import evaluate_sources

if TYPE_CHECKING:
    from lmctl.objectives.base import Objective


def in_memory_evaluation(
    trainer: Any, objective: Objective | None, dataloader: Any, prefix: str
) -> Any:
    """The Trainer's ``evaluation_loop`` output (loss and the objective's metrics under
    ``prefix``), or None where the Trainer's own loop runs: several processes, DeepSpeed or
    FSDP, a whole-model fp16/bf16 evaluation, or the loss alone asked for."""
    from transformers.trainer_utils import EvalLoopOutput

    args = trainer.args
    if (
        objective is None
        or not scores_in_memory(trainer.accelerator)
        or args.prediction_loss_only
        or args.fp16_full_eval
        or args.bf16_full_eval
    ):
        return None
    trainer.model.eval()
    if callable(getattr(trainer.optimizer, "eval", None)):
        trainer.optimizer.eval()  # a schedule-free optimizer evaluates at its average
    handler = trainer.callback_handler
    handler.eval_dataloader = dataloader
    metrics = objective.metrics()
    score = training_scorer(trainer.accelerator, trainer.model, objective, metrics, is_main=True)

    def on_step(_: int) -> None:
        trainer.control = handler.on_prediction_step(args, trainer.state, trainer.control)

    tally = evaluation_loop(dataloader, score, on_step)
    results = {f"{prefix}_loss": tally.loss}
    results.update({f"{prefix}_{key}": value for key, value in metrics.compute().items()})
    return EvalLoopOutput(None, None, results, tally.samples)  # type: ignore[arg-type]


def final_figures(trainer: Any, prepared: Any) -> dict[str, Any]:
    """``eval_samples`` of the evaluation just made, then each validation source evaluated on
    its own (:func:`lmctl.run.lifecycle.evaluate_sources`)."""
    samples = trainer.eval_samples

    def evaluate(dataset: Any, prefix: str) -> dict[str, Any]:
        metrics: dict[str, Any] = trainer.evaluate(eval_dataset=dataset, metric_key_prefix=prefix)
        return metrics

    return {"eval_samples": samples, **evaluate_sources(prepared, evaluate)}
