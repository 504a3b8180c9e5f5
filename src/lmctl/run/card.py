"""The model card (``README.md``) of a run directory: written at the end of training, and
regenerated from the run's config and current results before a push."""

from __future__ import annotations

import re
import shlex
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl import HOME, __version__, secrets
from lmctl.config.slices import AdapterSpec, DataSpec, LoopSpec, ModelSpec, OptimizerSpec, take
from lmctl.console import format_number
from lmctl.run.history import METRICS_LOG, Segment, load_results, segments
from lmctl.run.launch import user_arguments
from lmctl.run.rundir import CONFIG_FILE, read_config, record_written
from lmctl.storage.atomic import atomic_write
from lmctl.storage.paths import is_remote, local_path

if TYPE_CHECKING:
    from lmctl.console import Console
    from lmctl.objectives.base import Objective

_CARD_COMMAND = re.compile(r"^## Training\n\n```\n(.+?)\n```", re.MULTILINE | re.DOTALL)
_CARD_VERSIONS = re.compile(r"^## Framework versions\n\n((?:- \S+ .+\n?)+)", re.MULTILINE)


@dataclass(frozen=True)
class CardFacts:
    """What the card tells of a run: where the model and data came from, the adapter, and
    the settings that decided the training."""

    model: ModelSpec
    data: DataSpec
    adapter: AdapterSpec
    optimizer: OptimizerSpec
    loop: LoopSpec


def command_line() -> str:
    """This run's command as the user gave it, named ``lmctl`` whatever path the program
    was started by (a virtual environment's ``bin/lmctl``, ``python -m lmctl``, a launcher),
    with tokens hidden."""
    args = ["lmctl", *user_arguments()]
    return secrets.mask_text(shlex.join(_redact(args)))


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


def write_model_card(
    path: Path,
    facts: CardFacts,
    *,
    objective: Objective,
    results: dict[str, Any],
    final_step: int | None = None,
    command: str | None = None,
    versions: dict[str, str] | None = None,
) -> None:
    """Write the model card.

    Its Training section shows the command of each segment of the run (the start, each
    resume, each restart) as ``metrics.jsonl`` records them; ``final_step``: where the
    segment that writes the card finished (its ``finished`` event is written after the
    card). A run that recorded no command shows ``command``, by default this process's.
    ``versions``: the libraries, by default this process's (a card regenerated later keeps
    the original ones).
    """
    import yaml

    model, data, adapter = facts.model, facts.data, facts.adapter
    base_model = published_model_name(model.model_name_or_path)
    datasets = [data.dataset_name] if data.dataset_name else []
    metadata: dict[str, Any] = {
        # An adapter run publishes a peft adapter (with its merged weights in merged/).
        "library_name": "peft" if adapter.peft else "transformers",
        "pipeline_tag": objective.task_tag,
        "tags": ["lmctl", *objective.model_card_tags()],
    }
    if base_model:
        metadata["base_model"] = base_model
    if datasets:
        metadata["datasets"] = datasets
    lines = ["---", yaml.safe_dump(metadata, sort_keys=False).strip(), "---", ""]
    lines += [f"# {path.name or 'model'}", ""]
    origin = (
        f"fine-tuned from `{base_model}`"
        if base_model
        else (
            f"trained from scratch (`{model.model_type or model.config_name}`"
            + (f", overrides `{model.config_overrides}`" if model.config_overrides else "")
            + ")"
        )
    )
    source = data.dataset_name or ", ".join(
        f"`{Path(p).name}`" for p in (data.train_file, data.validation_file) if p
    )
    lines.append(
        f"A {objective.summary.lower()} model {origin} on {source or 'the given data'} "
        f"with [lmctl]({HOME}) {__version__} (`{facts.loop.engine}` engine)."
    )
    if adapter.peft:
        lines += [
            "",
            f"This repository holds a LoRA adapter (r {adapter.lora_r}, alpha "
            f"{adapter.lora_alpha}): load it with `peft.PeftModel.from_pretrained(base_model, ...)`"
            + (
                "; `merged/` holds the adapter merged into full weights."
                if adapter.merge_adapter
                else "."
            ),
        ]
    if results:
        lines += ["", "## Results", "", "| metric | value |", "| --- | --- |"]
        for key, value in results.items():
            lines.append(f"| {key} | {_card_value(value)} |")
    lines += [
        "",
        "## Training",
        "",
        "```",
        *(training_commands(segments(path, final_step)) or [command or command_line()]),
        "```",
        "",
        f"The full resolved configuration is in `{CONFIG_FILE}`; per-step metrics are in "
        f"`{METRICS_LOG}`.",
        "",
        "| hyperparameter | value |",
        "| --- | --- |",
    ]
    for key, value in deciding_settings(facts.optimizer, facts.loop).items():
        lines.append(f"| {key} | {value} |")
    lines += ["", "## Framework versions", ""]
    shown = versions or framework_versions()
    lines += [f"- {name} {version}" for name, version in shown.items()]
    atomic_write(path / "README.md", "\n".join(lines) + "\n")
    record_written(path, "README.md")


