"""The ``accelerate`` engine: one plain training loop on ``accelerate.Accelerator``.

The counterpart of the upstream ``*_no_trainer.py`` scripts, shared by every objective: the
loop in :meth:`AccelerateRun.train` is the whole of training. It keeps the ``trainer``
engine's contracts, so that switching engines changes one flag and nothing else: the same log
and result keys, the same run directory (checkpoints written atomically with
``trainer_state.json`` last, the final model saved with ``save_pretrained``), graceful stop,
and a resume that continues exactly where the run stopped.

Runs under ``accelerate launch`` / ``torchrun`` as well; only the main process writes files
and logs.
"""

from __future__ import annotations

import logging
import math
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl import distributed
from lmctl.data.stream.positions import StreamRecord, stream_cursor
from lmctl.data.tokens import forked_workers
from lmctl.engine.accelerator import make_accelerator
from lmctl.engine.optim import (
    Plan,
    make_optimizer,
    make_plan,
    make_scheduler,
    place_schedule,
    record_schedule_start,
    schedule_start,
)
from lmctl.errors import ConfigError
from lmctl.evaluation.loop import evaluation_loop, training_scorer
from lmctl.run import checkpoints, history, rundir
from lmctl.run.lifecycle import (
    EngineResult,
    NonFiniteLoss,
    end_processes,
    evaluate_sources,
    length_sampler,
    save_checkpoint,
    save_final_model,
    stop_agreed,
    train_samples,
    trained_mixture,
    training_record,
)
from lmctl.run.progress import StepReporter
from lmctl.run.record import LoopRecord
from lmctl.run.signals import StopRequest
from lmctl.run.totals import BatchShape, RunTotals
from lmctl.run.tracking import TRACKING_PROJECT, check_trackers, tracked_hyperparameters

if TYPE_CHECKING:
    from lmctl.config.slices import RunSpec
    from lmctl.console import Console
    from lmctl.pipeline import Prepared

#: Where a checkpoint's ``trainer_state.json`` records the data position (under
#: ``stateful_callbacks``); its presence also marks a checkpoint of this engine.
DATA_POSITION = "AccelerateDataPosition"


def check(spec: RunSpec) -> None:
    """Refuse, before any work, trackers that Accelerate does not know or cannot load
    (Accelerate would skip them silently)."""
    from accelerate.tracking import get_available_trackers
    from accelerate.utils import LoggerType

    available = {tracker.value for tracker in get_available_trackers()}
    check_trackers(
        spec.tracking.report_to, set(LoggerType.list()), available, "the accelerate engine"
    )


def run(prepared: Prepared, console: Console, stop: StopRequest) -> EngineResult:
    logging.getLogger("accelerate").setLevel(logging.ERROR)
    session = AccelerateRun(prepared, console, stop)
    workers = prepared.spec.loop.dataloader_num_workers
    try:
        with forked_workers() if workers else nullcontext():
            return session.run()
    finally:
        session.close()


def _length(loader: Any) -> int | None:
    try:
        return len(loader)
    except TypeError:
        return None


