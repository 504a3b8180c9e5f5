"""The run directory contract, shared by every engine and read back by eval and resume.

lmctl.yaml            resolved config (no secrets); `--config` accepts it as is
metrics.jsonl         one JSON object per logged step or evaluation
train_results.json    upstream-compatible result files (``lmctl eval`` writes
eval_results.json     eval_results.json only when absent, see lmctl.evaluation)
all_results.json
trainer_state.json    written by the engine
checkpoint-<step>/    checkpoints (the newest complete one is used to resume), each written
                      under a hidden .tmp-* name and renamed when complete, with a manifest
                      (lmctl_checkpoint.json) of its files and sizes
README.md             model card
config.json, model.safetensors, tokenizer files: the final model (save_pretrained)
"""

from __future__ import annotations

import json
import math
import re
import shutil
import sys
import time
from contextlib import AbstractContextManager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl import __version__
from lmctl.errors import ConfigError
from lmctl.storage import atomic
from lmctl.storage.atomic import atomic_write, manifest_problem
from lmctl.storage.paths import is_remote, local_path

if TYPE_CHECKING:
    from lmctl.config.base import TrainConfig
    from lmctl.objectives.base import Objective

CONFIG_FILE = "lmctl.yaml"
METRICS_LOG = "metrics.jsonl"
STATE_FILE = "trainer_state.json"
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
MANIFEST_FILE = "lmctl_checkpoint.json"


def check_output_dir(config: TrainConfig) -> None:
    """Refuse to write into a non-empty directory unless asked to (before any heavy work)."""
    assert config.output_dir is not None
    path = Path(config.output_dir)
    if path.exists() and not path.is_dir():
        raise ConfigError(
            f"--output-dir {path}: exists and is not a directory", "choose another --output-dir"
        )
    if not path.exists() or not any(path.iterdir()):
        return
    if config.resume_from_checkpoint is not None:
        return
    if config.overwrite_output_dir:
        return
    raise ConfigError(
        f"--output-dir {path} is not empty",
        f"choose a new --output-dir, continue it with 'lmctl resume {path}', "
        "or pass --overwrite-output-dir",
    )


def prepare_output_dir(config: TrainConfig) -> Path:
    """Create the run directory; with --overwrite-output-dir, clear a previous lmctl run."""
    assert config.output_dir is not None
    path = Path(config.output_dir)
    if (
        config.overwrite_output_dir
        and config.resume_from_checkpoint is None
        and (path / CONFIG_FILE).is_file()
    ):
        for child in path.iterdir():
            if child.is_dir() and not child.is_symlink():
                shutil.rmtree(child)
            else:
                child.unlink()
    path.mkdir(parents=True, exist_ok=True)
    return path


# Config fields that may name local files or directories; lmctl.yaml stores them absolute so
# that resume and eval work from any working directory.
PATH_FIELDS = (
    "model_name_or_path",
    "config_name",
    "tokenizer_name",
    "cache_dir",
    "dataset_name",
    "train_file",
    "validation_file",
)


def write_config(path: Path, config: TrainConfig) -> None:
    """Save the resolved config. Local paths are made absolute; which checkpoint a run was
    resumed from is not part of it (``lmctl resume`` finds the newest one itself)."""
    import yaml

    from lmctl.config.loader import dump_config

    data = {"objective": config.objective, **dump_config(config)}
    data["resume_from_checkpoint"] = None
    for name in PATH_FIELDS:
        value = data.get(name)
        if isinstance(value, str) and not is_remote(value) and local_path(value).exists():
            data[name] = str(local_path(value).resolve())
    header = (
        f"# lmctl {__version__} resolved config; rerun it with:\n"
        f"#   lmctl train {config.objective} --config {CONFIG_FILE}\n"
    )
    atomic_write(path / CONFIG_FILE, header + yaml.safe_dump(data, sort_keys=False))


def read_config(path: Path) -> dict[str, Any]:
    from lmctl.config.loader import read_config_file

    return read_config_file(str(path / CONFIG_FILE))


