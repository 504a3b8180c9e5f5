"""DeepSpeed ZeRO and FSDP settings of a run (its scale slice), in the terms each engine takes them.

The Trainer reads ``TrainingArguments.deepspeed``/``fsdp``/``fsdp_config``; the Accelerate
loop takes the same settings as Accelerate plugins. Both engines shard through these
libraries only; lmctl just names the options.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.config.values import DEEPSPEED_STAGES
from lmctl.resources import deepspeed_config
from lmctl.run.reshard import converted_for

if TYPE_CHECKING:
    from lmctl.config.slices import ScaleSpec
    from lmctl.run.runtime import Runtime

#: ``--fsdp-sharding`` -> the FSDP sharding strategy name both engines understand.
FSDP_STRATEGIES = {"full": "FULL_SHARD", "hybrid": "HYBRID_SHARD", "grad-op": "SHARD_GRAD_OP"}
#: The same strategies in the Trainer's ``fsdp`` option string.
TRAINER_FSDP = {"full": "full_shard", "hybrid": "hybrid_shard", "grad-op": "shard_grad_op"}


def deepspeed_file(scale: ScaleSpec) -> str | None:
    """The DeepSpeed config file of ``--deepspeed`` (a stage number names a shipped one)."""
    if scale.deepspeed is None:
        return None
    if scale.deepspeed in DEEPSPEED_STAGES:
        return str(deepspeed_config(scale.deepspeed))
    return scale.deepspeed


def trainer_options(
    scale: ScaleSpec, gradient_checkpointing: bool, runtime: Runtime | None = None
) -> dict[str, Any]:
    """``TrainingArguments`` fields for DeepSpeed, FSDP (version 2) and checkpointing. A run
    that continues a checkpoint of another number of processes loads DeepSpeed's states from
    their universal conversion (:mod:`lmctl.run.reshard`)."""
    values: dict[str, Any] = {}
    if scale.deepspeed is not None:
        values["deepspeed"] = deepspeed_file(scale)
        if runtime is not None and converted_for(runtime.resume, runtime.processes):
            document = json.loads(Path(values["deepspeed"]).read_text(encoding="utf-8"))
            document["checkpoint"] = {**document.get("checkpoint", {}), "load_universal": True}
            values["deepspeed"] = document
    if scale.fsdp:
        words = [TRAINER_FSDP[scale.fsdp_sharding]]
        if scale.fsdp_auto_wrap:
            words.append("auto_wrap")
        if scale.fsdp_cpu_offload:
            words.append("offload")
        values["fsdp"] = " ".join(words)
        values["fsdp_config"] = {"version": 2}
    if gradient_checkpointing:
        values["gradient_checkpointing"] = True
        # The non-reentrant form works under DDP and FSDP, and with frozen (adapter) weights.
        values["gradient_checkpointing_kwargs"] = {"use_reentrant": False}
    return values


def accelerate_plugins(scale: ScaleSpec) -> dict[str, Any]:
    """``Accelerator`` keyword arguments: a DeepSpeed or FSDP (version 2) plugin."""
    if scale.deepspeed is not None:
        from accelerate.utils import DeepSpeedPlugin

        return {"deepspeed_plugin": DeepSpeedPlugin(hf_ds_config=deepspeed_file(scale))}
    if scale.fsdp:
        from accelerate.utils import FullyShardedDataParallelPlugin

        return {
            "fsdp_plugin": FullyShardedDataParallelPlugin(
                fsdp_version=2,
                reshard_after_forward=scale.fsdp_sharding != "grad-op",
                cpu_offload=scale.fsdp_cpu_offload,
                auto_wrap_policy="transformer_based_wrap" if scale.fsdp_auto_wrap else None,
                state_dict_type="SHARDED_STATE_DICT",
            )
        }
    return {}
