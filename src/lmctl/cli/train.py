"""``lmctl train <objective>``: one command per objective, flags generated from its config."""

from __future__ import annotations

import inspect
import json
from collections.abc import Callable
from typing import Annotated, Any

import typer
from pydantic.fields import FieldInfo

from lmctl.cli.help import CommandDoc, add_command, add_group
from lmctl.cli.options import ConfigOpt, DryRunOpt, JsonOpt, NoProgressOpt, QuietOpt
from lmctl.cli.params import config_parameters, given, with_signature
from lmctl.cli.runner import run_command
from lmctl.config.base import TrainConfig
from lmctl.console import Console, OutputOptions
from lmctl.distributed import is_main_process
from lmctl.objectives import OBJECTIVES, get_objective

# Keys whose absence (on the command line and in the config file) selects an objective's
# embedded default run.
SOURCE_KEYS = (
    "model_name_or_path",
    "model_type",
    "config_name",
    "dataset_name",
    "train_file",
    "validation_file",
)

#: The prompt of the one continuation that the embedded default run of an objective ends with
#: (lmctl predict shows more).
SAMPLE_PROMPTS = {"clm": "Shall I compare thee"}

EXAMPLES = {
    "clm": """
Train a tiny GPT-2 on the bundled Shakespeare corpus (no model, no data needed):

    lmctl train clm

Fine-tune a local model on your text:

    lmctl train clm --model ./gpt2-small --train-file corpus.txt \\
        --block-size 512 -o runs/mine

From scratch with a new tokenizer, in CI:

    lmctl train clm --model-type gpt2 \\
        --config-overrides n_layer=2,n_embd=64,n_head=2 \\
        --train-tokenizer 8000 --train-file a.txt --validation-file b.txt \\
        --max-steps 30 --json
""",
    "mlm": """
Fine-tune a local BERT on your text, one sample per non-empty line:

    lmctl train mlm --model ./bert-small --train-file corpus.txt \\
        --line-by-line

From scratch with a WordPiece tokenizer trained on the data, whole-word masking:

    lmctl train mlm --model-type bert \\
        --config-overrides num_hidden_layers=4,hidden_size=256 \\
        --train-tokenizer 8000 --train-file a.txt --whole-word-mask \\
        --max-seq-length 128
""",
    "plm": """
XLNet from scratch (permutation needs an even --max-seq-length):

    lmctl train plm --model-type xlnet \\
        --config-overrides d_model=256,n_layer=4,n_head=4 \\
        --train-tokenizer 8000 --train-file a.txt --max-seq-length 128

Fine-tune a local XLNet line by line:

    lmctl train plm --model ./xlnet-base --train-file corpus.txt \\
        --line-by-line
""",
    "swag": """
Fine-tune on the Hub's SWAG (the default data when the Hub is reachable):

    lmctl train swag --model ./bert-base --max-seq-length 128

Your own multiple-choice records (any number of endings):

    lmctl train swag --model ./bert-base \\
        --train-file train.jsonl --validation-file dev.jsonl \\
        --context-column question --question-column "" \\
        --ending-columns a,b,c --label-column answer
""",
}


#: Hidden: the TrainingArguments fields given as flags, as JSON (see lmctl.cli.upstream).
TrainingArgsOpt = Annotated[str | None, typer.Option("--training-args", hidden=True)]


def cli_only_parameters(*, dry_run: bool = True) -> list[inspect.Parameter]:
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("config_file", kw, default=None, annotation=ConfigOpt),
        inspect.Parameter("json_output", kw, default=False, annotation=JsonOpt),
        inspect.Parameter("quiet", kw, default=False, annotation=QuietOpt),
        inspect.Parameter("no_progress", kw, default=False, annotation=NoProgressOpt),
    ]
    if dry_run:
        params.append(inspect.Parameter("dry_run", kw, default=False, annotation=DryRunOpt))
    return params


#: Runs one objective command: (objective, flags given, config file, dry run, console).
#: With ``extra`` options the fourth argument is their values instead of the dry-run switch.
CommandBody = Callable[[str, dict[str, Any], str | None, Any, Console], dict[str, Any]]


