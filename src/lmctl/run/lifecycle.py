"""What a run does around its loop, written once for both engines.

An engine module keeps only what truly differs: the Trainer's wiring, or the Accelerate
loop. Both come here for the rest: the trackers they may log to, the sampler that groups
samples by length, a checkpoint written into a staging folder and committed (then rotated),
the final model staged and committed, a non-finite loss that stops every process, the
agreement of every process to stop, and the training record of a run that resumed (perhaps
at its last step) or ran to its end.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.distributed import summed
from lmctl.errors import Interrupted, LmctlError, TrainingFailed
from lmctl.metrics import loss_metrics
from lmctl.run import card, checkpoints, history, rundir
from lmctl.run.plots import write_loss_plot
from lmctl.run.restarts import record_restart, restarted
from lmctl.run.resume import resume_command
from lmctl.run.signals import graceful_stop
from lmctl.run.totals import RunTotals, recorded_totals, whole_run
from lmctl.storage import atomic

if TYPE_CHECKING:
    from lmctl.config.slices import RunDirSpec, RunSpec
    from lmctl.console import Console
    from lmctl.objectives.base import Objective
    from lmctl.run.runtime import Runtime
    from lmctl.run.signals import StopRequest


class NonFiniteLoss(RuntimeError):
    def __init__(self, step: int, value: float) -> None:
        super().__init__(f"loss is {value} at step {step}")
        self.step = step
        self.value = value


@dataclass
class EngineResult:
    train_metrics: dict[str, Any] = field(default_factory=dict)
    eval_metrics: dict[str, Any] = field(default_factory=dict)
    global_step: int = 0
    resumed_from: str | None = None
    interrupted_at: int | None = None
    checkpoint: Path | None = None
    #: A streamed mixture's examples trained on per source, over every process.
    mixture: dict[str, int] = field(default_factory=dict)


def evaluate_sources(
    prepared: Any, evaluate: Callable[[Any, str], dict[str, Any]]
) -> dict[str, Any]:
    """Each validation source of ``prepared`` (``eval_sources``) evaluated on its own by the
    engine's ``evaluate(dataset, prefix)``: ``eval_<name>_loss``, ``eval_<name>_perplexity``
    and the objective's metrics (``eval_<name>_accuracy``), rounded as the overall figures."""
    with_perplexity = prepared.objective.reports_perplexity
    out: dict[str, Any] = {}
    for name, dataset in prepared.eval_sources.items():
        prefix = f"eval_{name}"
        metrics = evaluate(dataset, prefix)
        figures = loss_metrics(metrics[f"{prefix}_loss"], with_perplexity=with_perplexity)
        out[f"{prefix}_loss"] = figures["eval_loss"]
        if "perplexity" in figures:
            out[f"{prefix}_perplexity"] = figures["perplexity"]
        for key, value in metrics.items():
            if key.startswith(f"{prefix}_") and key.split(f"{prefix}_", 1)[1] in ("accuracy",):
                out[key] = value
    return out


def mixture_figures(mixture: dict[str, int], unit: str = "records") -> dict[str, Any]:
    """The training mixture as trained on: ``train_<name>_<unit>`` (the records a mixture
    of datasets holds, or the examples a streamed one gave to training) and
    ``train_<name>_share`` of each source."""
    total = sum(mixture.values()) or 1
    out: dict[str, Any] = {}
    for name, count in mixture.items():
        out[f"train_{name}_{unit}"] = count
        out[f"train_{name}_share"] = round(count / total, 4)
    return out


def trained_mixture(cursor: Any, accelerator: Any) -> dict[str, int]:
    """A streamed mixture's examples trained on per source, summed over every process
    (each calls this at the same point); empty for any other data."""
    counts = {} if cursor is None else cursor.source_counts()
    if not counts or accelerator.num_processes == 1:
        return counts
    return {name: int(total) for name, total in summed(counts, accelerator).items()}


def length_sampler(lengths: list[int] | None, window: int, seed: int) -> Any:
    """Batches of similar length over ``window`` samples at a time (None: no grouping)."""
    if lengths is None:
        return None
    from lmctl.data.batching import LengthGroupedSampler

    return LengthGroupedSampler(lengths, window, seed)


def any_process(accelerator: Any, flag: bool) -> bool:
    """Whether ``flag`` holds on any process, so that every process takes the same decision
    (every process must call this at the same point)."""
    if accelerator.num_processes == 1:
        return flag
    import torch

    value = torch.tensor(float(flag), device=accelerator.device)
    return bool(accelerator.reduce(value, "sum").item() > 0)


