"""What ``lmctl eval PATH`` evaluates: a run, one of its checkpoints, or a bare model, with
its objective; and the validated document of the evaluation (the run's saved settings, the
flags given, the weights, no training)."""

from __future__ import annotations

import json
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lmctl.config.base import TrainConfig
from lmctl.config.fields import flag_name
from lmctl.errors import ConfigError, ModelError
from lmctl.objectives import OBJECTIVES, get_objective
from lmctl.run import checkpoints, rundir
from lmctl.run.resume import resume_command
from lmctl.storage.locations import localize
from lmctl.storage.paths import is_remote, local_path, looks_like_path

if TYPE_CHECKING:
    from lmctl.objectives.base import Objective

MODEL_CONFIG = "config.json"
RESULTS_FILE = "eval_results.json"

#: Shared config fields that ``lmctl eval`` accepts (objective-specific fields are all
#: accepted: they decide how evaluation data is read, cut and masked).
EVAL_FIELDS = (
    "validation_file",
    "dataset_name",
    "dataset_config_name",
    "text_column",
    "max_eval_samples",
    "validation_split_percentage",
    "preprocessing_num_workers",
    "overwrite_cache",
    "per_device_eval_batch_size",
    "seed",
    "tokenizer_name",
    "dtype",
    "trust_remote_code",
    "imports",
    "cache_dir",
    "token",
)
#: Saved data settings that a new data source (--validation-file or --dataset-name) replaces.
SOURCE_FIELDS = (
    "train_file",
    "validation_file",
    "dataset_name",
    "dataset_config_name",
    "max_train_samples",
)
#: Saved settings that describe how the run built its model; the evaluated weights replace them.
MODEL_FIELDS = (
    "model_type",
    "config_overrides",
    "config_name",
    "train_tokenizer",
    "tokenizer_name",
)


@dataclass
class Target:
    """What ``lmctl eval PATH`` evaluates."""

    kind: Literal["run", "checkpoint", "model"]
    path: str
    weights: str
    objective: Objective
    saved: dict[str, Any] = field(default_factory=dict)
    results_dir: Path | None = None


def objective_fields() -> dict[str, type[TrainConfig]]:
    """Objective-specific config fields of every objective (name -> first config declaring it)."""
    out: dict[str, type[TrainConfig]] = {}
    for name in OBJECTIVES:
        model = get_objective(name).config_class
        for field_name in model.model_fields:
            if field_name not in TrainConfig.model_fields:
                out.setdefault(field_name, model)
    return out


def resolve_target(path: str, task: str | None) -> Target:
    """Classify PATH and decide the objective; light (reads JSON and YAML only) for local dirs."""
    if task is not None and task not in OBJECTIVES:
        raise ConfigError(
            f"--task {task}: unknown objective", "choose one of " + ", ".join(OBJECTIVES)
        )
    remote = is_remote(path)
    # A storage URL is fetched into the same local cache that training reads models from.
    local = localize(path) if remote else local_path(path)
    if not local.exists():
        if looks_like_path(path):
            raise ConfigError(
                f"{path}: no such directory",
                "give a run directory, a checkpoint directory or a model directory",
            )
        return Target("model", path, path, _model_objective(path, task, None))
    if not local.is_dir():
        raise ConfigError(
            f"{path}: not a directory",
            "give a run directory, a checkpoint directory or a model directory",
        )
    if (local / rundir.CONFIG_FILE).is_file():
        saved = rundir.read_config(local)
        objective = _saved_objective(saved, local / rundir.CONFIG_FILE, task)
        weights = _run_weights(local)
        # Results describe the weights evaluated: a run without a final model yet keeps
        # them in the checkpoint that was used. A fetched copy is not the run: no results.
        return Target("run", path, str(weights), objective, saved, None if remote else weights)
    parent = local.resolve().parent
    if checkpoints.CHECKPOINT_PATTERN.match(local.name) and (parent / rundir.CONFIG_FILE).is_file():
        problem = checkpoints.checkpoint_problem(local)
        if problem is not None:
            raise ConfigError(
                f"{path}: incomplete or corrupted checkpoint ({problem})",
                f"evaluate another checkpoint of {parent}, or the run itself",
            )
        saved = rundir.read_config(parent)
        objective = _saved_objective(saved, parent / rundir.CONFIG_FILE, task)
        return Target("checkpoint", path, str(local), objective, saved, local)
    if (local / MODEL_CONFIG).is_file():
        _check_model_files(local)
        return Target("model", path, str(local), _model_objective(str(local), task, local))
    raise ConfigError(
        f"{path} is neither a run directory ({rundir.CONFIG_FILE}), a checkpoint nor a model "
        f"directory ({MODEL_CONFIG})",
        "give the --output-dir of an 'lmctl train' run, one of its checkpoint-N folders, or a "
        "directory written by save_pretrained",
    )


def _saved_objective(saved: dict[str, Any], where: Path, task: str | None) -> Objective:
    name = saved.get("objective")
    if name not in OBJECTIVES:
        raise ConfigError(
            f"{where}: unknown objective {name!r}",
            "this run was written by another lmctl version; known: " + ", ".join(OBJECTIVES),
        )
    if task is not None and task != name:
        raise ConfigError(
            f"--task {task}: this run trained a {name} model",
            f"drop --task, or give --task {name}",
        )
    return get_objective(name)


