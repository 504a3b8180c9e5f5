"""The ``trainer`` engine: the transformers ``Trainer``, wired to lmctl's run lifecycle."""

from __future__ import annotations

import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl import distributed, secrets
from lmctl.data.stream.positions import StreamCursor, StreamRecord, stream_cursor
from lmctl.data.tokens import forked_workers
from lmctl.engine.optim import place_schedule, record_schedule_start, schedule_start
from lmctl.engine.sharding import trainer_options
from lmctl.engine.trainer_eval import final_figures, in_memory_evaluation
from lmctl.errors import ConfigError
from lmctl.objectives.collate import SeededCollator
from lmctl.run import checkpoints, history, rundir
from lmctl.run.lifecycle import (
    EngineResult,
    check_finite,
    end_processes,
    length_sampler,
    save_checkpoint,
    save_final_model,
    stop_agreed,
    train_samples,
    trained_mixture,
    training_record,
)
from lmctl.run.progress import StepReporter
from lmctl.run.signals import StopRequest
from lmctl.run.totals import BatchShape, RunTotals
from lmctl.run.tracking import TRACKING_PROJECT, check_trackers, mlflow_run
from lmctl.storage.paths import local_folder

if TYPE_CHECKING:
    from lmctl.config.slices import RunSpec
    from lmctl.console import Console
    from lmctl.objectives.base import Objective
    from lmctl.pipeline import Prepared
    from lmctl.run.runtime import Runtime


def check(spec: RunSpec) -> None:
    """Refuse, before any work, trackers the Trainer does not know or cannot load, and a
    DeepSpeed config without DeepSpeed."""
    import importlib.util

    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_available_reporting_integrations,
    )

    known, available = set(INTEGRATION_TO_CALLBACK), set(get_available_reporting_integrations())
    check_trackers(spec.tracking.report_to, known, available, "the Trainer")
    if spec.loop.training_args.get("deepspeed") and importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(
            "training_args.deepspeed: DeepSpeed is not installed",
            "pip install deepspeed, or remove training_args.deepspeed",
        )


def training_arguments(spec: RunSpec, runtime: Runtime, run_dir: Path) -> Any:
    """The Trainer's arguments for a run: its slices, and its runtime's precision, device and
    choice of optimizer (torch's fused AdamW where the fast paths chose it)."""
    from transformers import TrainingArguments

    loop, optimizer, precision = spec.loop, spec.optimizer, runtime.precision
    warmup = optimizer.warmup_steps if optimizer.warmup_ratio is None else optimizer.warmup_ratio
    values: dict[str, Any] = {
        "output_dir": str(run_dir),
        "per_device_train_batch_size": loop.per_device_train_batch_size,
        "per_device_eval_batch_size": loop.per_device_eval_batch_size,
        "learning_rate": optimizer.learning_rate,
        "weight_decay": optimizer.weight_decay,
        "num_train_epochs": loop.num_train_epochs,
        "max_steps": loop.max_steps or -1,
        "gradient_accumulation_steps": loop.gradient_accumulation_steps,
        "lr_scheduler_type": optimizer.lr_scheduler_type,
        "warmup_steps": warmup,
        "max_grad_norm": optimizer.max_grad_norm,
        "seed": loop.seed,
        "bf16": precision == "bf16",
        "fp16": precision == "fp16",
        "torch_compile": spec.compute.torch_compile,
        "dataloader_num_workers": loop.dataloader_num_workers,
        "logging_strategy": "steps",
        "logging_steps": loop.logging_steps,
        "eval_strategy": loop.eval_strategy,
        "eval_steps": loop.eval_steps,
        "save_strategy": loop.save_strategy,
        "save_steps": loop.save_steps,
        # Rotation is lmctl's own (see LmctlTrainer._save_checkpoint): the Trainer's would
        # delete the newest checkpoint at the end of a run with --save-total-limit 1.
        "save_total_limit": None,
        "report_to": spec.tracking.report_to or "none",
        "run_name": run_dir.name,
        "project": TRACKING_PROJECT,
        "do_train": loop.do_train,
        "do_eval": loop.do_eval,
        "disable_tqdm": True,
        "batch_eval_metrics": True,
        "include_num_input_tokens_seen": True,
        "log_level": "error",
        "dataloader_pin_memory": runtime.device != "cpu",
        # Objectives' preprocessing keeps exactly the columns their collators read
        # (special-tokens masks, offsets), which are not model arguments.
        "remove_unused_columns": False,
    }
    if runtime.fast_paths.fused_adamw():
        values["optim"] = "adamw_torch_fused"
    if runtime.cpu_only:
        values["use_cpu"] = True
    values.update(trainer_options(spec.scale, spec.model.gradient_checkpointing, runtime))
    values.update(loop.training_args)
    if isinstance(values.get("logging_dir"), str):
        values["logging_dir"] = local_folder(values["logging_dir"])  # file:///abs is /abs
    if spec.data.streaming:
        # Each rank reads its own shards of the stream (accelerate shards a datasets
        # IterableDataset by its shard list); the default for iterable data, dispatch_batches,
        # would have rank 0 read everything and send slices to the others.
        accelerator = dict(values.get("accelerator_config") or {})
        accelerator.setdefault("dispatch_batches", False)
        values["accelerator_config"] = accelerator
    try:
        return TrainingArguments(**values)
    except TypeError as exc:
        raise ConfigError(
            f"training_args: {exc}",
            "remove keys that this transformers version's TrainingArguments does not accept",
        ) from exc
    except ValueError as exc:
        raise ConfigError(f"invalid training settings: {exc}", "adjust the flags named") from exc