def objective_command(
    name: str,
    verb: str,
    body: CommandBody,
    doc: str,
    *,
    include: Callable[[str, FieldInfo], bool] | None = None,
    extra: list[inspect.Parameter] | None = None,
    training_args: bool = False,
) -> Any:
    """``lmctl <verb> <name>``: the objective's config fields (those ``include`` keeps) as
    flags, plus the CLI-only options; ``body`` gets the flags that were actually given.

    ``extra`` replaces ``--dry-run`` with other command options; their values are passed to
    ``body`` in place of the dry-run switch, as a mapping. ``training_args`` adds the hidden
    option that carries TrainingArguments fields given as upstream flags.
    """
    config_class = get_objective(name).config_class

    def command(**values: Any) -> None:
        output = OutputOptions(
            json=values.pop("json_output"),
            quiet=values.pop("quiet"),
            no_progress=values.pop("no_progress"),
        )
        config_file = values.pop("config_file")
        dry_run: Any = (
            {p.name: values.pop(p.name) for p in extra} if extra else values.pop("dry_run")
        )
        passthrough = values.pop("training_args_json", None)
        cli_values = given(values, config_class)
        if passthrough:
            cli_values["training_args"] = json.loads(passthrough)
        run_command(
            lambda console: body(name, cli_values, config_file, dry_run, console),
            output,
            f"{verb} {name}",
        )

    params = config_parameters(config_class, include=include)
    params += cli_only_parameters(dry_run=extra is None) + (extra or [])
    if training_args:
        kw = inspect.Parameter.KEYWORD_ONLY
        params.append(
            inspect.Parameter("training_args_json", kw, default=None, annotation=TrainingArgsOpt)
        )
    return with_signature(command, params, doc)


def _make_command(name: str) -> Any:
    doc = f"{get_objective(name).summary}.\n\n{EXAMPLES.get(name, '')}"
    return objective_command(name, "train", run_train, doc, training_args=True)


def run_train(
    name: str,
    cli_values: dict[str, Any],
    config_file: str | None,
    dry_run: bool,
    console: Console,
) -> dict[str, Any]:
    from dataclasses import asdict

    from lmctl.config.slices import LaunchSpec, RunDirSpec, take
    from lmctl.run.launch import relaunch
    from lmctl.run.lock import holding
    from lmctl.run.restarts import continue_after_restart
    from lmctl.run.rundir import check_location, check_output_dir

    objective = get_objective(name)
    config = resolve_train_config(name, cli_values, config_file, console)
    if dry_run:
        from lmctl.config.loader import dump_config

        resolved = {"objective": name, **dump_config(config, masked=True)}
        # The estimate (with --no-fit-check, none: no torch and transformers to import).
        memory = fit_check(config, name) if config.fit_check else None
        if not console.options.json:
            import yaml

            console.write(yaml.safe_dump(resolved, sort_keys=False))
            if memory is not None:
                console.write(memory.lines())
        planned: dict[str, Any] = {"dry_run": True, "config": resolved}
        if memory is not None:
            planned["memory"] = {**memory.table(), "fits": memory.fits}
        return planned
    launch = take(LaunchSpec, config)
    if config.fit_check and checks_fit_here():
        # Before the model is built or any data read, and once: in the process that
        # launches the others.
        memory = fit_check(config, name)
        if memory is not None and not memory.fits:
            from lmctl.run.fit import refusal

            raise refusal(memory, can_lora=config.model_name_or_path is not None)
    check_location(take(RunDirSpec, config))
    # The run directory is this run's alone before anything in it is checked or removed.
    with holding(take(RunDirSpec, config), launch, console, f"lmctl train {name}"):
        relaunch(launch, console)
        spec = continue_after_restart(take(RunDirSpec, config))
        config = config.model_copy(update=asdict(spec))
        if is_main_process():
            check_output_dir(spec)
        from lmctl.engine import train

        result = train(config, objective, console)
    if is_main_process():
        console.summary(
            f"lmctl train {name}: {result['output_dir']}",
            headline(result["metrics"], result["output_dir"]),
        )
        if name in SAMPLE_PROMPTS and runs_embedded_default(name, cli_values, config_file):
            from lmctl.prediction import sample_line

            # A taste of the tiny model; it says a warning instead of failing the run.
            sample_line(result["output_dir"], SAMPLE_PROMPTS[name], console)
    return result


def checks_fit_here() -> bool:
    """The fit check runs where the run starts: not again in the processes that lmctl's own
    launcher started (it checked before launching them), nor after a restart."""
    import os

    from lmctl.distributed import launched, restart_count
    from lmctl.run.launch import ARGUMENTS_ENV

    return not (launched() and (ARGUMENTS_ENV in os.environ or restart_count() > 0))


