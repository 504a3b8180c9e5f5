"""LoRA adapters with ``peft``: wrapping a model for ``--peft lora``, loading an adapter run,
and merging an adapter into full weights.

A run trained with an adapter holds the adapter (``adapter_config.json``,
``adapter_model.safetensors``, loadable with ``peft.PeftModel.from_pretrained``) beside the
base model's ``config.json``; ``--merge-adapter`` adds ``merged/``, full weights for plain
transformers.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.errors import ConfigError, ModelError
from lmctl.storage.paths import is_remote, local_path

if TYPE_CHECKING:
    from lmctl.config.slices import AdapterSpec
    from lmctl.console import Console

ADAPTER_CONFIG = "adapter_config.json"
#: Where ``--merge-adapter`` writes the merged model inside the run directory.
MERGED_DIR = "merged"


def is_adapter_dir(path: str | Path) -> bool:
    if isinstance(path, str) and is_remote(path):
        return False
    return (local_path(str(path)) / ADAPTER_CONFIG).is_file()


def adapter_base(path: str | Path) -> str:
    """The base model an adapter directory was trained on."""
    file = local_path(str(path)) / ADAPTER_CONFIG
    try:
        base = json.loads(file.read_text(encoding="utf-8")).get("base_model_name_or_path")
    except (OSError, ValueError) as exc:
        raise ModelError(f"{file}: unreadable ({exc})", "give an adapter written by peft") from exc
    if not isinstance(base, str) or not base:
        raise ModelError(f"{file}: names no base model", "give an adapter written by peft")
    return base


def new_modules(missing_keys: list[str], model: Any) -> list[str]:
    """The top-level modules holding weights that the checkpoint lacked (a new task head, such
    as a multiple-choice classifier): they train in full and are saved with the adapter."""
    names = {name for name, _ in model.named_children()}
    found = []
    for key in missing_keys:
        head = key.split(".")[0]
        if head in names and head not in found:
            found.append(head)
    return found


def apply_lora(
    adapter: AdapterSpec,
    base: str,
    model: Any,
    missing_keys: list[str],
    console: Console,
    *,
    objective: str,
) -> Any:
    """``model`` (loaded from ``base``) with a LoRA adapter; only the adapter (and new heads)
    will train."""
    from peft import LoraConfig, get_peft_model

    if not is_remote(base) and local_path(base).is_dir():
        base = str(local_path(base).resolve())  # the adapter loads from any directory
    lora = LoraConfig(
        r=adapter.lora_r,
        lora_alpha=adapter.lora_alpha,
        lora_dropout=adapter.lora_dropout,
        target_modules=list(adapter.lora_target_modules) or None,
        modules_to_save=new_modules(missing_keys, model) or None,
        task_type="CAUSAL_LM" if objective == "clm" else None,
    )
    try:
        adapted = get_peft_model(model, lora)
    except ValueError as exc:
        raise ConfigError(
            f"--peft lora: {str(exc).splitlines()[0]}",
            "name the modules to adapt with --lora-target-modules (e.g. q_proj, v_proj)",
        ) from exc
    adapted.peft_config["default"].base_model_name_or_path = base
    trainable, total = adapted.get_nb_trainable_parameters()
    console.info(
        f"LoRA adapter (r {adapter.lora_r}): {trainable:,} trainable of {total:,} parameters "
        f"({100 * trainable / max(total, 1):.2f}%)"
    )
    return adapted


def load_adapted(auto_class: Any, path: str, **kwargs: Any) -> Any:
    """The base model with the adapter of ``path`` on it, for evaluation."""
    from peft import PeftModel

    base = auto_class.from_pretrained(adapter_base(path), **kwargs)
    return PeftModel.from_pretrained(base, path)


def merge_adapter(run_dir: Path, tokenizer: Any, auto_class: Any, console: Console) -> Path:
    """Load the run's adapter on its base, merge it into the weights and save the result."""
    merged = load_adapted(auto_class, str(run_dir)).merge_and_unload()
    target = run_dir / MERGED_DIR
    merged.save_pretrained(target)
    tokenizer.save_pretrained(target)
    console.info(f"merged adapter weights written to {target}")
    return target
