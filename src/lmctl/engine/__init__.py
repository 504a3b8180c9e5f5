"""One entry point for training, whichever engine runs the loop.

:func:`train` owns the run directory contract (config, results, model card) and the outcome
(success, interrupted, non-finite loss); an engine module only runs the loop and returns an
:class:`~lmctl.engine.common.EngineResult`.

The engine layer may import pipeline, publish, objectives, run and everything below them.
"""

from __future__ import annotations

import contextlib
from importlib import import_module
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.config.slices import (
    Access,
    AdapterSpec,
    DataSpec,
    LoopSpec,
    ModelSpec,
    OptimizerSpec,
    PublishSpec,
    RunDirSpec,
    take,
)
from lmctl.distributed import is_main_process, world_size
from lmctl.engine.common import NonFiniteLoss, check_world_size
from lmctl.errors import ConfigError, Interrupted, LmctlError, TrainingFailed
from lmctl.metrics import loss_metrics
from lmctl.mirror.fetch import sync_checkpoints
from lmctl.mirror.upload import mirror_for
from lmctl.run import card, checkpoints, history, rundir
from lmctl.run.plots import write_loss_plot
from lmctl.run.restarts import record_restart, restarted
from lmctl.run.resume import resume_command
from lmctl.run.signals import graceful_stop
from lmctl.storage import atomic

if TYPE_CHECKING:
    from lmctl.config.base import TrainConfig
    from lmctl.console import Console
    from lmctl.mirror.upload import RunMirror
    from lmctl.objectives.base import Objective
    from lmctl.publish.push import PushAfterTraining


def check_processes(config: TrainConfig) -> None:
    """Before any work: sharding needs several processes, and a checkpoint continues only on
    the number of processes that saved it."""
    if config.resume_from_checkpoint not in (None, "auto"):
        check_world_size(Path(config.resume_from_checkpoint))
    if config.fsdp and config.do_train and world_size() == 1:
        raise ConfigError(
            "--fsdp shards the model over several processes; this run has one",
            "add --nproc N (or start it with a launcher), or drop --fsdp",
        )


ENGINES: dict[str, str] = {
    "trainer": "lmctl.engine.trainer",
    "accelerate": "lmctl.engine.accelerate",
}


def train(config: TrainConfig, objective: Objective, console: Console) -> dict[str, Any]:
    engine = import_module(ENGINES[config.engine])
    engine.check(config)  # trackers and engine packages, before any work
    check_processes(config)
    main = is_main_process()
    publication = None
    if config.push_to is not None and main:
        from lmctl.publish.push import PushAfterTraining

        publication = PushAfterTraining(take(PublishSpec, config), take(Access, config), console)
        publication.check()  # a permission problem fails now, not after training
    run_dir = rundir.local_run_dir(take(RunDirSpec, config))
    if (
        rundir.per_machine_copies(take(RunDirSpec, config))
        and config.resume_from_checkpoint == "auto"
    ):
        assert config.output_dir is not None
        sync_checkpoints(config.output_dir, run_dir, console)
    mirror = mirror_for(
        take(RunDirSpec, config), run_dir, console, save_total_limit=config.save_total_limit
    )
    if mirror is not None:
        mirror.check()  # a permission problem, or another run there, fails now
    with mirror.uploading() if mirror is not None else contextlib.nullcontext():
        return _train(
            config,
            objective,
            console,
            engine,
            run_dir=run_dir,
            publication=publication,
            mirror=mirror,
        )


def _train(
    config: TrainConfig,
    objective: Objective,
    console: Console,
    engine: Any,
    *,
    run_dir: Path,
    publication: PushAfterTraining | None,
    mirror: RunMirror | None,
) -> dict[str, Any]:
    from lmctl.pipeline import prepare

    main = is_main_process()
    # What the user named the run: its local folder, or the storage URL it is uploaded to.
    shown = str(config.output_dir) if mirror is not None else str(run_dir)
    # Data, tokenizer and model first: a run that fails to start leaves no directory behind.
    prepared = prepare(config, objective, run_dir, console)
    if main:
        others = rundir.prepare_output_dir(take(RunDirSpec, config))
        if others:
            console.info(
                f"--overwrite-output-dir: removed the earlier run's files; kept {len(others)} "
                f"entries lmctl did not write: {', '.join(others)}"
            )
        rundir.write_config(run_dir, config)
        rundir.write_json(run_dir / rundir.FAST_PATHS_FILE, prepared.fast_paths.record())
        if restarted():
            record_restart(
                run_dir, checkpoints.resume_checkpoint(take(RunDirSpec, config), run_dir), console
            )
    console.info(f"run directory: {shown}")
    trackers_existed = (run_dir / "runs").exists()
    with graceful_stop() as stop:
        try:
            result = engine.run(prepared, console, stop)
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
    if result.interrupted_at is not None:
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
            f"start again with: {rundir.restart_command(config.objective, run_dir)}",
        )
    if not main:
        return {"output_dir": shown, "global_step": result.global_step, "metrics": {}}
    if config.peft is not None and config.do_train:
        from lmctl.models import adapters

        # The adapter's run directory also describes the architecture it adapts.
        prepared.model.config.save_pretrained(run_dir)
        if config.merge_adapter:
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
    card.write_model_card(
        run_dir,
        card.CardFacts(
            take(ModelSpec, config),
            take(DataSpec, config),
            take(AdapterSpec, config),
            take(OptimizerSpec, config),
            take(LoopSpec, config),
        ),
        objective=objective,
        results=results,
        resumed=result.resumed_from is not None,
    )
    write_loss_plot(run_dir, console)
    if main and config.do_train:
        # Last: a run killed before this line is resumed to write what it is missing.
        history.append_metrics(run_dir, {"event": "finished", "step": result.global_step})
    if mirror is not None:
        mirror.finish()
    outcome = {"output_dir": shown, "global_step": result.global_step, "metrics": results}
    if publication is not None:
        outcome["push"] = publication.push(run_dir)
    return outcome


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
