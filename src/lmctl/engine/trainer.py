"""The ``trainer`` engine: the transformers ``Trainer``, driven by a validated config."""

from __future__ import annotations

import math
import os
import time
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl import distributed, secrets
from lmctl.config.slices import RunDirSpec, take
from lmctl.data.stream.positions import StreamCursor, stream_cursor
from lmctl.data.tokens import forked_workers
from lmctl.distributed import native_bf16
from lmctl.engine.common import (
    TRACKING_PROJECT,
    EngineResult,
    NonFiniteLoss,
    RunTotals,
    StepReporter,
    StreamRecord,
    any_process,
    end_processes,
    recorded_totals,
    resolve_resume,
    whole_run,
)
from lmctl.engine.sharding import trainer_options
from lmctl.errors import ConfigError
from lmctl.objectives.collate import SeededCollator
from lmctl.run.signals import StopRequest
from lmctl.storage.paths import local_folder

if TYPE_CHECKING:
    from lmctl.config.base import TrainConfig
    from lmctl.console import Console
    from lmctl.pipeline import Prepared


def check(config: TrainConfig) -> None:
    """Refuse, before any work, trackers the Trainer does not know or cannot load, and a
    DeepSpeed config without DeepSpeed."""
    import importlib.util

    from transformers.integrations.integration_utils import (
        INTEGRATION_TO_CALLBACK,
        get_available_reporting_integrations,
    )

    available = set(get_available_reporting_integrations())
    for name in config.report_to:
        if name == "all":
            continue
        if name not in INTEGRATION_TO_CALLBACK:
            raise ConfigError(
                f"--report-to {name}: not a tracker the Trainer knows",
                "choose from " + ", ".join(sorted(INTEGRATION_TO_CALLBACK)),
            )
        if name not in available:
            raise ConfigError(
                f"--report-to {name}: its package is not installed",
                f"pip install {name.replace('_', '-')}, or drop --report-to {name}",
            )
    if config.training_args.get("deepspeed") and importlib.util.find_spec("deepspeed") is None:
        raise ConfigError(
            "training_args.deepspeed: DeepSpeed is not installed",
            "pip install deepspeed, or remove training_args.deepspeed",
        )


def training_arguments(config: TrainConfig, run_dir: Path, *, fused_adamw: bool = False) -> Any:
    """The Trainer's arguments for ``config``; ``fused_adamw``: the run's fast paths chose
    torch's fused AdamW (otherwise the Trainer's default optimizer)."""
    from transformers import TrainingArguments

    precision = config.mixed_precision(native_bf16)
    warmup: float = config.warmup_ratio if config.warmup_ratio is not None else config.warmup_steps
    values: dict[str, Any] = {
        "output_dir": str(run_dir),
        "per_device_train_batch_size": config.per_device_train_batch_size,
        "per_device_eval_batch_size": config.per_device_eval_batch_size,
        "learning_rate": config.learning_rate,
        "weight_decay": config.weight_decay,
        "num_train_epochs": config.num_train_epochs,
        "max_steps": config.max_steps or -1,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
        "lr_scheduler_type": config.lr_scheduler_type,
        "warmup_steps": warmup,
        "max_grad_norm": config.max_grad_norm,
        "seed": config.seed,
        "bf16": precision == "bf16",
        "fp16": precision == "fp16",
        "torch_compile": config.torch_compile,
        "dataloader_num_workers": config.dataloader_num_workers,
        "logging_strategy": "steps",
        "logging_steps": config.logging_steps,
        "eval_strategy": config.eval_strategy,
        "eval_steps": config.eval_steps,
        "save_strategy": config.save_strategy,
        "save_steps": config.save_steps,
        # Rotation is lmctl's own (see LmctlTrainer._save_checkpoint): the Trainer's would
        # delete the newest checkpoint at the end of a run with --save-total-limit 1.
        "save_total_limit": None,
        "report_to": config.report_to or "none",
        "run_name": run_dir.name,
        "project": TRACKING_PROJECT,
        "do_train": config.do_train,
        "do_eval": config.do_eval,
        "disable_tqdm": True,
        "batch_eval_metrics": True,
        "include_num_input_tokens_seen": True,
        "log_level": "error",
        "dataloader_pin_memory": not _cpu_only(),
        # Objectives' preprocessing keeps exactly the columns their collators read
        # (special-tokens masks, offsets), which are not model arguments.
        "remove_unused_columns": False,
    }
    if fused_adamw:
        values["optim"] = "adamw_torch_fused"
    if _cpu_only() and (precision == "bf16" or distributed.world_size() > 1):
        # The Trainer runs bf16 autocast on the CPU, and several processes train together on
        # its CPUs (gloo) instead of each as a separate job, only when told the CPU is the
        # device.
        values["use_cpu"] = True
    values.update(trainer_options(config))
    values.update(config.training_args)
    if isinstance(values.get("logging_dir"), str):
        values["logging_dir"] = local_folder(values["logging_dir"])  # file:///abs is /abs
    if config.streaming:
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