def _loss_uses_item_count(model: Any) -> bool:
    """Whether ``model``'s forward computes its loss with the item count the Trainer hands it
    (``num_items_in_batch``, through transformers' ``loss_function``) rather than as the mean
    over its own batch. Read from the source of the forward (a PEFT wrapper's base model's);
    where no source can be read, the Trainer's own assumption stands."""
    import inspect

    base = model.get_base_model() if hasattr(model, "get_base_model") else model
    try:
        source = inspect.getsource(type(base).forward)
    except (OSError, TypeError):
        return True
    return "loss_function" in source or "num_items_in_batch" in source


def _make_trainer_class() -> type:
    import torch
    from transformers import Trainer
    from transformers.trainer_callback import ExportableState
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR, has_length

    class LmctlTrainer(Trainer):
        """Stops on a non-finite loss, evaluates with the objective's eval collator, and
        writes checkpoints atomically."""

        eval_collator: Any = None
        #: Examples seen by the last evaluation (streams have no length to read it from).
        eval_samples: int = 0
        #: The step of the last evaluation and its metrics (the final one reuses them).
        evaluated: tuple[int, dict[str, float]] | None = None
        #: The run's objective: evaluations score as ``lmctl eval`` does where they can.
        objective: Objective | None = None
        #: With --streaming, the StreamPosition callback that checkpoints record.
        stream_position: Any = None
        save_total_limit: int | None = None
        #: Whether this process renames each checkpoint into place (see
        #: lmctl.run.rundir.commits_checkpoints): the main process writes the trainer state,
        #: the first process of another machine commits that machine's part.
        commits_checkpoints: bool = False
        #: Tokens per training sample, to batch samples of similar length together.
        train_lengths: list[int] | None = None
        #: The run's training totals before this session (None: unknown).
        run_totals: RunTotals | None = RunTotals()
        _session_start = 0.0
        #: The step the learning-rate schedule started at (see lmctl.engine.optim).
        schedule_start = 0
        restart_schedule = False

        def __init__(self, *args: Any, **kwargs: Any) -> None:
            super().__init__(*args, **kwargs)
            # The Trainer normalises the loss by a label count that it takes over labels[1:]
            # only when the model class names its loss type; GPT-2's *LMHeadModel does not,
            # yet falls back to the shifting causal-LM loss, so eval_loss (and perplexity)
            # came out (L-1)/L too low. Count what the loss actually averages over.
            from transformers.loss.loss_utils import ForCausalLMLoss

            model = self.accelerator.unwrap_model(self.model)
            if (
                getattr(model, "loss_type", "") is None
                and getattr(model, "loss_function", None) is ForCausalLMLoss
                and not getattr(model.config, "is_encoder_decoder", False)
            ):
                self._loss_shifts_labels = True
            if self.model_accepts_loss_kwargs and not _loss_uses_item_count(model):
                # The Trainer multiplies the loss by the number of processes whenever the
                # forward takes **kwargs, expecting the model to divide by the item count of
                # all processes; a model that averages its own batch (BERT's masked LM, every
                # multiple-choice head) then reports, and back-propagates, the loss times the
                # number of processes. Such a model's own mean is the right loss.
                self.model_accepts_loss_kwargs = False

        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            """The Trainer's checkpoint, written as every checkpoint of lmctl is (see
            ``lifecycle.save_checkpoint``), each process's part into its machine's copy."""
            if self.hp_search_backend is None and trial is None:
                self.store_flos()
            run_dir = Path(self._get_output_dir(trial=trial))
            best_step = self.state.best_global_step
            if best_step and self.args.save_strategy != "no":
                best = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{best_step}"
                if best_step == self.state.global_step or best.is_dir():
                    self.state.best_model_checkpoint = str(best)
            best_checkpoint = self.state.best_model_checkpoint
            final = save_checkpoint(
                run_dir,
                self.state.global_step,
                owner="trainer",
                commits=self.commits_checkpoints,
                writes_state=self.args.should_save,
                wait=self.accelerator.wait_for_everyone,
                write_parts=self._write_parts,
                write_state=self._write_state,
                limit=self.save_total_limit,
                protect=[Path(best_checkpoint)] if best_checkpoint else [],
            )
            if self.args.push_to_hub:
                self._push_from_checkpoint(str(final))

        def _write_parts(self, staging: Path) -> None:
            self.save_model(str(staging), _internal_call=True)
            if not self.args.save_only_model:
                self._save_optimizer_and_scheduler(str(staging))
                self._save_scaler(str(staging))
                self._save_rng_state(str(staging))
            if self.stream_position is not None:
                self.stream_position.write(staging, self.args.process_index)

        def _write_state(self, staging: Path) -> None:
            """The callbacks' states and the run's totals, into ``trainer_state.json``."""
            stateful: Any = self.state.stateful_callbacks
            for cb in [*self.callback_handler.callbacks, self.control]:
                if isinstance(cb, ExportableState):
                    name = cb.__class__.__name__
                    if isinstance(stateful.get(name), list):
                        stateful[name].append(cb.state())
                    else:
                        stateful[name] = cb.state()
            record_schedule_start(stateful, self.schedule_start)
            BatchShape.of(self.args, self.args.world_size).record(self.state)
            if self.run_totals is not None:
                session_loss = self._total_loss_scalar + float(self._tr_loss.item())
                self.run_totals.then(
                    self.state.global_step, session_loss, time.time() - self._session_start
                ).record(self.state)
            history.write_state(self.state, staging)

        def create_scheduler(self, num_training_steps: int, optimizer: Any = None) -> Any:
            """The schedule spans from its start (0, or a restart's step) to the last step."""
            return super().create_scheduler(num_training_steps - self.schedule_start, optimizer)

        def _load_optimizer_and_scheduler(self, checkpoint: str | None) -> None:
            super()._load_optimizer_and_scheduler(checkpoint)
            if checkpoint is None or self.is_deepspeed_enabled:
                return
            restored = checkpoints.holds_training_state(Path(checkpoint))
            steps = self.state.global_step - self.schedule_start
            place_schedule(
                self.lr_scheduler, None if restored and not self.restart_schedule else steps
            )

        def _get_train_sampler(self, train_dataset: Any = None) -> Any:
            window = self.args.train_batch_size * self.args.gradient_accumulation_steps
            sampler = length_sampler(self.train_lengths, window, self.args.seed)
            return super()._get_train_sampler(train_dataset) if sampler is None else sampler

        def _save(self, output_dir: str | None = None, state_dict: Any = None) -> None:
            """The Trainer's save, with ``training_args.bin`` written without secrets."""
            super()._save(output_dir, state_dict)
            if self.args.should_save:
                from transformers.trainer import TRAINING_ARGS_NAME

                folder = Path(str(output_dir if output_dir is not None else self.args.output_dir))
                torch.save(secrets.cleared(self.args), folder / TRAINING_ARGS_NAME)

        def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            """One micro-batch; a non-finite loss on any process stops every process (before
            the optimizer step can spoil the weights, and without leaving one waiting)."""
            if self.stream_position is not None and self.stream_position.cursor is not None:
                self.stream_position.cursor.take(inputs)
            loss = super().training_step(model, inputs, num_items_in_batch)
            check_finite(self.accelerator, loss, self.state.global_step + 1)
            return loss

        def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
            """The next accumulation window's batches; with a stream on several processes,
            as many on each as the process with the fewest has (streams split by shards
            end at different points, and a process that ran out would leave the others
            blocked in a gradient all-reduce)."""
            if self.args.world_size == 1 or has_length(self.train_dataset):
                return super().get_batch_samples(epoch_iterator, num_batches, device)
            # Counted after the cut, on every process: counting gathers across processes
            # when there is a batch, and a process with none would miss that collective.
            samples = distributed.take_evenly(epoch_iterator, num_batches, self.args.device)
            return samples, self._get_num_items_in_batch(samples, device)

        def _run_epoch(self, *args: Any, **kwargs: Any) -> Any:
            """One pass over the training data; the seeded collator learns which pass it is
            (the resumed one too) before the dataloader starts collating."""
            if isinstance(self.data_collator, SeededCollator):
                self.data_collator.epoch = int(kwargs["epoch"])
            if self.stream_position is not None and self.stream_position.cursor is not None:
                self.stream_position.cursor.begin_pass(int(kwargs["epoch"]))
            return super()._run_epoch(*args, **kwargs)

        def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
            train_collator = self.data_collator
            if self.eval_collator is not None:
                self.data_collator = self.eval_collator
            try:
                loader: Any = super().get_eval_dataloader(eval_dataset)
            finally:
                self.data_collator = train_collator
            # Accelerate's loader looks one batch ahead of what it yields, so every process
            # of a stream still learns at the same batch that its stream has ended.
            loader.base_dataloader = distributed.evened(loader.base_dataloader, self.accelerator)
            return loader

        def evaluate(self, *args: Any, **kwargs: Any) -> dict[str, float]:
            metrics: dict[str, float] = super().evaluate(*args, **kwargs)
            self.evaluated = (self.state.global_step, metrics)
            return metrics

        def evaluation_loop(
            self,
            dataloader: Any,
            description: str,
            prediction_loss_only: bool | None = None,
            ignore_keys: list[str] | None = None,
            metric_key_prefix: str = "eval",
        ) -> Any:
            output = in_memory_evaluation(self, self.objective, dataloader, metric_key_prefix)
            if output is None:
                output = super().evaluation_loop(
                    dataloader, description, prediction_loss_only, ignore_keys, metric_key_prefix
                )
            self.eval_samples = output.num_samples or 0
            return output

        def _init_training_state(
            self,
            max_steps: int,
            num_update_steps_per_epoch: int,
            num_train_epochs: int,
            resume_from_checkpoint: str | None,
            trial: Any,
        ) -> tuple[int, int]:
            """Restore the state, with the current intervals and the exact stream position.

            A restored state keeps the logging, eval and save intervals it was saved with; a
            resumed run uses the current ones ('lmctl resume --save-steps' may change them).
            The Trainer counts a stream's position as if it never ended (pass 0, batch
            ``global_step``); once the data has been read more than once that points past the
            end of the first pass. The position recorded in the checkpoint is exact.
            """
            epochs, batches = super()._init_training_state(
                max_steps,
                num_update_steps_per_epoch,
                num_train_epochs,
                resume_from_checkpoint,
                trial,
            )
            self.state.compute_steps(self.args, max_steps)
            self.run_totals = RunTotals.of_checkpoint(resume_from_checkpoint)
            self._session_start = time.time()
            if self.state.global_step >= max_steps:
                # Resumed at the last step: nothing is left to train. (The Trainer would skip
                # into the last epoch and take one step more before checking.)
                return num_train_epochs, 0
            checkpoint, args = resume_from_checkpoint, self.args
            if self.stream_position is None or checkpoint is None or args.ignore_data_skip:
                return epochs, batches
            recorded = StreamRecord.gather(Path(checkpoint), args.process_index, args.world_size)
            if recorded is None:
                return epochs, batches
            self.stream_position.resume_at(recorded)
            return recorded.epoch, recorded.skipped()

    return LmctlTrainer


