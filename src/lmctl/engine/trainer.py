"""The ``trainer`` engine: the transformers ``Trainer``, driven by a validated config."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.engine.common import EngineResult, NonFiniteLoss, StepReporter, resolve_resume
from lmctl.errors import ConfigError
from lmctl.objectives.common import SeededCollator
from lmctl.run.signals import StopRequest

if TYPE_CHECKING:
    from lmctl.config.base import TrainConfig
    from lmctl.console import Console
    from lmctl.pipeline import Prepared


def training_arguments(config: TrainConfig, run_dir: Path) -> Any:
    from transformers import TrainingArguments

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
        "bf16": config.bf16,
        "fp16": config.fp16,
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
        "do_train": config.do_train,
        "do_eval": config.do_eval,
        "disable_tqdm": True,
        "batch_eval_metrics": True,
        "include_num_input_tokens_seen": True,
        "log_level": "error",
        "dataloader_pin_memory": _has_accelerator(),
        # Objectives' preprocessing keeps exactly the columns their collators read
        # (special-tokens masks, offsets), which are not model arguments.
        "remove_unused_columns": False,
    }
    values.update(config.training_args)
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


def _has_accelerator() -> bool:
    import torch

    return bool(torch.cuda.is_available())


def _make_trainer_class() -> type:
    import torch
    from transformers import Trainer
    from transformers.trainer_callback import ExportableState
    from transformers.trainer_utils import PREFIX_CHECKPOINT_DIR

    from lmctl.run import rundir
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

        def _save_checkpoint(self, model: Any, trial: Any) -> None:
            """The Trainer's checkpoint, written into a staging folder that is renamed into
            place once complete (trainer state last), then lmctl's rotation."""
            if self.hp_search_backend is None and trial is None:
                self.store_flos()
            run_dir = Path(self._get_output_dir(trial=trial))
            final = run_dir / f"{PREFIX_CHECKPOINT_DIR}-{self.state.global_step}"
            # Every process writes its part (RNG state, shards) into the same staging folder.
            staging = atomic.staging_dir(final, owner="trainer")
            if self.args.should_save:
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
                if self.stream_position is not None:
                    self.stream_position.write(staging)
                self.state.save_to_json(str(staging / rundir.STATE_FILE))
                rundir.commit_dir(staging, final)
            self.accelerator.wait_for_everyone()
            if self.args.push_to_hub:
                self._push_from_checkpoint(str(final))
            if self.args.should_save:
                best_checkpoint = self.state.best_model_checkpoint
                rundir.rotate_checkpoints(
                    run_dir,
                    self.save_total_limit,
                    protect=[Path(best_checkpoint)] if best_checkpoint else [],
                )

        def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            loss = super().training_step(model, inputs, num_items_in_batch)
            if not torch.isfinite(loss).all():
                raise NonFiniteLoss(self.state.global_step + 1, float(loss.detach().float().mean()))
            return loss

        def _run_epoch(self, *args: Any, **kwargs: Any) -> Any:
            """One pass over the training data; the seeded collator learns which pass it is
            (the resumed one too) before the dataloader starts collating."""
            if isinstance(self.data_collator, SeededCollator):
                self.data_collator.epoch = int(kwargs["epoch"])
            return super()._run_epoch(*args, **kwargs)

        def get_eval_dataloader(self, eval_dataset: Any = None) -> Any:
            train_collator = self.data_collator
            if self.eval_collator is not None:
                self.data_collator = self.eval_collator
            try:
                return super().get_eval_dataloader(eval_dataset)
            finally:
                self.data_collator = train_collator

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
            checkpoint = resume_from_checkpoint
            if self.stream_position is None or checkpoint is None or self.args.ignore_data_skip:
                return epochs, batches
            recorded = read_stream_position(Path(checkpoint))
            if recorded is None:
                return epochs, batches
            self.stream_position.resume_at(*recorded)
            return recorded

    return LmctlTrainer


STREAM_POSITION_FILE = "stream_position.json"