def stop_agreed(accelerator: Any, stop: Any) -> bool:
    """A signal seen by any process stops all of them after the same step."""
    if not any_process(accelerator, stop.requested):
        return False
    stop.adopt()
    return True


def check_finite(accelerator: Any, loss: Any, step: int) -> None:
    """A non-finite loss on any process stops every process before the optimizer step can
    spoil the weights, and without leaving one waiting in a collective."""
    import torch

    finite = bool(torch.isfinite(loss).all())
    if any_process(accelerator, not finite):
        value = float(loss.detach().float().mean()) if not finite else math.nan
        raise NonFiniteLoss(step, value)


def end_processes(accelerator: Any) -> None:
    """Release what the accelerator holds, then the process group, while the interpreter is
    fully alive. The caller drops its references to the distributed model first: a gradient
    reducer must not outlive the process group (its teardown would hang). A gloo group left to
    interpreter shutdown can abort a process after a successful run (SIGABRT, "terminate
    called without an active exception"), and the launcher then stops every other process."""
    accelerator.free_memory()
    accelerator.end_training()


def save_checkpoint(
    run_dir: Path,
    step: int,
    *,
    owner: str,
    commits: bool,
    writes_state: bool,
    wait: Callable[[], Any],
    write_parts: Callable[[Path], Any],
    write_state: Callable[[Path], Any],
    limit: int | None,
    protect: list[Path] | None = None,
) -> Path:
    """``checkpoint-<step>``: every process writes its parts (weights, optimizer, RNG state,
    stream position) into one staging folder, then the main process the trainer state, last;
    the folder is renamed into place once complete, so that a crash never leaves a
    half-written checkpoint that looks complete, and older ones are rotated out.

    ``commits``: this process renames the folder (see ``rundir.commits_checkpoints``).
    """
    final = run_dir / f"checkpoint-{step}"
    staging = atomic.staging_dir(final, owner=owner)
    if commits:
        atomic.begin_staging(final, owner=owner)
    wait()
    write_parts(staging)
    wait()
    if writes_state:
        write_state(staging)
    if commits:
        checkpoints.commit_dir(staging, final)
        checkpoints.rotate_checkpoints(run_dir, limit, protect=protect or [])
    wait()
    return final


def save_final_model(
    run_dir: Path,
    *,
    owner: str,
    is_main: bool,
    wait: Callable[[], Any],
    save: Callable[[Path], Any],
    complete: Callable[[Path], Any] | None = None,
) -> None:
    """The final model, as ``save_pretrained`` writes it: every process takes part in the save
    (sharded models need it), into a staging folder that the main process completes
    (``complete``) and moves into the run directory with its manifest last."""
    staging = checkpoints.model_staging(run_dir, owner=owner)
    if is_main:
        checkpoints.begin_model(run_dir, owner=owner)
    wait()
    save(staging)
    wait()
    if is_main:
        if complete is not None:
            complete(staging)
        checkpoints.commit_model(staging, run_dir)
    wait()


def training_record(
    session_metrics: Callable[[], dict[str, Any]],
    *,
    resumed_from: str | None,
    stepped: bool,
    before: RunTotals | None,
    global_step: int,
    samples: int,
    console: Console,
) -> dict[str, Any]:
    """The run's end-of-training metrics: over every segment of a resumed run, or the totals
    its checkpoint recorded when it resumed at its last step with nothing left to train."""
    if resumed_from is not None and not stepped:
        console.info("the checkpoint was already at the last step; finishing the run")
        metrics = recorded_totals(before)
    else:
        metrics = whole_run(session_metrics(), before, global_step)
    if metrics:
        metrics["train_samples"] = samples
    return metrics


def train_samples(dataset: Any, consumed: Callable[[], int]) -> int:
    """Training examples: the dataset's length, or for a stream the examples consumed."""
    if dataset is not None and hasattr(dataset, "__len__"):
        return len(dataset)
    return consumed()


def start_run_dir(run_dir: Path, spec: RunDirSpec, runtime: Runtime, console: Console) -> None:
    """In the main process, before the run's document is written: remove what
    ``--overwrite-output-dir`` replaces (saying what was kept), record the run's fast paths,
    and this segment of the run: a restart, or the command that started or continued it."""
    others = rundir.prepare_output_dir(spec)
    if others:
        console.info(
            f"--overwrite-output-dir: removed the earlier run's files; kept {len(others)} "
            f"entries lmctl did not write: {', '.join(others)}"
        )
    history.write_json(run_dir / history.FAST_PATHS_FILE, runtime.fast_paths.record())
    if restarted():
        record_restart(run_dir, runtime.resume, console)
    elif runtime.resume is None:
        history.record_segment(run_dir, card.command_line(), None, 0)
    else:
        step = checkpoints.checkpoint_step(runtime.resume)
        history.record_segment(run_dir, card.command_line(), runtime.resume.name, step)


