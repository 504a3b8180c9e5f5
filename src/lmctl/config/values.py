"""The value types of the document's fields and the constants its rules read."""

from __future__ import annotations

from typing import Literal

DATA_EXTENSIONS = ("txt", "csv", "json", "jsonl", "parquet")
LrScheduler = Literal[
    "linear",
    "cosine",
    "cosine_with_restarts",
    "polynomial",
    "constant",
    "constant_with_warmup",
    "inverse_sqrt",
    "reduce_lr_on_plateau",
    "cosine_with_min_lr",
    "warmup_stable_decay",
]
Strategy = Literal["no", "steps", "epoch"]
Dtype = Literal["auto", "bfloat16", "float16", "float32"]
Engine = Literal["trainer", "accelerate"]
Precision = Literal["auto", "fp32", "bf16", "fp16"]
FsdpSharding = Literal["full", "hybrid", "grad-op"]
Launcher = Literal["torchrun", "accelerate"]
#: lmctl's faster ways to train the same model (``lmctl.fastpaths`` decides where each
#: runs); ``--fast-paths`` takes ``auto``, ``off`` or a comma-separated list of these.
FastPathName = Literal[
    "tiled-loss",
    "fused-linear-loss",
    "masked-head",
    "skip-padding",
    "sparse-embedding",
    "fast-dropout",
    "fused-gelu",
    "fused-adamw",
    "allocator",
]
FAST_PATH_CHOICES = ("auto", "off")
#: ``--deepspeed`` values that name a config shipped with lmctl (ZeRO stage 1, 2 or 3).
DEEPSPEED_STAGES = ("1", "2", "3")
#: ``training_args`` keys (TrainingArguments fields) that the accelerate engine honours too.
ACCELERATE_TRAINING_ARGS = frozenset(
    {
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "lr_scheduler_kwargs",
        "save_only_model",
        "use_cpu",
    }
)
#: Schedules that need ``training_args.lr_scheduler_kwargs``: name -> keys, one of which is needed.
SCHEDULER_KWARGS = {
    "cosine_with_min_lr": ("min_lr", "min_lr_rate"),
    "warmup_stable_decay": ("num_decay_steps",),
}
