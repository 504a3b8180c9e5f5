"""DeepSpeed ZeRO and FSDP settings from the config, in the terms each engine takes them.

The Trainer reads ``TrainingArguments.deepspeed``/``fsdp``/``fsdp_config``; the Accelerate
loop takes the same settings as Accelerate plugins. Both engines shard through these
libraries only; lmctl just names the options.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lmctl.config.base import DEEPSPEED_STAGES
from lmctl.resources import deepspeed_config

if TYPE_CHECKING:
    from lmctl.config.base import TrainConfig

#: ``--fsdp-sharding`` -> the FSDP sharding strategy name both engines understand.
FSDP_STRATEGIES = {"full": "FULL_SHARD", "hybrid": "HYBRID_SHARD", "grad-op": "SHARD_GRAD_OP"}
#: The same strategies in the Trainer's ``fsdp`` option string.
TRAINER_FSDP = {"full": "full_shard", "hybrid": "hybrid_shard", "grad-op": "shard_grad_op"}


def deepspeed_file(config: TrainConfig) -> str | None:
    """The DeepSpeed config file of ``--deepspeed`` (a stage number names a shipped one)."""
    if config.deepspeed is None:
        return None
    if config.deepspeed in DEEPSPEED_STAGES:
        return str(deepspeed_config(config.deepspeed))
    return config.deepspeed


def trainer_options(config: TrainConfig) -> dict[str, Any]:
    """``TrainingArguments`` fields for DeepSpeed, FSDP (version 2) and checkpointing."""
    values: dict[str, Any] = {}
    if config.deepspeed is not None:
        values["deepspeed"] = deepspeed_file(config)
    if config.fsdp:
        words = [TRAINER_FSDP[config.fsdp_sharding]]
        if config.fsdp_auto_wrap:
            words.append("auto_wrap")
        if config.fsdp_cpu_offload:
            words.append("offload")
        values["fsdp"] = " ".join(words)
        values["fsdp_config"] = {"version": 2}
    if config.gradient_checkpointing:
        values["gradient_checkpointing"] = True
        # The non-reentrant form works under DDP and FSDP, and with frozen (adapter) weights.
        values["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    return values


def accelerate_plugins(config: TrainConfig) -> dict[str, Any]:
    """``Accelerator`` keyword arguments: a DeepSpeed or FSDP (version 2) plugin."""
    if config.deepspeed is not None:
        from accelerate.utils import DeepSpeedPlugin

        return {"deepspeed_plugin": DeepSpeedPlugin(hf_ds_config=deepspeed_file(config))}
    if config.fsdp:
        from accelerate.utils import FullyShardedDataParallelPlugin

        return {
            "fsdp_plugin": FullyShardedDataParallelPlugin(
                fsdp_version=2,
                reshard_after_forward=config.fsdp_sharding != "grad-op",
                cpu_offload=config.fsdp_cpu_offload,
                auto_wrap_policy="transformer_based_wrap" if config.fsdp_auto_wrap else None,
                state_dict_type="SHARDED_STATE_DICT",
            )
        }
    return {}
