"""Compatibility with argument files written for the upstream example scripts.

``run_clm.py`` and friends accept every ``transformers.TrainingArguments`` field. Those that
lmctl does not model itself are passed through to the Trainer unchanged (``training_args``);
anything else unknown is an error with a did-you-mean hint. The list is static so that a
config error never has to import transformers; a test keeps it honest against the installed
version.
"""

from __future__ import annotations

from typing import Any

TRAINING_ARGUMENT_FIELDS = frozenset(
    [
        "output_dir",
        "per_device_train_batch_size",
        "num_train_epochs",
        "max_steps",
        "learning_rate",
        "lr_scheduler_type",
        "lr_scheduler_kwargs",
        "warmup_steps",
        "optim",
        "optim_args",
        "weight_decay",
        "adam_beta1",
        "adam_beta2",
        "adam_epsilon",
        "optim_target_modules",
        "gradient_accumulation_steps",
        "average_tokens_across_devices",
        "max_grad_norm",
        "label_smoothing_factor",
        "bf16",
        "fp16",
        "bf16_full_eval",
        "fp16_full_eval",
        "tf32",
        "gradient_checkpointing",
        "gradient_checkpointing_kwargs",
        "torch_compile",
        "torch_compile_backend",
        "torch_compile_mode",
        "use_liger_kernel",
        "liger_kernel_config",
        "neftune_noise_alpha",
        "torch_empty_cache_steps",
        "auto_find_batch_size",
        "logging_strategy",
        "logging_steps",
        "logging_first_step",
        "log_on_each_node",
        "logging_nan_inf_filter",
        "include_num_input_tokens_seen",
        "log_level",
        "log_level_replica",
        "disable_tqdm",
        "report_to",
        "run_name",
        "eval_strategy",
        "eval_steps",
        "eval_delay",
        "per_device_eval_batch_size",
        "prediction_loss_only",
        "eval_on_start",
        "eval_do_concat_batches",
        "eval_use_gather_object",
        "eval_accumulation_steps",
        "include_for_metrics",
        "batch_eval_metrics",
        "save_only_model",
        "save_strategy",
        "save_steps",
        "save_on_each_node",
        "save_total_limit",
        "push_to_hub",
        "hub_token",
        "hub_private_repo",
        "hub_model_id",
        "hub_strategy",
        "hub_always_push",
        "hub_revision",
        "load_best_model_at_end",
        "metric_for_best_model",
        "greater_is_better",
        "ignore_data_skip",
        "restore_callback_states_from_checkpoint",
        "full_determinism",
        "seed",
        "data_seed",
        "use_cpu",
        "accelerator_config",
        "dataloader_drop_last",
        "dataloader_num_workers",
        "dataloader_pin_memory",
        "dataloader_persistent_workers",
        "dataloader_prefetch_factor",
        "remove_unused_columns",
        "label_names",
        "length_column_name",
        "ddp_find_unused_parameters",
        "ddp_bucket_cap_mb",
        "ddp_broadcast_buffers",
        "ddp_static_graph",
        "ddp_backend",
        "ddp_timeout",
        "fsdp",
        "fsdp_config",
        "deepspeed",
        "debug",
        "skip_memory_metrics",
        "do_train",
        "do_eval",
        "do_predict",
        "resume_from_checkpoint",
        "local_rank",
    ]
)

# Keys that lmctl manages itself and never passes to the Trainer: logging and progress are
# lmctl's own, and Hub credentials never travel in a config.
MANAGED_TRAINING_ARGUMENTS = frozenset(
    {"disable_tqdm", "log_level", "log_level_replica", "hub_token", "local_rank", "do_predict"}
)

# Old or no_trainer spellings -> lmctl field, with a converter for the value.
RENAMED_KEYS: dict[str, tuple[str, Any]] = {
    "torch_dtype": ("dtype", None),
    "evaluation_strategy": ("eval_strategy", None),
    "max_train_steps": ("max_steps", None),
    "num_warmup_steps": ("warmup_steps", None),
    "use_slow_tokenizer": ("use_fast_tokenizer", lambda v: not _truthy(v)),
}


def _truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "on", "y", "t"}
    return bool(value)


def translate_upstream(
    data: dict[str, Any], known_fields: set[str]
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Split upstream-style keys into lmctl fields, Trainer pass-through, and unknown keys."""
    fields: dict[str, Any] = {}
    passthrough: dict[str, Any] = {}
    unknown: list[str] = []
    for raw_key, value in data.items():
        key = raw_key.replace("-", "_")
        if key == "fsdp" and isinstance(value, (str, list)):
            flags = fsdp_flags(value)
            if flags is None:
                passthrough[key] = value
            else:
                fields.update(flags)
        elif key in RENAMED_KEYS:
            target, convert = RENAMED_KEYS[key]
            fields[target] = convert(value) if convert else value
        elif key in known_fields:
            fields[key] = value
        elif key in TRAINING_ARGUMENT_FIELDS and key not in MANAGED_TRAINING_ARGUMENTS:
            passthrough[key] = value
        elif key in MANAGED_TRAINING_ARGUMENTS:
            continue
        else:
            unknown.append(raw_key)
    return fields, passthrough, unknown


#: Words of the Trainer's ``fsdp`` option string -> lmctl's FSDP fields.
FSDP_WORDS: dict[str, tuple[str, Any]] = {
    "full_shard": ("fsdp_sharding", "full"),
    "hybrid_shard": ("fsdp_sharding", "hybrid"),
    "shard_grad_op": ("fsdp_sharding", "grad-op"),
    "auto_wrap": ("fsdp_auto_wrap", True),
    "offload": ("fsdp_cpu_offload", True),
}


def fsdp_flags(value: str | list[str]) -> dict[str, Any] | None:
    """``fsdp: "full_shard auto_wrap"`` as lmctl's fields; None for a combination they do not
    express (it is passed to the Trainer as it is)."""
    words = value.split() if isinstance(value, str) else [str(word) for word in value]
    if not words:
        return {"fsdp": False}
    if any(word not in FSDP_WORDS for word in words):
        return None
    return {"fsdp": True, **dict(FSDP_WORDS[word] for word in words)}