def fit_check(config: TrainConfig, name: str) -> Any:
    """The run's memory estimate against the free memory (None when it can't be made)."""
    from lmctl.config.slices import (
        Access,
        AdapterSpec,
        ComputeSpec,
        LaunchSpec,
        LoopSpec,
        ModelSpec,
        ScaleSpec,
        TokenizerSpec,
        take,
    )
    from lmctl.run.fit import check_fit

    objective = get_objective(name)
    return check_fit(
        objective,
        take(objective.options_class, config),
        model=take(ModelSpec, config),
        access=take(Access, config),
        loop=take(LoopSpec, config),
        compute=take(ComputeSpec, config),
        scale=take(ScaleSpec, config),
        adapter=take(AdapterSpec, config),
        launch=take(LaunchSpec, config),
        tokenizer=take(TokenizerSpec, config),
    )


def resolve_train_config(
    name: str, cli_values: dict[str, Any], config_file: str | None, console: Console
) -> TrainConfig:
    """The config ``lmctl train NAME`` runs with these flags and config file (the embedded
    default when neither names a model or data, the default run directory fixed)."""
    from lmctl.config.loader import build_config, read_config_file, with_output_dir
    from lmctl.run.rundir import run_dir_of_config

    objective = get_objective(name)
    file_keys = set(read_config_file(config_file, objective.config_class)) if config_file else set()
    defaults: dict[str, Any] = {}
    embedded = objective.embedded_default()
    if embedded and _names_no_source(cli_values, file_keys):
        defaults = embedded
    config = build_config(
        objective.config_class,
        cli_values=cli_values,
        config_file=config_file,
        defaults=defaults,
        objective=name,
    )
    if defaults:
        console.info(embedded_default_line(config, defaults, set(cli_values) | file_keys))
    owner = run_dir_of_config(config_file) if config_file else None
    if owner is not None and "output_dir" not in cli_values:
        # A run's own config targets that run, wherever it was first written for (a copy's
        # lmctl.yaml names the original's directory).
        config = config.model_copy(update={"output_dir": str(owner)})
    return with_output_dir(config)


def _names_no_source(cli_values: dict[str, Any], file_keys: set[str]) -> bool:
    """Neither the flags nor the config file name a model or data: the embedded default."""
    return not any(key in cli_values or key in file_keys for key in SOURCE_KEYS)


def runs_embedded_default(name: str, cli_values: dict[str, Any], config_file: str | None) -> bool:
    from lmctl.config.loader import read_config_file

    objective = get_objective(name)
    if objective.embedded_default() is None:
        return False
    file_keys = set(read_config_file(config_file, objective.config_class)) if config_file else set()
    return _names_no_source(cli_values, file_keys)


def embedded_default_line(config: Any, defaults: dict[str, Any], given_keys: set[str]) -> str:
    """One line saying that the embedded default runs, with the settings of its own that
    apply (they differ from the defaults that --help shows)."""
    from pathlib import Path

    from lmctl.config.fields import flag_name

    settings = [
        key
        for key in defaults
        if key not in SOURCE_KEYS and key not in given_keys and key != "config_overrides"
    ]
    if config.max_steps:
        settings = [key for key in settings if key != "num_train_epochs"]
    shown = ", ".join(f"{flag_name(key)} {getattr(config, key)}" for key in settings)
    return (
        f"no model and no data given: training the embedded default, a small "
        f"{config.model_type} ({config.config_overrides}) from scratch on "
        f"{Path(str(config.train_file)).name}, with its own settings: {shown}"
    )


def headline(metrics: dict[str, Any], run_dir: str | None = None) -> dict[str, Any]:
    """The numbers of the end-of-run summary, with the loss curves as sparklines."""
    keys = (
        "train_loss",
        "eval_loss",
        "perplexity",
        "eval_accuracy",
        "train_samples",
        "eval_samples",
        "train_runtime",
    )
    shown: dict[str, Any] = {key: metrics[key] for key in keys if key in metrics}
    # A mixture's shares as trained on (train_sources).
    shown.update(
        {k: v for k, v in metrics.items() if k.startswith("train_") and k.endswith("_share")}
    )
    if run_dir is not None:
        from pathlib import Path

        from lmctl.run.summary import sparklines

        shown.update(sparklines(Path(run_dir)))
    return shown


def register(app: typer.Typer, parent: CommandDoc) -> None:
    group, doc = add_group(app, parent, "train", "Train or fine-tune a model.")
    for name in OBJECTIVES:
        add_command(group, doc, name, _make_command(name), get_objective(name).summary)