def public_arguments(args: Any) -> Any:
    """A copy of TrainingArguments with every secret (``hub_token``, and secret keys inside
    its mappings; see :mod:`lmctl.secrets`) cleared, for pickling into the run directory."""
    import copy
    import dataclasses

    clean = copy.copy(args)
    for item in dataclasses.fields(args):
        value = getattr(args, item.name, None)
        if secrets.is_secret_key(item.name) and value is not None:
            object.__setattr__(clean, item.name, None)
        elif isinstance(value, (dict, str)):
            object.__setattr__(clean, item.name, secrets.redact(value, drop=True))
    return clean


def _cpu_only() -> bool:
    import torch

    return not torch.accelerator.is_available()


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

    from lmctl.run import checkpoints, history
    from lmctl.storage import atomic

    class LmctlTrainer(Trainer):
        """Stops on a non-finite loss, evaluates with the objective's eval collator, and
        writes checkpoints atomically."""

        eval_collator: Any = None
        #: Examples seen by the last evaluation (streams have no length to read it from).
        eval_samples: int = 0
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
            """The Trainer's checkpoint, written into a staging folder that is renamed into
            place once complete (trainer state last), then lmctl's rotation."""
            if self.hp_search_backend is None and trial is None:
                self.store_flos()
            run_dir = Path(self._get_output_dir(trial=trial))
            final = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            # Every process writes its part (RNG state, shards) into the same staging folder
            # (its machine's, where every machine keeps its own copy of the run).
            staging = atomic.staging_dir(final, owner="trainer")
            if self.commits_checkpoints:
                atomic.begin_staging(final, owner="trainer")
            self.accelerator.wait_for_everyone()
            self.save_model(str(staging), _internal_call=True)
            best_step = self.state.best_global_step
            if best_step and self.args.save_strategy != "no":
                best = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{best_step}"
                if best_step == self.state.global_step or best.is_dir():
                    self.state.best_model_checkpoint = str(best)
            if not self.args.save_only_model:
                self._save_optimizer_and_scheduler(str(staging))
                self._save_scaler(str(staging))
                self._save_rng_state(str(staging))
            if self.stream_position is not None:
                self.stream_position.write(staging, self.args.process_index)
            self.accelerator.wait_for_everyone()
            if self.args.should_save:
                exportable = [
                    cb
                    for cb in [*self.callback_handler.callbacks, self.control]
                    if isinstance(cb, ExportableState)
                ]
                stateful: Any = self.state.stateful_callbacks
                for cb in exportable:
                    name = cb.__class__.__name__
                    if isinstance(stateful.get(name), list):
                        stateful[name].append(cb.state())
                    else:
                        stateful[name] = cb.state()
                if self.run_totals is not None:
                    session_loss = self._total_loss_scalar + float(self._tr_loss.item())
                    self.run_totals.then(
                        self.state.global_step, session_loss, time.time() - self._session_start
                    ).record(self.state)
                history.write_state(self.state, staging)
            if self.commits_checkpoints:
                checkpoints.commit_dir(staging, final)
            self.accelerator.wait_for_everyone()
            if self.args.push_to_hub:
                self._push_from_checkpoint(str(final))
            if self.commits_checkpoints:
                best_checkpoint = self.state.best_model_checkpoint
                checkpoints.rotate_checkpoints(
                    run_dir,
                    self.save_total_limit,
                    protect=[Path(best_checkpoint)] if best_checkpoint else [],
                )

        def _get_train_sampler(self, train_dataset: Any = None) -> Any:
            if self.train_lengths is None:
                return super()._get_train_sampler(train_dataset)
            from lmctl.data.batching import LengthGroupedSampler

            batch = self.args.train_batch_size * self.args.gradient_accumulation_steps
            return LengthGroupedSampler(self.train_lengths, batch, self.args.seed)

        def _save(self, output_dir: str | None = None, state_dict: Any = None) -> None:
            """The Trainer's save, with ``training_args.bin`` written without secrets."""
            super()._save(output_dir, state_dict)
            if self.args.should_save:
                from transformers.trainer import TRAINING_ARGS_NAME

                folder = Path(str(output_dir if output_dir is not None else self.args.output_dir))
                torch.save(public_arguments(self.args), folder / TRAINING_ARGS_NAME)

        def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            """One micro-batch; a non-finite loss on any process stops every process (before
            the optimizer step can spoil the weights, and without leaving one waiting)."""
            if self.stream_position is not None and self.stream_position.cursor is not None:
                self.stream_position.cursor.take(inputs)
            loss = super().training_step(model, inputs, num_items_in_batch)
            finite = bool(torch.isfinite(loss).all())
            if any_process(self.accelerator, not finite):
                value = float(loss.detach().float().mean()) if not finite else math.nan
                raise NonFiniteLoss(self.state.global_step + 1, value)
            return loss

        def get_batch_samples(self, epoch_iterator: Any, num_batches: int, device: Any) -> Any:
            """The next accumulation window's batches; with a stream on several processes,
            as many on each as the process with the fewest has (streams split by shards
            end at different points, and a process that ran out would leave the others
            blocked in a gradient all-reduce)."""
            samples, items = super().get_batch_samples(epoch_iterator, num_batches, device)
            if self.args.world_size == 1 or has_length(self.train_dataset):
                return samples, items
            common = distributed.agreed_minimum(len(samples), self.args.device)
            if common < len(samples):
                samples = samples[:common]
                items = self._get_num_items_in_batch(samples, device)
            return samples, items

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
            dataset = eval_dataset if eval_dataset is not None else self.eval_dataset
            if self.args.world_size > 1 and not has_length(dataset):
                # Accelerate's loader looks one batch ahead of what it yields, so every
                # process still learns at the same batch that its stream has ended.
                loader.base_dataloader = distributed.EvenBatches(
                    loader.base_dataloader, self.args.device
                )
            return loader

        def evaluation_loop(self, *args: Any, **kwargs: Any) -> Any:
            output = super().evaluation_loop(*args, **kwargs)
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
            checkpoint = resume_from_checkpoint
            if self.stream_position is None or checkpoint is None or self.args.ignore_data_skip:
                return epochs, batches
            recorded = StreamRecord.read(Path(checkpoint), self.args.process_index)
            if recorded is None:
                return epochs, batches
            self.stream_position.resume_at(recorded)
            return recorded.epoch, recorded.batches

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

        def write(self, checkpoint: Path, rank: int) -> None:
            """Record this process's position inside a checkpoint that is being written."""
            StreamRecord.of(self.epoch, self.batches, self.cursor).write(checkpoint, rank)

    return StreamPosition


