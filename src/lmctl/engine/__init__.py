"""One entry point for training, whichever engine runs the loop.

:func:`train` owns the run directory contract (config, results, model card) and the outcome
(success, interrupted, non-finite loss); an engine module only runs the loop and returns an
:class:`~lmctl.engine.lifecycle.EngineResult`; what both engines do around
their loops is :mod:`lmctl.engine.lifecycle`.

The engine layer may import pipeline, publish, objectives, run and everything below them.
"""

from __future__ import annotations

import contextlib
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.config.slices import slice_config
from lmctl.distributed import is_main_process
from lmctl.engine.lifecycle import NonFiniteLoss
from lmctl.errors import ConfigError, Interrupted, LmctlError, TrainingFailed
from lmctl.metrics import loss_metrics
from lmctl.mirror.fetch import sync_checkpoints
from lmctl.mirror.upload import mirror_for
from lmctl.run import card, checkpoints, history, rundir
from lmctl.run.plots import write_loss_plot
from lmctl.run.restarts import record_restart, restarted
from lmctl.run.resume import resume_command
from lmctl.run.runtime import resolve_runtime
from lmctl.run.signals import graceful_stop
from lmctl.storage import atomic

if TYPE_CHECKING:
    from lmctl.config.base import TrainConfig
    from lmctl.console import Console
    from lmctl.engine.lifecycle import EngineResult
    from lmctl.objectives.base import Objective
    from lmctl.pipeline import Prepared

ENGINES: dict[str, str] = {
    "trainer": "lmctl.engine.trainer",
    "accelerate": "lmctl.engine.accelerate",
}


def train(config: TrainConfig, objective: Objective, console: Console) -> dict[str, Any]:
    """Train as ``config`` says: the one place below the command line that reads the whole
    document, to write it into the run directory and to cut it into the slices that every
    layer below receives."""
    spec = slice_config(config, objective.options_class)
    engine = import_module(ENGINES[spec.loop.engine])
    engine.check(spec)  # trackers and engine packages, before any work
    main = is_main_process()
    publication = None
    if spec.publish.push_to is not None and main:
        from lmctl.publish.push import PushAfterTraining

        publication = PushAfterTraining(spec.publish, spec.access, console)
        publication.check()  # a permission problem fails now, not after training
    run_dir = rundir.local_run_dir(spec.run_dir)
    url = spec.run_dir.output_dir
    if rundir.per_machine_copies(spec.run_dir) and spec.run_dir.resume_from_checkpoint == "auto":
        assert url is not None
        sync_checkpoints(url, run_dir, console)
    mirror = mirror_for(spec.run_dir, run_dir, console, save_total_limit=spec.loop.save_total_limit)
    if mirror is not None:
        mirror.check()  # a permission problem, or another run there, fails now
    with mirror.uploading() if mirror is not None else contextlib.nullcontext():
        from lmctl.pipeline import prepare

        runtime = resolve_runtime(spec, run_dir, console)
        if spec.scale.fsdp and spec.loop.do_train and runtime.processes == 1:
            raise ConfigError(
                "--fsdp shards the model over several processes; this run has one",
                "add --nproc N (or start it with a launcher), or drop --fsdp",
            )
        # Data, tokenizer and model first: a run that fails to start leaves no directory.
        prepared = prepare(spec, runtime, objective, run_dir, console)
        if main:
            _clear_run_dir(prepared, console)
            rundir.write_config(run_dir, config)
            _record_start(prepared, console)
        # What the user named the run: its local folder, or the storage URL it is uploaded to.
        shown = str(url) if mirror is not None else str(run_dir)
        console.info(f"run directory: {shown}")
        result = _run_engine(engine, prepared, console, shown)
        if not main:
            return {"output_dir": shown, "global_step": result.global_step, "metrics": {}}
        results = _finish_run_dir(prepared, result, console)
        if mirror is not None:
            mirror.finish()
        outcome = {"output_dir": shown, "global_step": result.global_step, "metrics": results}
        if publication is not None:
            outcome["push"] = publication.push(run_dir)
        return outcome


def _clear_run_dir(prepared: Prepared, console: Console) -> None:
    """Remove what ``--overwrite-output-dir`` replaces (and say what was kept)."""
    others = rundir.prepare_output_dir(prepared.spec.run_dir)
    if others:
        console.info(
            f"--overwrite-output-dir: removed the earlier run's files; kept {len(others)} "
            f"entries lmctl did not write: {', '.join(others)}"
        )


def _record_start(prepared: Prepared, console: Console) -> None:
    """The run's fast paths, and a restart where this start is one."""
    run_dir = prepared.run_dir
    history.write_json(run_dir / history.FAST_PATHS_FILE, prepared.runtime.fast_paths.record())
    if restarted():
        record_restart(run_dir, prepared.runtime.resume, console)


def _run_engine(engine: Any, prepared: Prepared, console: Console, shown: str) -> EngineResult:
    """The engine's loop, and what becomes of a run it could not finish: a non-finite loss, a
    full disk, a signal."""
    run_dir, main = prepared.run_dir, prepared.runtime.is_main
    trackers_existed = (run_dir / "runs").exists()
    with graceful_stop() as stop:
        try:
            result: EngineResult = engine.run(prepared, console, stop)
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
            raise _disk_full(run_dir, exc) from exc
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
        f"start again with: {rundir.restart_command(prepared.spec.objective, run_dir)}",
    )


def _finish_run_dir(prepared: Prepared, result: EngineResult, console: Console) -> dict[str, Any]:
    """The main process's end of a run: the adapter's files, the results, the model card, the
    loss plot and, last, the mark that the run finished."""
    spec, run_dir, objective = prepared.spec, prepared.run_dir, prepared.objective
    if spec.adapter.peft is not None and spec.loop.do_train:
        from lmctl.models import adapters

        # The adapter's run directory also describes the architecture it adapts.
        prepared.model.config.save_pretrained(run_dir)
        if spec.adapter.merge_adapter:
            adapters.merge_adapter(
                run_dir, prepared.tokenizer, objective.auto_model_class(), console
            )
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
        resumed=result.resumed_from is not None,
    )
    write_loss_plot(run_dir, console)
    if spec.loop.do_train:
        # Last: a run killed before this line is resumed to write what it is missing.
        history.append_metrics(run_dir, {"event": "finished", "step": result.global_step})
    return results


def _disk_full(run_dir: Path, exc: BaseException) -> TrainingFailed:
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
