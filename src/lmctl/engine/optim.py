"""How a training run steps, for the ``accelerate`` engine: AdamW with the Trainer's parameter
groups, the learning-rate schedule, and the plan of optimizer steps, epochs and intervals."""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lmctl.errors import ConfigError, DataError

if TYPE_CHECKING:
    from lmctl.config.slices import LoopSpec, OptimizerSpec

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