def _callback_class() -> type:
    from transformers import TrainerCallback

    class ReportingCallback(TrainerCallback):
        def __init__(self, reporter: StepReporter) -> None:
            self.reporter = reporter
            #: Turns this process's stop request into the decision of every process.
            self.agree: Any = lambda requested: requested
            self.eval_steps = 0

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.reporter.begin(state.max_steps, state.global_step, state.num_input_tokens_seen)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.reporter.step(state.global_step, state.epoch, state.num_input_tokens_seen)
            if self.agree(self.reporter.stop.requested):
                self.reporter.stop.adopt()
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
            self.reporter.end_eval()

    return ReportingCallback


def run(prepared: Prepared, console: Console, stop: StopRequest) -> EngineResult:
    from transformers import PrinterCallback

    from lmctl.metrics import reduce_logits
    from lmctl.run import rundir

    config = prepared.config
    fused = prepared.fast_paths.fused_adamw()
    args = training_arguments(config, prepared.run_dir, fused_adamw=fused)
    reporter = StepReporter(console, prepared.run_dir, stop, is_main=args.process_index == 0)
    metrics = prepared.objective.metrics()
    reporting = _callback_class()(reporter)
    trainer = _make_trainer_class()(
        model=prepared.model,
        args=args,
        # Random masks and permutations come from the batch, the seed and the epoch, not from
        # the global RNG: the dataloader collates ahead of the step, so a draw from the global
        # RNG would depend on how far it had prefetched when a checkpoint was taken.
        data_collator=SeededCollator(prepared.collator, config.seed),
        train_dataset=prepared.train_dataset,
        eval_dataset=prepared.eval_dataset,
        processing_class=prepared.tokenizer,
        compute_metrics=metrics.trainer_hook(),
        preprocess_logits_for_metrics=reduce_logits,
        callbacks=[reporting],
    )
    reporting.agree = lambda requested: any_process(trainer.accelerator, requested)
    trainer.eval_collator = prepared.eval_collator
    trainer.save_total_limit = config.save_total_limit
    trainer.commits_checkpoints = rundir.commits_checkpoints(take(RunDirSpec, config))
    trainer.train_lengths = prepared.train_lengths
    trainer.remove_callback(PrinterCallback)
    if config.streaming:
        cursor = stream_cursor(prepared.train_dataset)
        trainer.stream_position = _stream_position_class()(cursor)
        trainer.add_callback(trainer.stream_position)

    try:
        with _tracker_run(config, prepared.run_dir):
            return _train_and_evaluate(trainer, prepared, args, console, stop)
    finally:
        _close(trainer)