class AccelerateRun:
    """One training (and/or evaluation) session: the loop and what it saves and logs."""

    def __init__(self, prepared: Prepared, console: Console, stop: StopRequest) -> None:
        from accelerate.utils import set_seed

        self.prepared = prepared
        spec = prepared.spec
        self.loop = loop = spec.loop
        self.run_dir = prepared.run_dir
        self.console = console
        self.stop = stop
        self.accelerator = make_accelerator(spec, prepared.runtime, self.run_dir)
        self.is_main = bool(self.accelerator.is_main_process)
        #: Renames each checkpoint into place (see lmctl.run.rundir.commits_checkpoints).
        self.commits_checkpoints = rundir.commits_checkpoints(spec.run_dir)
        self.reporter = StepReporter(
            console, self.run_dir, stop, is_main=self.is_main, streaming=spec.data.streaming
        )
        if spec.tracking.report_to:
            self.accelerator.init_trackers(
                TRACKING_PROJECT,
                config=tracked_hyperparameters(spec),
                init_kwargs={
                    "wandb": {"name": self.run_dir.name},
                    "mlflow": {"run_name": self.run_dir.name},
                    "trackio": {"name": self.run_dir.name},
                },
            )
        set_seed(loop.seed)
        self.record = LoopRecord(self.accelerator, prepared.model, self.reporter)
        self.state = self.record.state
        self.model: Any = prepared.model
        self.optimizer: Any = None
        self.scheduler: Any = None
        self.eval_loader: Any = None
        #: The run's training totals before this session (None: unknown).
        self._totals_before: RunTotals | None = RunTotals()
        # Loop bookkeeping: losses are floats averaged over processes, one per optimizer step.
        self._start = time.time()
        self._position = (0, 0)
        #: With --streaming: where each dataloader worker of this process is in the stream.
        self._cursor = stream_cursor(self.prepared.train_dataset)
        self._window_loss: Any = 0.0
        self._step_loss = 0.0
        self._loss_since_log = 0.0
        self._steps_since_log = 0
        self._total_loss = 0.0
        self._session_steps = 0
        self._grad_norm: float | None = None
        self._learning_rate = 0.0
        self._preparation_time: float | None = None  # reported by an evaluation-only run
        self._eval_count = 0  # examples seen by the last evaluation
        self._schedule_start = 0  # the step the learning-rate schedule started at
        #: The step of the last evaluation and its record (the final one reuses it).
        self._evaluated: tuple[int, dict[str, Any]] | None = None

    def close(self) -> None:
        """Finish the trackers and the process group, the distributed model first."""
        self.model = self.optimizer = self.scheduler = self.eval_loader = None
        end_processes(self.accelerator)

    # The loop --------------------------------------------------------------------------------
    def run(self) -> EngineResult:
        loop = self.loop
        result = EngineResult()
        if loop.do_train:
            result = self.train()
            if result.interrupted_at is None and self.stop.requested:
                result.interrupted_at = self.state.global_step
                result.checkpoint = checkpoints.latest_checkpoint(self.run_dir)
            if result.interrupted_at is not None:
                return result
        elif loop.do_eval:
            start = time.time()
            self.model, self.eval_loader = self.accelerator.prepare(
                self.model, self._loader(self.prepared.eval_dataset, train=False)
            )
            self._preparation_time = round(time.time() - start, 4)
        if loop.do_eval and self.prepared.eval_dataset is not None:
            self.reporter.end()
            done = self._evaluated  # at the last step already: the same weights, once
            at_end = done is not None and done[0] == self.state.global_step
            result.eval_metrics = dict(done[1]) if done and at_end else self.evaluate()
            size = _length(self.prepared.eval_dataset)  # a stream has none: count what was seen
            result.eval_metrics["eval_samples"] = size if size is not None else self._eval_count
            result.eval_metrics.update(evaluate_sources(self.prepared, self.evaluate))
        if loop.do_train and self.is_main:
            history.write_state(self.state, self.run_dir)
        elif self.is_main:
            checkpoints.save_tokenizer(self.prepared.tokenizer, self.run_dir)
        result.global_step = self.state.global_step
        return result

    def train(self) -> EngineResult:
        acc, loop, state = self.accelerator, self.loop, self.state
        spec, runtime = self.prepared.spec, self.prepared.runtime
        optimizer = make_optimizer(
            spec.optimizer, loop.training_args, self.model, fused=runtime.fast_paths.fused_adamw()
        )
        self.model, self.optimizer, train_loader, self.eval_loader = acc.prepare(
            self.model,
            optimizer,
            self._loader(self.prepared.train_dataset, train=True),
            self._loader(self.prepared.eval_dataset, train=False),
        )
        plan = make_plan(loop, _length(train_loader))
        restart = spec.optimizer.restart_schedule
        start = schedule_start(runtime.resume, restart, self.console if self.is_main else None)
        self._schedule_start = start
        scheduler = make_scheduler(
            spec.optimizer, loop.training_args, self.optimizer, plan.max_steps - start
        )
        self.scheduler = acc.prepare(scheduler)
        self._init_state(plan)
        checkpoint = None if runtime.resume is None else str(runtime.resume)
        epoch, batches_done = self._restore(checkpoint) if checkpoint else (0, 0)
        self._announce(plan)
        self._start = time.time()
        self.reporter.begin(plan.max_steps, state.global_step, state.num_input_tokens_seen)
        self.model.train()
        while epoch < plan.epochs and state.global_step < plan.max_steps:
            stepped = False
            for index, batch in self._batches(train_loader, epoch, batches_done):
                if not self._micro_step(batch, index, plan):
                    continue  # gradients are still accumulating
                stepped = True
                self._position = plan.position_after(epoch, index + 1)
                state.epoch = plan.epoch_progress(epoch, index + 1)
                saved = self._log_evaluate_save(plan)
                if stop_agreed(acc, self.stop):
                    self.reporter.end()
                    return EngineResult(
                        global_step=state.global_step,
                        resumed_from=checkpoint,
                        interrupted_at=state.global_step,
                        checkpoint=saved or self.save_checkpoint(),
                    )
                if state.global_step >= plan.max_steps:
                    break
            else:
                self._position = (epoch + 1, 0)  # the epoch's data is used up
            if stepped and loop.eval_strategy == "epoch":
                self._evaluate_during_training()
            if stepped and loop.save_strategy == "epoch":
                self.save_checkpoint()
            epoch, batches_done = epoch + 1, 0
        train_metrics = training_record(
            self._train_metrics,
            resumed_from=checkpoint,
            stepped=self._session_steps > 0,
            before=self._totals_before,
            global_step=state.global_step,
            samples=train_samples(self.prepared.train_dataset, self.record.run_samples),
            console=self.console,
        )
        self.reporter.end()
        self._save_model()
        mixture = trained_mixture(self._cursor, acc)
        return EngineResult(
            train_metrics, global_step=state.global_step, resumed_from=checkpoint, mixture=mixture
        )

    def _batches(self, loader: Any, epoch: int, batches_done: int) -> Any:
        """The epoch's batches, numbered, after the ``batches_done`` consumed before a resume."""
        from accelerate import skip_first_batches

        loader.set_epoch(epoch)
        loader.collate_fn.epoch = epoch
        if self._cursor is not None:
            self._cursor.begin_pass(epoch)
        if skip := batches_done if self._cursor is None else self._cursor.skipped(batches_done):
            loader = skip_first_batches(loader, skip)
        return enumerate(distributed.evened(loader, self.accelerator), start=batches_done)

    def _micro_step(self, batch: dict[str, Any], index: int, plan: Plan) -> bool:
        """Forward and backward one batch; at the end of an accumulation window, clip and step
        the optimizer and scheduler. Returns whether an optimizer step was made."""
        acc = self.accelerator
        weight = self._window_weight(index, plan)
        if self._cursor is not None:
            self._cursor.take(batch)
        with acc.accumulate(self.model):
            loss = self.model(**batch).loss
            acc.backward(loss * weight)
            self._window_loss += loss.detach().float() * weight / acc.gradient_accumulation_steps
            self.record.count(batch)
            if acc.sync_gradients:
                self._step_loss = self._finite_mean(self._window_loss, self.state.global_step + 1)
                self._grad_norm = self._clip()
                self._learning_rate = self.optimizer.param_groups[0]["lr"]
            self.optimizer.step()
            if acc.sync_gradients and not acc.optimizer_step_was_skipped:
                self._step_scheduler()
            self.optimizer.zero_grad()
        if not acc.sync_gradients:
            return False
        self._window_loss = 0.0
        self.state.global_step += 1
        self._session_steps += 1
        self._loss_since_log += self._step_loss
        self._steps_since_log += 1
        return True

    def _log_evaluate_save(self, plan: Plan) -> Path | None:
        """After an optimizer step, in the Trainer's order: progress and log, evaluation,
        checkpoint (also at the last step). Returns the checkpoint saved, if any."""
        state, loop = self.state, self.loop
        last = state.global_step >= plan.max_steps
        self.reporter.step(state.global_step, state.epoch, self.record.tokens_estimate())
        if state.global_step % plan.logging_steps == 0:
            self._total_loss += self._loss_since_log
            logs = {
                "loss": self._loss_since_log / self._steps_since_log,
                "grad_norm": self._grad_norm,
                "learning_rate": self._learning_rate,
            }
            self.record.log(logs, train_start=self._start)
            self._loss_since_log, self._steps_since_log = 0.0, 0
        if (
            loop.eval_strategy == "steps"
            and plan.eval_steps
            and (state.global_step % plan.eval_steps == 0 or last)
        ):
            self._evaluate_during_training()
        if loop.save_strategy == "steps" and (state.global_step % plan.save_steps == 0 or last):
            return self.save_checkpoint()
        return None

    def _window_weight(self, index: int, plan: Plan) -> float:
        """Scale making an epoch's last, shorter accumulation window a mean over its own
        batches (Accelerate divides every loss by the full accumulation count)."""
        accumulation = self.loop.gradient_accumulation_steps
        if plan.batches_per_epoch is None or accumulation == 1:
            return 1.0
        tail = plan.batches_per_epoch % accumulation
        if tail and index >= plan.batches_per_epoch - tail:
            return accumulation / tail
        return 1.0

    def _finite_mean(self, window_loss: Any, step: int) -> float:
        """The window's loss averaged over processes; a non-finite one stops training before
        the optimizer step can spoil the weights."""
        import torch

        mean = float(self.accelerator.reduce(torch.as_tensor(window_loss), "mean"))
        if not math.isfinite(mean):
            raise NonFiniteLoss(step, mean)
        return mean

    def _clip(self) -> float | None:
        """Clip to --max-grad-norm (0: no clipping) and return the norm before clipping."""
        limit = self.prepared.spec.optimizer.max_grad_norm or math.inf
        norm = self.accelerator.clip_grad_norm_(self.model.parameters(), limit)
        return None if norm is None else float(norm)

    def _step_scheduler(self) -> None:
        from torch.optim.lr_scheduler import ReduceLROnPlateau

        if not isinstance(self.scheduler.scheduler, ReduceLROnPlateau):
            self.scheduler.step()

    # Building blocks -------------------------------------------------------------------------
    def _loader(self, dataset: Any, *, train: bool) -> Any:
        """A DataLoader with its own seeded generator, so building one never draws from the
        global RNG (which a resumed run restores exactly). The objective's collator sees every
        column its preprocessing kept and returns the model's inputs."""
        import torch
        from torch.utils.data import DataLoader, IterableDataset

        if dataset is None:
            return None
        loop = self.loop
        collator = self.prepared.collator if train else self.prepared.eval_collator
        batch_size = loop.per_device_train_batch_size if train else loop.per_device_eval_batch_size
        window = batch_size * loop.gradient_accumulation_steps
        sampler = length_sampler(self.prepared.train_lengths if train else None, window, loop.seed)
        return DataLoader(
            dataset,
            batch_size=batch_size,
            sampler=sampler,
            shuffle=train and sampler is None and not isinstance(dataset, IterableDataset),
            collate_fn=collator,
            num_workers=loop.dataloader_num_workers,
            pin_memory=torch.cuda.is_available(),
            generator=torch.Generator().manual_seed(loop.seed),
        )

    def _unwrapped(self) -> Any:
        return self.accelerator.unwrap_model(self.model)

    def _announce(self, plan: Plan) -> None:
        if not self.is_main:
            return
        acc, loop = self.accelerator, self.loop
        total = (
            loop.per_device_train_batch_size * acc.num_processes * loop.gradient_accumulation_steps
        )
        per_epoch = (
            f"{plan.batches_per_epoch} batches per epoch, " if plan.batches_per_epoch else ""
        )
        self.console.info(
            f"accelerate: {acc.num_processes} process(es) on {acc.device.type}, "
            f"mixed precision {acc.mixed_precision}, {per_epoch}total batch size {total}"
        )

    # Counting and logging --------------------------------------------------------------------
    def _train_metrics(self) -> dict[str, Any]:
        """The Trainer's end-of-training record; ``train_loss`` averages this session's steps."""
        from transformers.trainer_utils import speed_metrics

        totals = self.record.totals()
        steps = self._session_steps
        metrics = speed_metrics(
            "train", self._start, num_samples=totals["samples"], num_steps=steps
        )
        metrics["total_flos"] = self.state.total_flos
        metrics["train_loss"] = (self._total_loss + self._loss_since_log) / max(steps, 1)
        return self.record.log(metrics)

    # Evaluation ------------------------------------------------------------------------------
    def evaluate(self, dataset: Any = None, prefix: str = "eval") -> dict[str, Any]:
        """Eval loss and the objective's metrics of ``dataset`` (default: the validation split)
        under ``prefix``, in the one loop (:mod:`lmctl.evaluation.loop`), as scored there."""
        from transformers.trainer_utils import speed_metrics

        acc, objective = self.accelerator, self.prepared.objective
        metrics = objective.metrics()
        score = training_scorer(acc, self.model, objective, metrics, is_main=self.is_main)
        start = time.time()
        self.model.eval()
        loader = self.eval_loader if dataset is None else self._loader(dataset, train=False)
        loader = loader if dataset is None else acc.prepare(loader)
        steps = _length(loader)
        tally = evaluation_loop(
            distributed.evened(loader, acc),
            score,
            lambda step: self.reporter.eval_step(step, steps),
        )
        self._eval_count = count = tally.samples
        self.reporter.end_eval(count)
        self.model.train()
        results: dict[str, Any] = {f"{prefix}_loss": tally.loss}
        if self.is_main:
            results.update({f"{prefix}_{key}": value for key, value in metrics.compute().items()})
        if self._preparation_time is not None:
            results["eval_model_preparation_time"] = self._preparation_time
        total_batch = self.loop.per_device_eval_batch_size * acc.num_processes
        results.update(
            speed_metrics(
                prefix, start, num_samples=count, num_steps=math.ceil(count / total_batch)
            )
        )
        return self.record.log(results)

    def _evaluate_during_training(self) -> None:
        from torch.optim.lr_scheduler import ReduceLROnPlateau

        if self.eval_loader is None:
            return
        results = self.evaluate()
        self._evaluated = (self.state.global_step, results)
        if isinstance(self.scheduler.scheduler, ReduceLROnPlateau):
            self.scheduler.scheduler.step(results["eval_loss"])

    # Checkpoints and the final model ---------------------------------------------------------
    def _init_state(self, plan: Plan) -> None:
        state = self.state
        state.max_steps = plan.max_steps
        state.num_train_epochs = plan.epochs if plan.batches_per_epoch else 0
        state.logging_steps = plan.logging_steps
        state.eval_steps = plan.eval_steps or state.eval_steps
        state.save_steps = plan.save_steps
        state.train_batch_size = self.loop.per_device_train_batch_size

    def save_checkpoint(self) -> Path:
        """``checkpoint-<step>`` (see ``lifecycle.save_checkpoint``): Accelerate's full state
        (model, optimizer, scheduler, RNG of every process; with ``save_only_model`` the
        model's weights alone) and each process's stream position, the model config and
        tokenizer (so the folder loads with ``from_pretrained``), then ``trainer_state.json``
        with the data position, last."""
        acc, state = self.accelerator, self.state
        self.record.totals()
        epoch, batches_done = self._position
        # Not a callback: TrainerState keeps this mapping as is (it is typed as a list), and
        # the Trainer ignores names it does not know.
        extra: Any = state.stateful_callbacks or {}
        extra[DATA_POSITION] = {"epoch": epoch, "batches_done": batches_done}
        record_schedule_start(extra, self._schedule_start)
        state.stateful_callbacks = extra

        def write_parts(staging: Path) -> None:
            if self.loop.training_args.get("save_only_model"):
                acc.save_model(self.model, str(staging))
            else:
                acc.save_state(str(staging))
            if self._cursor is not None:
                record = StreamRecord.of(epoch, batches_done, self._cursor)
                record.write(staging, acc.process_index)

        def write_state(staging: Path) -> None:
            model = self._unwrapped()
            model.config.save_pretrained(staging)
            if getattr(model, "generation_config", None) is not None and model.can_generate():
                model.generation_config.save_pretrained(staging)
            self.prepared.tokenizer.save_pretrained(staging)
            BatchShape.of(self.loop, self.accelerator.num_processes).record(state)
            if self._totals_before is not None:
                self._totals_before.then(
                    state.global_step,
                    self._total_loss + self._loss_since_log,
                    time.time() - self._start,
                ).record(state)
            history.write_state(state, staging)

        return save_checkpoint(
            self.run_dir,
            state.global_step,
            owner="accelerate",
            commits=self.commits_checkpoints,
            writes_state=self.is_main,
            wait=acc.wait_for_everyone,
            write_parts=write_parts,
            write_state=write_state,
            limit=self.loop.save_total_limit,
        )

    def _restore(self, checkpoint: str) -> tuple[int, int]:
        """Load a checkpoint's state (of a model-only one, the weights); returns the data
        position to continue from."""
        from accelerate.utils import set_seed
        from transformers import TrainerState

        acc = self.accelerator
        path = Path(checkpoint)
        state_file = path / history.STATE_FILE
        saved = TrainerState.load_from_json(str(state_file)) if state_file.is_file() else None
        position = (saved.stateful_callbacks or {}).get(DATA_POSITION) if saved else None
        if saved is None or position is None:
            raise ConfigError(
                f"--resume-from-checkpoint {checkpoint}: not a checkpoint of the accelerate engine",
                "resume it with the engine that wrote it (--engine trainer), or start a new run",
            )
        batch_size = self.loop.per_device_train_batch_size
        shape, now = BatchShape.of_checkpoint(path), BatchShape.of(self.loop, acc.num_processes)
        done = int(position["batches_done"])
        if shape is not None and shape != now:
            # Another number of processes with the same global batch (``resume.plan_resume``):
            # the same samples of the epoch are consumed, counted in this world's batches.
            done = done * shape.per_device * shape.processes // (now.per_device * now.processes)
        elif saved.train_batch_size not in (None, batch_size):
            self.console.warn(
                f"the checkpoint was trained with batch size {saved.train_batch_size}, not "
                f"{batch_size}: the data order will not continue exactly"
            )
        full = checkpoints.holds_training_state(path)
        if full:
            acc.load_state(str(path))
        else:
            checkpoints.load_weights(self._unwrapped(), path)
        state = self.state
        state.global_step = saved.global_step
        state.epoch = saved.epoch
        state.log_history = saved.log_history
        self.record.restore(saved, samples_per_step=now.size)
        self._totals_before = RunTotals.of_checkpoint(checkpoint)
        self._position = (int(position["epoch"]), done)
        if shape is not None and shape.processes != now.processes:
            # The saved random states are per process: re-derived from the seed and the step.
            set_seed(self.loop.seed + state.global_step + acc.process_index)
        restored = full and not self.prepared.spec.optimizer.restart_schedule
        place_schedule(
            self.scheduler.scheduler, None if restored else state.global_step - self._schedule_start
        )
        recorded = StreamRecord.gather(path, acc.process_index, acc.num_processes)
        if recorded is not None:
            recorded.continue_in(self._cursor)
        return self._position

    def _save_model(self) -> None:
        """The final model and tokenizer, as ``save_pretrained`` writes them (loadable by
        plain transformers; see ``lifecycle.save_final_model``)."""
        acc = self.accelerator

        def save(staging: Path) -> None:
            self._unwrapped().save_pretrained(
                staging,
                is_main_process=self.is_main,
                save_function=acc.save,
                state_dict=acc.get_state_dict(self.model),
            )

        save_final_model(
            self.run_dir,
            owner="accelerate",
            is_main=self.is_main,
            wait=acc.wait_for_everyone,
            save=save,
            complete=self.prepared.tokenizer.save_pretrained,
        )
