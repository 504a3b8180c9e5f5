"""One entry point for training, whichever engine runs the loop.

:func:`train` owns the run directory contract (config, results, model card) and the outcome
(success, interrupted, non-finite loss); an engine module only runs the loop and returns an
:class:`~lmctl.run.lifecycle.EngineResult`; what both engines do around
their loops is :mod:`lmctl.run.lifecycle`.

The engine layer may import pipeline, publish, objectives, run and everything below them.
"""

from __future__ import annotations

import contextlib
from functools import partial
from importlib import import_module
from typing import TYPE_CHECKING, Any

from lmctl.config.slices import slice_config
from lmctl.distributed import is_main_process, one_process_group
from lmctl.errors import ConfigError
from lmctl.mirror.fetch import sync_checkpoints
from lmctl.mirror.upload import mirror_for
from lmctl.run import datafiles, lifecycle, rundir, tracking
from lmctl.run.runtime import resolve_runtime

if TYPE_CHECKING:
    from lmctl.config.base import TrainConfig
    from lmctl.console import Console
    from lmctl.objectives.base import Objective

ENGINES: dict[str, str] = {
    "trainer": "lmctl.engine.trainer",
    "accelerate": "lmctl.engine.accelerate",
}


def train(config: TrainConfig, objective: Objective, console: Console) -> dict[str, Any]:
    """Train as ``config`` says: the one place below the command line that reads the whole
    document, to write it into the run directory and to cut it into the slices that every
    layer below receives."""
    spec = slice_config(config, objective.options_class)
    if spec.scale.deepspeed is not None:
        one_process_group()  # DeepSpeed starts a process group on one process too
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
        if runtime.batch is not None:
            # A restart on another number of processes: the same global batch, and the run
            # records the shape it goes on with.
            batch = runtime.batch
            config = config.model_copy(
                update={
                    "per_device_train_batch_size": batch.per_device,
                    "gradient_accumulation_steps": batch.accumulation,
                }
            )
            spec = slice_config(config, objective.options_class)
        chosen = "" if spec.compute.requested_precision != "auto" else " (--precision auto)"
        console.info(f"training in {runtime.precision or 'fp32'} on {runtime.device}{chosen}")
        if runtime.resume is not None:
            # Before any work: --strict-resume refuses a training file changed since the start.
            datafiles.check_train_files(
                runtime.resume,
                spec.data,
                strict=spec.run_dir.strict_resume,
                console=console if main else None,
            )
        if spec.scale.fsdp and runtime.device == "cpu" and main:
            console.warn(
                "--fsdp on CPU processes: Accelerate shards a model on accelerators (GPUs) only, "
                "so here every process keeps the whole model and training runs as DDP (the same "
                "updates, without FSDP's memory saving)"
            )
        if spec.scale.fsdp and spec.loop.do_train and runtime.processes == 1:
            raise ConfigError(
                "--fsdp shards the model over several processes; this run has one",
                "add --nproc N (or start it with a launcher), or drop --fsdp",
            )
        # Data, tokenizer and model first: a run that fails to start leaves no directory.
        prepared = prepare(spec, runtime, objective, run_dir, console)
        if main:
            lifecycle.start_run_dir(run_dir, spec.run_dir, runtime, console)
            rundir.write_config(run_dir, config)
            datafiles.record_train_files(run_dir, spec.data)
        # What the user named the run: its local folder, or the storage URL it is uploaded to.
        shown = str(url) if mirror is not None else str(run_dir)
        console.info(f"run directory: {shown}")
        report_to = spec.tracking.report_to
        tracking.default_stores(report_to, run_dir, spec.loop.engine, console if main else None)
        with tracking.tracker_failures():
            result = lifecycle.run_engine(
                partial(engine.run, prepared, console),
                run_dir,
                is_main=main,
                shown=shown,
                objective=spec.objective,
                console=console,
            )
        if not main:
            if mirror is not None:
                mirror.finish()  # this machine's part of the last checkpoints goes up first
            return {"output_dir": shown, "global_step": result.global_step, "metrics": {}}
        # A streamed mixture counts what training took; a mixture of datasets, what it holds.
        mixture, unit = (
            (result.mixture, "examples") if result.mixture else (prepared.mixture, "records")
        )
        if result.train_metrics and mixture:
            result.train_metrics.update(lifecycle.mixture_figures(mixture, unit))
        results = lifecycle.finish_run_dir(
            run_dir,
            spec,
            objective,
            result,
            console,
            model=prepared.model,
            tokenizer=prepared.tokenizer,
        )
        if mirror is not None:
            mirror.finish()
        outcome = {"output_dir": shown, "global_step": result.global_step, "metrics": results}
        if publication is not None:
            outcome["push"] = publication.push(run_dir)
        return outcome