def _stream_position_class() -> type:
    from transformers import TrainerCallback

    class StreamPosition(TrainerCallback):
        """Which pass over the stream training is in, how many batches of it were read and
        where each dataloader worker is (``cursor``); written into every checkpoint so that a
        resumed run reads on from the same place."""

        def __init__(self, cursor: StreamCursor | None) -> None:
            self.epoch = -1
            self.batches = 0
            self.cursor = cursor
            self._resuming = False

        def resume_at(self, recorded: StreamRecord) -> None:
            self.epoch, self.batches, self._resuming = recorded.epoch, recorded.batches, True
            recorded.continue_in(self.cursor)

        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self._resuming:
                self._resuming = False
                return
            self.epoch += 1
            self.batches = 0

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.batches += args.gradient_accumulation_steps
            # A stream has no length to take a fraction of (the Trainer divides by
            # --max-steps): its epoch is the passes completed, as the accelerate engine has it.
            state.epoch = float(self.epoch)

        def write(self, checkpoint: Path, rank: int) -> None:
            """Record this process's position inside a checkpoint that is being written."""
            StreamRecord.of(self.epoch, self.batches, self.cursor).write(checkpoint, rank)

    return StreamPosition


def _callback_class() -> type:
    from transformers import TrainerCallback

    class ReportingCallback(TrainerCallback):
        def __init__(self, reporter: StepReporter) -> None:
            self.reporter = reporter
            #: Whether every process stops now (a signal seen by any of them).
            self.agree: Any = lambda: reporter.stop.requested
            #: The examples the last evaluation saw.
            self.eval_samples: Any = lambda: 0
            self.eval_steps = 0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.reporter.begin(state.max_steps, state.global_step, state.num_input_tokens_seen)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.reporter.step(state.global_step, state.epoch, state.num_input_tokens_seen)
            if self.agree():
                control.should_save = True
                control.should_training_stop = True

        def on_log(
            self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any
        ) -> None:
            if state.is_world_process_zero and logs:
                self.reporter.log(state.global_step, state.epoch, dict(logs))

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.reporter.end()

        def on_prediction_step(
            self, args: Any, state: Any, control: Any, eval_dataloader: Any = None, **kwargs: Any
        ) -> None:
            self.eval_steps += 1
            try:
                total = len(eval_dataloader)
            except TypeError:
                total = None
            self.reporter.eval_step(self.eval_steps, total)

        def on_evaluate(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.eval_steps = 0
            self.reporter.end_eval(self.eval_samples())

    return ReportingCallback


def run(prepared: Prepared, console: Console, stop: StopRequest) -> EngineResult:
    from transformers import PrinterCallback

    from lmctl.metrics import reduce_logits

    spec, runtime = prepared.spec, prepared.runtime
    args = training_arguments(spec, runtime, prepared.run_dir)
    reporter = StepReporter(
        console,
        prepared.run_dir,
        stop,
        is_main=args.process_index == 0,
        streaming=spec.data.streaming,
    )
    metrics = prepared.objective.metrics()
    reporting = _callback_class()(reporter)
    callbacks = [reporting]
    stream_position = None
    if spec.data.streaming:
        stream_position = _stream_position_class()(stream_cursor(prepared.train_dataset))
        callbacks.insert(0, stream_position)  # it sets the epoch that the reporting shows
    trainer = _make_trainer_class()(
        model=prepared.model,
        args=args,
        data_collator=prepared.collator,
        train_dataset=prepared.train_dataset,
        eval_dataset=prepared.eval_dataset,
        processing_class=prepared.tokenizer,
        compute_metrics=metrics.trainer_hook(),
        preprocess_logits_for_metrics=reduce_logits,
        callbacks=callbacks,
    )
    reporting.agree = lambda: stop_agreed(trainer.accelerator, stop)
    reporting.eval_samples = lambda: trainer.eval_samples
    trainer.eval_collator = prepared.eval_collator
    trainer.objective = prepared.objective
    trainer.save_total_limit = spec.loop.save_total_limit
    trainer.commits_checkpoints = rundir.commits_checkpoints(spec.run_dir)
    trainer.train_lengths = prepared.train_lengths
    trainer.restart_schedule = spec.optimizer.restart_schedule
    trainer.schedule_start = schedule_start(
        runtime.resume if spec.loop.do_train else None,
        trainer.restart_schedule,
        console if args.process_index == 0 else None,
    )
    trainer.remove_callback(PrinterCallback)
    trainer.stream_position = stream_position

    try:
        with mlflow_run(spec.tracking.report_to, prepared.run_dir, runtime.is_main):
            return _train_and_evaluate(trainer, prepared, console, stop)
    finally:
        _close(trainer)


def _close(trainer: Any) -> None:
    """Release the distributed model, then the process group."""
    trainer.model_wrapped = trainer.optimizer = trainer.lr_scheduler = trainer.deepspeed = None
    end_processes(trainer.accelerator)


def _train_and_evaluate(
    trainer: Any, prepared: Prepared, console: Console, stop: StopRequest
) -> EngineResult:
    loop, run_dir, args = prepared.spec.loop, prepared.run_dir, trainer.args
    result = EngineResult()
    if loop.do_train:
        resume = prepared.runtime.resume
        checkpoint = None if resume is None else str(resume)
        with forked_workers() if loop.dataloader_num_workers else nullcontext():
            output = trainer.train(resume_from_checkpoint=checkpoint)
        result.resumed_from = checkpoint
        if stop.requested:
            result.interrupted_at = trainer.state.global_step
            result.checkpoint = checkpoints.latest_checkpoint(run_dir)
            return result
        step = trainer.state.global_step
        result.train_metrics = training_record(
            lambda: dict(output.metrics),
            resumed_from=checkpoint,
            stepped=resume is None or step > checkpoints.checkpoint_step(resume),
            before=trainer.run_totals,
            global_step=step,
            samples=train_samples(
                prepared.train_dataset,
                lambda: (
                    step
                    * args.per_device_train_batch_size
                    * args.gradient_accumulation_steps
                    * args.world_size
                ),
            ),
            console=console,
        )
        cursor = getattr(trainer.stream_position, "cursor", None)
        result.mixture = trained_mixture(cursor, trainer.accelerator)
        save_final_model(
            run_dir,
            owner="trainer",
            is_main=args.should_save,
            wait=trainer.accelerator.wait_for_everyone,
            save=lambda staging: trainer.save_model(str(staging)),
        )
        if trainer.is_world_process_zero():
            history.write_state(trainer.state, run_dir)
    if loop.do_eval:
        done = trainer.evaluated  # at the last step already: the same weights, once
        if done and done[0] == trainer.state.global_step and not args.load_best_model_at_end:
            result.eval_metrics = dict(done[1])
        else:
            result.eval_metrics = trainer.evaluate()
        result.eval_metrics.update(final_figures(trainer, prepared))
        if not loop.do_train and trainer.is_world_process_zero():
            checkpoints.save_tokenizer(prepared.tokenizer, run_dir)
    result.global_step = trainer.state.global_step
    return result