def _close(trainer: Any) -> None:
    """Release the distributed model, then the process group."""
    trainer.model_wrapped = trainer.optimizer = trainer.lr_scheduler = trainer.deepspeed = None
    end_processes(trainer.accelerator)


def _tracker_run(config: TrainConfig, run_dir: Path) -> Any:
    """One MLflow run around training and the final evaluation: the Trainer's callback would
    end its run with training and log the final evaluation to a second, unnamed run."""
    import importlib.util
    from contextlib import nullcontext

    from lmctl.distributed import is_main_process

    wanted = {"mlflow", "all"} & set(config.report_to)
    if not wanted or not is_main_process() or importlib.util.find_spec("mlflow") is None:
        return nullcontext()
    import mlflow

    # The experiment is named like the accelerate engine's, unless the user chose one (the
    # callback reads the same variable).
    os.environ.setdefault("MLFLOW_EXPERIMENT_NAME", TRACKING_PROJECT)
    mlflow.set_experiment(os.environ["MLFLOW_EXPERIMENT_NAME"])
    return mlflow.start_run(run_name=run_dir.name)


def _train_and_evaluate(
    trainer: Any, prepared: Prepared, args: Any, console: Console, stop: StopRequest
) -> EngineResult:
    from lmctl.run import checkpoints

    config = prepared.config
    result = EngineResult()
    if config.do_train:
        checkpoint = resolve_resume(config, prepared.run_dir, console)
        with forked_workers() if config.dataloader_num_workers else nullcontext():
            output = trainer.train(resume_from_checkpoint=checkpoint)
        result.resumed_from = checkpoint
        if stop.requested:
            result.interrupted_at = trainer.state.global_step
            result.checkpoint = checkpoints.latest_checkpoint(prepared.run_dir)
            return result
        if checkpoint is not None and trainer.state.global_step <= _step_of(checkpoint):
            # Interrupted right at the end: nothing was left to train, so the run's training
            # metrics are the totals its checkpoint recorded (the Trainer would report 0).
            console.info("the checkpoint was already at the last step; finishing the run")
            result.train_metrics = recorded_totals(trainer.run_totals)
        else:
            result.train_metrics = whole_run(
                dict(output.metrics), trainer.run_totals, trainer.state.global_step
            )
        if result.train_metrics:
            result.train_metrics["train_samples"] = _train_samples(prepared, args, trainer)
        _save_final_model(trainer, prepared.run_dir)
    if config.do_eval:
        result.eval_metrics = trainer.evaluate()
        result.eval_metrics["eval_samples"] = trainer.eval_samples
        if not config.do_train and trainer.is_world_process_zero():
            checkpoints.save_tokenizer(prepared.tokenizer, prepared.run_dir)
    result.global_step = trainer.state.global_step
    return result


def _save_final_model(trainer: Any, run_dir: Path) -> None:
    """The final model, staged and moved into the run directory with its manifest last (every
    process takes part in the save, as sharded models need), then the trainer state."""
    from lmctl.run import checkpoints, history

    staging = checkpoints.model_staging(run_dir, owner="trainer")
    if trainer.args.should_save:
        checkpoints.begin_model(run_dir, owner="trainer")
    trainer.accelerator.wait_for_everyone()
    trainer.save_model(str(staging))
    trainer.accelerator.wait_for_everyone()
    if trainer.args.should_save:
        checkpoints.commit_model(staging, run_dir)
    if trainer.is_world_process_zero():
        history.write_state(trainer.state, run_dir)
    trainer.accelerator.wait_for_everyone()


def _step_of(checkpoint: str) -> int:
    from lmctl.run import checkpoints

    try:
        return checkpoints.checkpoint_step(Path(checkpoint))
    except ValueError:
        return -1


def _train_samples(prepared: Prepared, args: Any, trainer: Any) -> int:
    """Training examples: the dataset's length, or for a stream the examples consumed."""
    dataset = prepared.train_dataset
    if dataset is not None and hasattr(dataset, "__len__"):
        return len(dataset)
    return int(
        trainer.state.global_step
        * args.per_device_train_batch_size
        * args.gradient_accumulation_steps
        * args.world_size
    )