def training_commands(stretches: list[Segment]) -> list[str]:
    """The card's lines for a run's segments: each command, and when the run took more than
    one plain start, what each segment was as a comment above it. A restart by the elastic
    agent ran its segment's command again, so it has only its comment."""
    if [segment.event for segment in stretches] == ["start"]:
        return [stretches[0].command or ""]
    lines: list[str] = []
    for index, segment in enumerate(stretches):
        last = index == len(stretches) - 1
        lines.append("# " + _segment_note(segment, first=index == 0, last=last))
        if segment.command and segment.event != "restart":
            lines.append(segment.command)
    return lines


def _segment_note(segment: Segment, *, first: bool, last: bool) -> str:
    if segment.event == "start":
        what = "trained from step 0"
    elif segment.event == "restart":
        what = f"restarted by the elastic agent from step {segment.step}"
    elif segment.extends:
        what = f"extended the finished run from step {segment.step}"
    elif first:
        what = f"continued from a checkpoint at step {segment.step}"
    else:
        what = f"continued after an interruption from step {segment.step}"
    if segment.end is not None:
        return f"{what} to step {segment.end}"
    return what if last else f"{what}; interrupted"


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def published_model_name(name: str | None) -> str | None:
    """How a model card names the base model: as the user named it (``--model``), a Hub id
    as it is and a local folder or a storage URL by its last name only, so that no local
    path is published. A local copy's ``_name_or_path`` is not taken for its origin: it
    records whatever the copy was last loaded from, which may be another model."""
    if not name:
        return None
    if name.startswith("hf://"):
        return name.removeprefix("hf://")
    if is_remote(name):
        return name.rstrip("/").rsplit("/", 1)[-1] or None
    path = local_path(name)
    if path.is_absolute() or path.exists() or not _HUB_ID.match(name):
        return path.resolve().name or None
    return name


def deciding_settings(optimizer: OptimizerSpec, loop: LoopSpec) -> dict[str, Any]:
    """The hyperparameters that decided the run: the length is either the epochs or
    --max-steps (which overrides them), the warmup either a ratio or steps."""
    settings: dict[str, Any] = {
        "learning_rate": optimizer.learning_rate,
        "per_device_train_batch_size": loop.per_device_train_batch_size,
        "gradient_accumulation_steps": loop.gradient_accumulation_steps,
    }
    if loop.max_steps:
        settings["max_steps"] = loop.max_steps
    else:
        settings["num_train_epochs"] = loop.num_train_epochs
    settings["lr_scheduler_type"] = optimizer.lr_scheduler_type
    if optimizer.warmup_ratio is not None:
        settings["warmup_ratio"] = optimizer.warmup_ratio
    elif optimizer.warmup_steps:
        settings["warmup_steps"] = optimizer.warmup_steps
    settings["weight_decay"] = optimizer.weight_decay
    settings["seed"] = loop.seed
    return settings


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
    """Four decimals, as the results are rounded; a very large or small number (``total_flos``)
    in scientific notation, as the log shows it."""
    readable = isinstance(value, float) and (value == 0 or 1e-3 <= abs(value) < 1e6)
    if readable:
        return f"{value:.4f}"
    return format_number(value)


def refresh_model_card(run_dir: Path, console: Console) -> None:
    """Regenerate a run's model card from its config and current results.

    Results may have changed since training (``lmctl eval`` updates them). The training
    commands come from the run's ``metrics.jsonl``; for a run that recorded none, the one of
    the existing card, else the command that reproduces the run from its resolved config.
    The framework versions are kept from the existing card (without one, the current ones).
    """
    from lmctl.objectives import OBJECTIVES, get_objective

    data = read_config(run_dir)
    name = data.pop("objective", None)
    if name not in OBJECTIVES:
        console.warn(f"{run_dir / CONFIG_FILE}: unknown objective {name!r}; card kept")
        return
    objective = get_objective(name)
    fields = {
        key: value for key, value in data.items() if key in objective.config_class.model_fields
    }
    # The saved config was validated when the run started; its data files may be gone since.
    config = objective.config_class.model_construct(**fields)
    card = run_dir / "README.md"
    old = card.read_text(encoding="utf-8") if card.is_file() else ""
    found = _CARD_COMMAND.search(old)
    command = found.group(1) if found else f"lmctl train {name} --config {CONFIG_FILE}"
    listed = _CARD_VERSIONS.search(old)
    versions = (
        dict(line[2:].split(" ", 1) for line in listed.group(1).strip().splitlines())
        if listed
        else None
    )
    write_model_card(
        run_dir,
        CardFacts(
            take(ModelSpec, config),
            take(DataSpec, config),
            take(AdapterSpec, config),
            take(OptimizerSpec, config),
            take(LoopSpec, config),
        ),
        objective=objective,
        results=load_results(run_dir),
        command=command,
        versions=versions,
    )
