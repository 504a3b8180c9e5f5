"""Evaluating a model outside training: a run directory, one of its checkpoints, or a bare
model directory.

A run (or a checkpoint inside one) brings its objective and data from the saved
``lmctl.yaml``; a bare model needs the objective (``--task``, or inferred from the
architecture in its ``config.json``) and data. Either way the shared pipeline
(:func:`lmctl.pipeline.prepare`) loads the model, tokenizer and validation data exactly as
training does, and the loop below feeds the objective's deterministic eval collator and
per-batch metrics, so memory does not grow with the evaluation set and two evaluations of the
same weights on the same data give identical numbers.

Where results go: ``--output FILE`` writes them there. Otherwise, for a run or checkpoint
directory, ``eval_results.json`` is written into it only when it has none yet (training's
final evaluation writes one); ``--overwrite-results`` replaces it. The eval keys of
``all_results.json`` are updated with it; its train keys are never touched. For a bare model
directory nothing is written without ``--output``.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any, Literal

from lmctl.config.base import TrainConfig
from lmctl.config.fields import flag_name
from lmctl.errors import ConfigError, Interrupted, ModelError
from lmctl.metrics import loss_metrics
from lmctl.metrics.lm_head import TiledHead
from lmctl.models.pretrained import looks_like_path
from lmctl.objectives import OBJECTIVES, get_objective
from lmctl.run import checkpoints, history, rundir
from lmctl.run.plots import write_loss_plot
from lmctl.run.resume import resume_command
from lmctl.storage.locations import localize
from lmctl.storage.paths import is_remote, local_path

if TYPE_CHECKING:
    from lmctl.console import Console
    from lmctl.objectives.base import Objective
    from lmctl.pipeline import Prepared

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


# Finding what to evaluate ---------------------------------------------------------------------


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


# The evaluation config --------------------------------------------------------------------------


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


# Where results go --------------------------------------------------------------------------------


def results_destination(
    target: Target, output: str | None, overwrite: bool, console: Console
) -> Path | None:
    """Where results will be written (None: nowhere). Decided before any heavy work."""
    if output is not None:
        file = Path(output).expanduser()
        if file.is_dir():
            raise ConfigError(f"--output {output}: is a directory", "give a file name")
        if not file.parent.is_dir():
            raise ConfigError(
                f"--output {output}: no such directory {file.parent}", "create it first"
            )
        if file.exists():
            console.warn(f"--output {output}: replacing the existing file")
        return file
    if target.results_dir is None:
        what = "a remote model" if is_remote(target.path) else "a bare model directory"
        console.info(f"{what}: results are not saved (give --output FILE)")
        return None
    existing = target.results_dir / RESULTS_FILE
    if existing.exists() and not overwrite:
        # Re-evaluating a finished run is the common case: its results go to stdout only.
        console.info(
            f"{existing} exists: keeping it, results on stdout only (give "
            "--overwrite-results to replace it, or --output FILE)"
        )
        return None
    if existing.exists():
        console.warn(f"replacing {existing} (--overwrite-results)")
    return existing


def save(target: Target, destination: Path, metrics: dict[str, Any]) -> None:
    own = target.results_dir / RESULTS_FILE if target.results_dir is not None else None
    if target.kind == "run" and destination == own:
        # The run's own results: all_results.json gets the eval keys, its train keys stay.
        history.save_results(destination.parent, "eval", metrics)
    else:
        history.write_json(destination, metrics)


def record_in_run(target: Target, metrics: dict[str, Any], console: Console) -> None:
    """An evaluation of a run's weights on its own data joins the run's metrics log, and its
    loss.png is redrawn with it."""
    weights = Path(target.weights)
    if target.kind == "model" or not weights.is_dir():
        return
    is_checkpoint = checkpoints.CHECKPOINT_PATTERN.match(weights.name) is not None
    run_dir = weights.parent if is_checkpoint else weights
    if not (run_dir / rundir.CONFIG_FILE).is_file():
        return
    if is_checkpoint:
        step = checkpoints.checkpoint_step(weights)
    else:
        try:
            step = int(json.loads((run_dir / history.STATE_FILE).read_text())["global_step"])
        except (OSError, ValueError, KeyError, TypeError):
            return
    history.append_metrics(run_dir, {"event": "eval", "step": step, **metrics})
    write_loss_plot(run_dir, console)


# The command -------------------------------------------------------------------------------------


def run_evaluation(
    path: str,
    *,
    task: str | None,
    options: dict[str, Any],
    output: str | None,
    overwrite_results: bool,
    console: Console,
    allow_random_head: bool = False,
) -> dict[str, Any]:
    target = resolve_target(path, task)
    config = eval_config(target, options)
    destination = results_destination(target, output, overwrite_results, console)
    console.info(f"evaluating {target.weights} ({target.objective.name}, {target.kind})")
    if target.kind == "run" and checkpoints.CHECKPOINT_PATTERN.match(Path(target.weights).name):
        console.info(f"{path} has no final model yet: evaluating its newest checkpoint")
    saved = target.saved
    if (
        saved.get("do_eval") is False
        and saved.get("train_file")
        and not saved.get("validation_file")
        and not any(key in options for key in ("validation_file", "dataset_name"))
    ):
        console.warn(
            f"{path} trained with --no-eval on all of {saved['train_file']}: the part held out "
            "for evaluation here was seen in training; give --validation-file for a fair number"
        )
    from lmctl.pipeline import prepare

    try:
        prepared = prepare(
            config,
            target.objective,
            Path(target.weights),
            console,
            random_head_ok=allow_random_head,
        )
        metrics = evaluate_prepared(prepared, console)
    except KeyboardInterrupt:
        console.stop_progress()
        raise Interrupted("evaluation interrupted; nothing was written") from None
    if destination is not None:
        save(target, destination, metrics)
        console.info(f"results written to {destination}")
    if not any(key in options for key in SOURCE_FIELDS):
        record_in_run(target, metrics, console)
    return {
        "path": path,
        "kind": target.kind,
        "objective": target.objective.name,
        "model": target.weights,
        "metrics": metrics,
        "results_file": str(destination) if destination is not None else None,
    }