def append_metrics(path: Path, record: dict[str, Any]) -> None:
    line = json.dumps({"time": round(time.time(), 3), **record}, default=_json_default)
    with open(path / METRICS_LOG, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")


def save_results(path: Path, split: str, metrics: dict[str, Any]) -> None:
    """``<split>_results.json`` and the merged ``all_results.json``, as the Trainer writes them."""
    clean = {key: _json_value(value) for key, value in metrics.items()}
    write_json(path / f"{split}_results.json", clean)
    all_path = path / "all_results.json"
    merged = json.loads(all_path.read_text()) if all_path.is_file() else {}
    merged.update(clean)
    write_json(all_path, merged)


def load_results(path: Path) -> dict[str, Any]:
    all_path = path / "all_results.json"
    return json.loads(all_path.read_text()) if all_path.is_file() else {}


def atomic_dir(final: Path, owner: str | None = None) -> AbstractContextManager[Path]:
    """:func:`lmctl.storage.atomic.atomic_dir`, with a manifest when ``final`` is a checkpoint."""
    return atomic.atomic_dir(final, owner, _manifest_for(final))


def commit_dir(staging: Path, final: Path) -> None:
    """:func:`lmctl.storage.atomic.commit_dir`, with a manifest when ``final`` is a checkpoint."""
    atomic.commit_dir(staging, final, _manifest_for(final))


def _manifest_for(final: Path) -> str | None:
    return MANIFEST_FILE if CHECKPOINT_PATTERN.match(final.name) else None


def checkpoints(path: Path) -> list[Path]:
    """Checkpoint directories, oldest first."""
    if not path.is_dir():
        return []
    found = [
        (int(match.group(1)), child)
        for child in path.iterdir()
        if child.is_dir() and (match := CHECKPOINT_PATTERN.match(child.name))
    ]
    return [child for _, child in sorted(found)]


def checkpoint_step(path: Path) -> int:
    match = CHECKPOINT_PATTERN.match(path.name)
    if match is None:
        raise ValueError(f"{path} is not a checkpoint directory")
    return int(match.group(1))


def checkpoint_problem(path: Path) -> str | None:
    """Why a checkpoint cannot be used, or None when it is complete.

    Complete means: its trainer state (written last) parses and, when it has a manifest,
    every listed file is there with its recorded size.
    """
    try:
        json.loads((path / STATE_FILE).read_text())
    except FileNotFoundError:
        return f"{STATE_FILE} is missing (the save did not finish)"
    except (OSError, ValueError):
        return f"{STATE_FILE} is unreadable"
    return manifest_problem(path, MANIFEST_FILE)


def is_complete_checkpoint(path: Path) -> bool:
    return checkpoint_problem(path) is None


def latest_checkpoint(path: Path, skipped: list[tuple[Path, str]] | None = None) -> Path | None:
    """The newest complete checkpoint; newer unusable ones are appended to ``skipped``."""
    for candidate in reversed(checkpoints(path)):
        problem = checkpoint_problem(candidate)
        if problem is None:
            return candidate
        if skipped is not None:
            skipped.append((candidate, problem))
    return None


def resume_checkpoint(config: TrainConfig) -> Path | None:
    """The local checkpoint a run resumes from (``auto``: the newest complete one), if any."""
    checkpoint = config.resume_from_checkpoint
    if checkpoint is None or is_remote(checkpoint):
        return None
    if checkpoint == "auto":
        return latest_checkpoint(Path(config.output_dir or "."))
    return local_path(checkpoint)


#: Per-process RNG state files that both engines write into a checkpoint: the Trainer
#: ``rng_state.pth`` (one process) or ``rng_state_<rank>.pth``; Accelerate
#: ``random_states_<rank>.pkl``.
RNG_STATE_FILE = re.compile(r"^(?:rng_state(?:_(\d+))?\.pth|random_states_(\d+)\.pkl)$")


def checkpoint_world_size(path: Path) -> int | None:
    """How many processes wrote ``path``: one RNG state file each (None if it has none)."""
    ranks = set()
    for file in path.iterdir():
        match = RNG_STATE_FILE.match(file.name)
        if match:
            ranks.add(int(match.group(1) or match.group(2) or 0))
    return len(ranks) or None


def read_checkpoint_state(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((path / STATE_FILE).read_text())
    return state


def rotate_checkpoints(
    path: Path, limit: int | None, protect: list[Path] | None = None
) -> list[Path]:
    """Delete the oldest checkpoints beyond ``limit``.

    Never deletes the newest complete checkpoint (the one a resume needs) nor any in
    ``protect`` (the best one with --load-best-model-at-end); the limit stretches instead.
    """
    if not limit:
        return []
    found = checkpoints(path)
    newest = latest_checkpoint(path)
    kept = {p.resolve() for p in (protect or []) if p.exists()}
    if newest is not None:
        kept.add(newest.resolve())
    removable = [c for c in found if c.resolve() not in kept]
    excess = len(found) - max(limit, len(kept))
    deleted = removable[: max(excess, 0)]
    for checkpoint in deleted:
        atomic.remove_dir(checkpoint)
    return deleted


def command_line() -> str:
    args = ["lmctl", *sys.argv[1:]]
    return " ".join(_shell_quote(arg) for arg in _redact(args))


def _redact(args: list[str]) -> list[str]:
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            out.append("***")
            hide_next = False
        elif arg in ("--token", "--hub-token"):
            out.append(arg)
            hide_next = True
        elif arg.startswith(("--token=", "--hub-token=")):
            out.append(arg.split("=", 1)[0] + "=***")
        else:
            out.append(arg)
    return out


def _shell_quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def write_model_card(
    path: Path,
    *,
    config: TrainConfig,
    objective: Objective,
    results: dict[str, Any],
    engine: str,
    resumed: bool = False,
    command: str | None = None,
    versions: dict[str, str] | None = None,
) -> None:
    """Write the model card.

    ``command`` and ``versions`` describe the training run; they default to this process's
    command line and libraries (a card regenerated later keeps the original ones).
    """
    import yaml

    base_model = config.model_name_or_path
    datasets = [config.dataset_name] if config.dataset_name else []
    metadata: dict[str, Any] = {
        # An adapter run publishes a peft adapter (with its merged weights in merged/).
        "library_name": "peft" if config.peft else "transformers",
        "pipeline_tag": objective.task_tag,
        "tags": ["lmctl", *objective.model_card_tags()],
    }
    if base_model:
        metadata["base_model"] = base_model
    if datasets:
        metadata["datasets"] = datasets
    lines = ["---", yaml.safe_dump(metadata, sort_keys=False).strip(), "---", ""]
    title = path.name or "model"
    lines.append(f"# {title}")
    lines.append("")
    origin = (
        f"fine-tuned from `{base_model}`"
        if base_model
        else (
            f"trained from scratch (`{config.model_type or config.config_name}`"
            + (f", overrides `{config.config_overrides}`" if config.config_overrides else "")
            + ")"
        )
    )
    data = config.dataset_name or ", ".join(
        f"`{Path(p).name}`" for p in (config.train_file, config.validation_file) if p
    )
    lines.append(
        f"A {objective.summary.lower()} model {origin} on {data or 'the given data'} "
        f"with [lmctl](https://pypi.org/project/lmctl/) {__version__} (`{engine}` engine)."
    )
    if config.peft:
        lines.append("")
        lines.append(
            f"This repository holds a LoRA adapter (r {config.lora_r}, alpha {config.lora_alpha}):"
            f" load it with `peft.PeftModel.from_pretrained(base_model, ...)`"
            + (
                "; `merged/` holds the adapter merged into full weights."
                if config.merge_adapter
                else "."
            )
        )
    if resumed:
        lines.append("")
        lines.append("Training was interrupted and resumed from a checkpoint with `lmctl resume`.")
    if results:
        lines += ["", "## Results", "", "| metric | value |", "| --- | --- |"]
        for key, value in results.items():
            lines.append(f"| {key} | {_card_value(value)} |")
    lines += [
        "",
        "## Training",
        "",
        "```",
        command or command_line(),
        "```",
        "",
        f"The full resolved configuration is in `{CONFIG_FILE}`; per-step metrics are in "
        f"`{METRICS_LOG}`.",
        "",
        "| hyperparameter | value |",
        "| --- | --- |",
    ]
    for key in (
        "learning_rate",
        "per_device_train_batch_size",
        "gradient_accumulation_steps",
        "num_train_epochs",
        "max_steps",
        "lr_scheduler_type",
        "warmup_steps",
        "weight_decay",
        "seed",
        "deepspeed",
        "fsdp",
        "peft",
    ):
        lines.append(f"| {key} | {getattr(config, key)} |")
    lines += ["", "## Framework versions", ""]
    shown = versions or framework_versions()
    lines += [f"- {name} {version}" for name, version in shown.items()]
    atomic_write(path / "README.md", "\n".join(lines) + "\n")


def framework_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"lmctl": __version__}
    for name in ("transformers", "torch", "datasets", "accelerate", "tokenizers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def _card_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if math.isfinite(value) else str(value)
    return str(value)


def _json_value(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    return value


def _json_default(value: Any) -> Any:
    if hasattr(value, "item"):
        return value.item()
    return str(value)


def write_json(path: Path, data: dict[str, Any]) -> None:
    """A results file, written atomically (upstream layout: indented, sorted keys)."""
    atomic_write(path, json.dumps(data, indent=4, sort_keys=True, default=_json_default) + "\n")