def read_stream_position(checkpoint: Path) -> tuple[int, int] | None:
    try:
        data = json.loads((checkpoint / STREAM_POSITION_FILE).read_text(encoding="utf-8"))
        return int(data["epoch"]), int(data["batches"])
    except (OSError, ValueError, KeyError, TypeError):
        return None


def _stream_position_class() -> type:
    from transformers import TrainerCallback

    class StreamPosition(TrainerCallback):
        """Which pass over the stream training is in and how many batches of it were read;
        written into every checkpoint so that a resumed run reads on from the same place."""

        def __init__(self) -> None:
            self.epoch = -1
            self.batches = 0
            self._resuming = False

        def resume_at(self, epoch: int, batches: int) -> None:
            self.epoch, self.batches, self._resuming = epoch, batches, True

        def on_epoch_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            if self._resuming:
                self._resuming = False
                return
            self.epoch += 1
            self.batches = 0

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.batches += args.gradient_accumulation_steps

        def write(self, checkpoint: Path) -> None:
            """Record the position inside a checkpoint that is being written."""
            position = {"epoch": self.epoch, "batches": self.batches}
            (checkpoint / STREAM_POSITION_FILE).write_text(json.dumps(position) + "\n")

    return StreamPosition


def _callback_class() -> type:
    from transformers import TrainerCallback

    class ReportingCallback(TrainerCallback):
        def __init__(self, reporter: StepReporter) -> None:
            self.reporter = reporter

        def on_train_begin(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.reporter.begin(state.max_steps, state.global_step, state.num_input_tokens_seen)

        def on_step_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.reporter.step(state.global_step, state.epoch, state.num_input_tokens_seen)
            if self.reporter.stop.requested:
                control.should_save = True
                control.should_training_stop = True

        def on_log(
            self, args: Any, state: Any, control: Any, logs: Any = None, **kwargs: Any
        ) -> None:
            if state.is_world_process_zero and logs:
                self.reporter.log(state.global_step, state.epoch, dict(logs))

        def on_train_end(self, args: Any, state: Any, control: Any, **kwargs: Any) -> None:
            self.reporter.end()

    return ReportingCallback


def run(prepared: Prepared, console: Console, stop: StopRequest) -> EngineResult:
    from transformers import PrinterCallback

    from lmctl.run import rundir

    config = prepared.config
    args = training_arguments(config, prepared.run_dir)
    reporter = StepReporter(console, prepared.run_dir, stop, is_main=args.process_index == 0)
    metrics = prepared.objective.metrics()
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
        callbacks=[_callback_class()(reporter)],
    )
    trainer.eval_collator = prepared.eval_collator
    trainer.save_total_limit = config.save_total_limit
    trainer.remove_callback(PrinterCallback)
    if config.streaming:
        trainer.stream_position = _stream_position_class()()
        trainer.add_callback(trainer.stream_position)

    result = EngineResult()
    if config.do_train:
        checkpoint = resolve_resume(config, prepared.run_dir, console)
        output = trainer.train(resume_from_checkpoint=checkpoint)
        result.resumed_from = checkpoint
        if stop.requested:
            result.interrupted_at = trainer.state.global_step
            result.checkpoint = rundir.latest_checkpoint(prepared.run_dir)
            return result
        if checkpoint is not None and trainer.state.global_step <= _step_of(checkpoint):
            # Interrupted right at the end: nothing was left to train, so there are no new
            # training metrics (the Trainer would report a loss of 0).
            console.info("the checkpoint was already at the last step; finishing the run")
        else:
            result.train_metrics = dict(output.metrics)
            result.train_metrics["train_samples"] = _train_samples(prepared, args, trainer)
        trainer.save_model()
        trainer.save_state()
    if config.do_eval:
        result.eval_metrics = trainer.evaluate()
        result.eval_metrics["eval_samples"] = trainer.eval_samples
        if not config.do_train:
            prepared.tokenizer.save_pretrained(prepared.run_dir)
    result.global_step = trainer.state.global_step
    return result


def _step_of(checkpoint: str) -> int:
    from lmctl.run import rundir

    try:
        return rundir.checkpoint_step(Path(checkpoint))
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