def _run_weights(run_dir: Path) -> Path:
    """The run's final model, or its newest complete checkpoint when it has none yet."""
    if (run_dir / MODEL_CONFIG).is_file():
        _check_model_files(run_dir)
        return run_dir
    checkpoint = checkpoints.latest_checkpoint(run_dir)
    if checkpoint is None:
        raise ConfigError(
            f"{run_dir} has no model yet: no final model and no complete checkpoint",
            f"finish it first: {resume_command(run_dir)}",
        )
    return checkpoint


def _check_model_files(folder: Path) -> None:
    """Refuse a final model whose files do not match the manifest of its save."""
    problem = checkpoints.model_problem(folder)
    if problem is not None:
        raise ModelError(
            f"{folder}: the model is incomplete or corrupted ({problem})",
            "train it again, or evaluate one of its checkpoints (lmctl eval "
            f"{folder}/checkpoint-N)",
        )


def _model_objective(name: str, task: str | None, local: Path | None) -> Objective:
    if task is not None:
        return get_objective(task)
    architectures = _architectures(name, local)
    inferred = infer_objective(architectures)
    if inferred is None:
        shown = ", ".join(architectures) or "none recorded"
        raise ConfigError(
            f"{name}: cannot tell which objective its architecture ({shown}) is for",
            "give --task " + "|".join(OBJECTIVES),
        )
    return get_objective(inferred)


def _architectures(name: str, local: Path | None) -> list[str]:
    if local is not None:
        try:
            data = json.loads((local / MODEL_CONFIG).read_text())
        except (OSError, ValueError) as exc:
            raise ConfigError(
                f"{local / MODEL_CONFIG}: unreadable ({exc})", "give a save_pretrained directory"
            ) from None
        found = data.get("architectures") if isinstance(data, dict) else None
    else:
        from transformers import AutoConfig

        from lmctl.models.pretrained import load_pretrained

        found = load_pretrained(AutoConfig.from_pretrained, name, "PATH").architectures
    return [str(item) for item in found or []]


def infer_objective(architectures: list[str]) -> str | None:
    """The objective whose model class is one of ``architectures``.

    Each objective's own model class decides (``Objective.auto_model_class``): when several
    build it, the most specific one wins (a dedicated class over a whole Auto family).
    Unregistered (remote-code) classes fall back to the Auto class's naming convention,
    e.g. ``*ForCausalLM`` for ``AutoModelForCausalLM``.
    """
    claims: dict[str, int] = {}
    suffixes: dict[str, str] = {}
    for name in OBJECTIVES:
        objective = get_objective(name)
        model_class = objective.auto_model_class()
        classes = objective.model_classes()
        if any(arch in classes for arch in architectures):
            claims[name] = len(classes)
        suffix = model_class.__name__.removeprefix("AutoModel")
        # Only objectives that train a whole Auto family claim its unregistered classes.
        if suffix.startswith("For") and any(known.endswith(suffix) for known in classes):
            suffixes[name] = suffix
    if claims:
        best = min(claims.values())
        winners = [name for name, size in claims.items() if size == best]
        return winners[0] if len(winners) == 1 else None
    matches = [
        name
        for name, suffix in suffixes.items()
        if any(arch.endswith(suffix) for arch in architectures)
    ]
    return matches[0] if len(matches) == 1 else None


def eval_config(target: Target, options: dict[str, Any]) -> TrainConfig:
    """A validated config for evaluating ``target``: the run's saved settings (or none for a
    bare model), the flags given, the target's weights, no training."""
    from lmctl.config.loader import build_config

    objective = target.objective
    known = objective.config_class.model_fields
    foreign = [flag_name(name) for name in options if name not in known]
    if foreign:
        raise ConfigError(
            f"{', '.join(foreign)} does not apply to {objective.name} models "
            f"(the objective of {target.path})",
            f"drop {', '.join(foreign)}",
        )
    values = {key: value for key, value in target.saved.items() if key != "objective"}
    if "validation_file" in options or "dataset_name" in options:
        for name in SOURCE_FIELDS:
            values.pop(name, None)
    elif values.get("validation_file"):
        # Only the validation file is read; the training data need not even exist any more.
        values.pop("train_file", None)
        values.pop("max_train_samples", None)
        _check_published_data(str(values["validation_file"]), target)
    for name in MODEL_FIELDS:
        values.pop(name, None)
    if target.kind == "model" and not any(
        key in options for key in ("validation_file", "dataset_name")
    ):
        raise ConfigError(
            f"{target.path} is a model directory without a run config: it needs evaluation data",
            "give --validation-file FILE or --dataset-name NAME",
        )
    forced = {
        "model_name_or_path": target.weights,
        "do_train": False,
        "do_eval": True,
        "resume_from_checkpoint": None,
    }
    return build_config(
        objective.config_class,
        cli_values={**options, **forced},
        defaults=values,
        objective=objective.name,
    )


def _check_published_data(name: str, target: Target) -> None:
    """A run keeps its data paths absolute; a published one names its files by their names
    alone (``lmctl push`` leaves the local paths out), which only the user can point at."""
    import os

    from lmctl.storage.paths import local_path, url_scheme

    if url_scheme(name) is not None or os.path.isabs(name) or local_path(name).exists():
        return
    raise ConfigError(
        f"{target.path} was published without the local paths of the machine that trained it: "
        f"its lmctl.yaml names the validation file {name!r}, which is not here",
        "give --validation-file FILE (or --dataset-name NAME) to evaluate on",
    )