def run_engine(
    loop: Callable[[StopRequest], EngineResult],
    run_dir: Path,
    *,
    is_main: bool,
    shown: str,
    objective: str,
    console: Console,
) -> EngineResult:
    """An engine's ``loop``, and what becomes of a run it could not finish: a non-finite loss,
    a full disk, a signal. ``shown``: the run as the user named it."""
    main = is_main
    trackers_existed = (run_dir / "runs").exists()
    with graceful_stop() as stop:
        try:
            result = loop(stop)
        except NonFiniteLoss as exc:
            console.stop_progress()
            if main:
                history.append_metrics(run_dir, {"event": "failed", "step": exc.step})
                write_loss_plot(run_dir, console)
            latest = checkpoints.latest_checkpoint(run_dir)
            kept = (
                f"the last good checkpoint is {latest}" if latest else "no checkpoint was saved yet"
            )
            raise TrainingFailed(
                f"training stopped: {exc}; {kept}",
                "lower --learning-rate, add --warmup-steps or --max-grad-norm, or check the data",
            ) from exc
        except Exception as exc:
            if isinstance(exc, LmctlError) or not atomic.no_space_left(exc, run_dir):
                raise
            raise disk_full(run_dir, exc) from exc
        finally:
            if main:
                history.record_trackers(run_dir, trackers_existed)
    if result.interrupted_at is None:
        return result
    if main:
        write_loss_plot(run_dir, console)
    if result.checkpoint is not None:
        raise Interrupted(
            f"interrupted by {stop.signal_name}; checkpoint saved at step "
            f"{result.interrupted_at} in {shown}",
            f"continue with: {resume_command(shown)}",
        )
    raise Interrupted(
        f"interrupted by {stop.signal_name} at step {result.interrupted_at}; "
        f"no checkpoint was saved in {shown}",
        f"start again with: {rundir.restart_command(objective, run_dir)}",
    )


def finish_run_dir(
    run_dir: Path,
    spec: RunSpec,
    objective: Objective,
    result: EngineResult,
    console: Console,
    *,
    model: Any,
    tokenizer: Any,
) -> dict[str, Any]:
    """The main process's end of a run: the adapter's files, the results, the model card, the
    loss plot and, last, the mark that the run finished."""
    if spec.adapter.peft is not None and spec.loop.do_train:
        from lmctl.models import adapters

        # The adapter's run directory also describes the architecture it adapts.
        model.config.save_pretrained(run_dir)
        if spec.adapter.merge_adapter:
            adapters.merge_adapter(run_dir, tokenizer, objective.auto_model_class(), console)
    if result.train_metrics:
        history.save_results(run_dir, "train", result.train_metrics)
    if result.eval_metrics:
        eval_metrics = dict(result.eval_metrics)
        if "eval_loss" in eval_metrics:
            eval_metrics.update(
                loss_metrics(
                    eval_metrics["eval_loss"], with_perplexity=objective.reports_perplexity
                )
            )
        history.save_results(run_dir, "eval", eval_metrics)
    results = history.load_results(run_dir)
    facts = card.CardFacts(spec.model, spec.data, spec.adapter, spec.optimizer, spec.loop)
    card.write_model_card(
        run_dir,
        facts,
        objective=objective,
        results=results,
        final_step=result.global_step if spec.loop.do_train else None,
    )
    write_loss_plot(run_dir, console)
    if spec.loop.do_train:
        # Last: a run killed before this line is resumed to write what it is missing.
        history.append_metrics(run_dir, {"event": "finished", "step": result.global_step})
    return results


def disk_full(run_dir: Path, exc: BaseException) -> TrainingFailed:
    """The run's file system is full: drop the half-written save (it frees the space it took)
    and name the checkpoint that is kept."""
    atomic.discard_staging(run_dir)
    latest = checkpoints.latest_checkpoint(run_dir)
    kept = f"the last good checkpoint is {latest.name}" if latest else "no checkpoint was saved"
    step = f"continue with: {resume_command(run_dir)}" if latest else "then start the run again"
    return TrainingFailed(
        f"no space left on the device of {run_dir} ({type(exc).__name__}); {kept}",
        f"free some space there (or move the run to a larger disk), {step}",
    )
