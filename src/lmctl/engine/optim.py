"""How a training run steps, for the ``accelerate`` engine: AdamW with the Trainer's parameter
groups, the learning-rate schedule, and the plan of optimizer steps, epochs and intervals; and
for both engines, where a resumed run's schedule starts and stands.

The schedule of a run spans from its start to --max-steps: a resumed run, extended or not,
goes on along the schedule of its current --max-steps (the learning rate at step s is the one
a run planned for that many steps has at s). ``--restart-schedule`` starts a new schedule,
warmup included, at the checkpoint's step, spanning the steps left; each checkpoint records
that start, so that later resumes go on along it.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.errors import ConfigError, DataError
from lmctl.run import checkpoints

if TYPE_CHECKING:
    from lmctl.config.slices import LoopSpec, OptimizerSpec
    from lmctl.console import Console

#: Where a checkpoint's ``trainer_state.json`` records the step its learning-rate schedule
#: started at (under ``stateful_callbacks``), once a resume restarted the schedule.
SCHEDULE_START = "LmctlScheduleStart"

#: Parameters whose names match these get no weight decay (the Trainer's own rule), besides
#: every parameter of a LayerNorm module.
NO_DECAY_PATTERNS = [r"bias", r"layernorm", r"rmsnorm", r"(?:^|\.)norm(?:$|\.)", r"_norm(?:$|\.)"]


def parameter_groups(model: Any, weight_decay: float) -> list[dict[str, Any]]:
    """AdamW parameter groups: no weight decay on biases and LayerNorm weights."""
    from torch import nn
    from transformers.trainer_pt_utils import get_parameter_names

    decay = set(get_parameter_names(model, [nn.LayerNorm], NO_DECAY_PATTERNS))
    named = [(name, p) for name, p in model.named_parameters() if p.requires_grad]
    return [
        {"params": [p for name, p in named if name in decay], "weight_decay": weight_decay},
        {"params": [p for name, p in named if name not in decay], "weight_decay": 0.0},
    ]


def make_optimizer(
    spec: OptimizerSpec, training_args: dict[str, Any], model: Any, *, fused: bool
) -> Any:
    """AdamW; ``fused``: torch's fused kernel (the same update, fewer passes over memory),
    as the run's fast paths decide (``lmctl.fastpaths``); else torch's default
    implementation for the device, as upstream's script builds it."""
    import torch

    extra = training_args
    return torch.optim.AdamW(
        parameter_groups(model, spec.weight_decay),
        lr=spec.learning_rate,
        betas=(extra.get("adam_beta1", 0.9), extra.get("adam_beta2", 0.999)),
        eps=extra.get("adam_epsilon", 1e-8),
        fused=True if fused else None,
    )


def make_scheduler(
    spec: OptimizerSpec, training_args: dict[str, Any], optimizer: Any, max_steps: int
) -> Any:
    """Any --lr-scheduler-type through ``transformers.get_scheduler``, with warmup."""
    from transformers import get_scheduler

    warmup = (
        math.ceil(spec.warmup_ratio * max_steps)
        if spec.warmup_ratio is not None
        else spec.warmup_steps
    )
    return get_scheduler(
        spec.lr_scheduler_type,
        optimizer,
        num_warmup_steps=warmup,
        num_training_steps=max_steps,
        scheduler_specific_kwargs=training_args.get("lr_scheduler_kwargs") or {},
    )


def schedule_start(checkpoint: Path | None, restart: bool, console: Console | None) -> int:
    """The optimizer step the run's schedule starts at: 0; the checkpoint's step when this
    resume restarts it (said on ``console``); else the start its checkpoint recorded."""
    if checkpoint is None:
        return 0
    state = checkpoints.read_checkpoint_state(checkpoint)
    if restart:
        step = int(state.get("global_step") or 0)
        if console is not None:
            console.info(f"--restart-schedule: a new learning-rate schedule starts at step {step}")
        return step
    recorded = (state.get("stateful_callbacks") or {}).get(SCHEDULE_START)
    return int(recorded.get("step", 0)) if isinstance(recorded, dict) else 0


def record_schedule_start(stateful: dict[str, Any], start: int) -> None:
    """Note a restarted schedule's start in a checkpoint's ``stateful_callbacks``."""
    if start:
        stateful[SCHEDULE_START] = {"step": start}


def place_schedule(scheduler: Any, position: int | None) -> None:
    """Put a resumed run's schedule at ``position`` (its steps since it started; None: where
    the restored scheduler stands), and the optimizer at that step's learning rate.

    A restored optimizer keeps the rate it was saved with, from the schedule of the run's
    earlier length: extended by --max-steps, it would take its next step at the old
    schedule's last rate (zero, for a linear decay). Every schedule but reduce_lr_on_plateau
    (which follows the evaluations) is a function of its position: a ``LambdaLR``.
    """
    from torch.optim.lr_scheduler import LambdaLR

    if not isinstance(scheduler, LambdaLR):
        return
    if position is not None:
        scheduler.last_epoch = position
    rates = [
        base * rate(scheduler.last_epoch)
        for base, rate in zip(scheduler.base_lrs, scheduler.lr_lambdas, strict=True)
    ]
    for group, value in zip(scheduler.optimizer.param_groups, rates, strict=True):
        group["lr"] = value
    scheduler._last_lr = rates


@dataclass
class Plan:
    """How far the run goes: optimizer steps, epochs, and batches per epoch."""

    batches_per_epoch: int | None  # None when the data has no length (streaming)
    max_steps: int
    epochs: int
    logging_steps: int
    eval_steps: int | None
    save_steps: int

    def position_after(self, epoch: int, batches_done: int) -> tuple[int, int]:
        """(epoch, batches done in it) after a batch; the end of an epoch is the next one's
        start."""
        if self.batches_per_epoch is not None and batches_done >= self.batches_per_epoch:
            return epoch + 1, 0
        return epoch, batches_done

    def epoch_progress(self, epoch: int, batches_done: int) -> float:
        if not self.batches_per_epoch:
            return float(epoch)
        return epoch + batches_done / self.batches_per_epoch


def make_plan(loop: LoopSpec, batches_per_epoch: int | None) -> Plan:
    """Step counts as the Trainer computes them: --max-steps overrides epochs; an epoch's last,
    shorter accumulation window still makes an optimizer step."""
    if batches_per_epoch == 0:
        raise DataError(
            "the training data gives no batch", "use more data or a smaller --block-size"
        )
    if batches_per_epoch is None:
        if loop.max_steps is None:
            raise ConfigError(
                "training data without a known length needs --max-steps", "e.g. --max-steps 1000"
            )
        max_steps, epochs = loop.max_steps, 2**62
    else:
        steps_per_epoch = math.ceil(batches_per_epoch / loop.gradient_accumulation_steps)
        if loop.max_steps is not None:
            max_steps = loop.max_steps
            epochs = math.ceil(max_steps / steps_per_epoch)
        else:
            max_steps = math.ceil(loop.num_train_epochs * steps_per_epoch)
            epochs = math.ceil(loop.num_train_epochs)

    def interval(value: float) -> int:
        return math.ceil(max_steps * value) if value < 1 else int(value)

    return Plan(
        batches_per_epoch=batches_per_epoch,
        max_steps=max_steps,
        epochs=epochs,
        logging_steps=interval(loop.logging_steps),
        eval_steps=interval(loop.eval_steps) if loop.eval_steps else None,
        save_steps=interval(loop.save_steps),
    )
