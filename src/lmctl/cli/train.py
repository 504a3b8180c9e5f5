"""``lmctl train <objective>``: one command per objective, flags generated from its config."""

from __future__ import annotations

import inspect
from collections.abc import Callable
from typing import Any

import typer
from pydantic.fields import FieldInfo

from lmctl.cli.options import ConfigOpt, DryRunOpt, JsonOpt, NoProgressOpt, QuietOpt
from lmctl.cli.params import config_parameters, given, with_signature
from lmctl.cli.runner import run_command
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

EXAMPLES = {
    "clm": """
Train a tiny GPT-2 on the bundled Shakespeare corpus (no model, no data needed):

    lmctl train clm

Fine-tune a local model on your text:

    lmctl train clm --model ./gpt2-small --train-file corpus.txt --block-size 512 -o runs/mine

From scratch with a new tokenizer, in CI:

    lmctl train clm --model-type gpt2 --config-overrides n_layer=2,n_embd=64,n_head=2 \\
        --train-tokenizer 8000 --train-file a.txt --validation-file b.txt --max-steps 30 --json
""",
    "mlm": """
Fine-tune a local BERT on your text, one sample per non-empty line:

    lmctl train mlm --model ./bert-small --train-file corpus.txt --line-by-line

From scratch with a WordPiece tokenizer trained on the data, whole-word masking:

    lmctl train mlm --model-type bert --config-overrides num_hidden_layers=4,hidden_size=256 \
        --train-tokenizer 8000 --train-file a.txt --whole-word-mask --max-seq-length 128
""",
    "plm": """
XLNet from scratch (permutation needs an even --max-seq-length):

    lmctl train plm --model-type xlnet --config-overrides d_model=256,n_layer=4,n_head=4 \
        --train-tokenizer 8000 --train-file a.txt --max-seq-length 128

Fine-tune a local XLNet line by line:

    lmctl train plm --model ./xlnet-base --train-file corpus.txt --line-by-line
""",
    "swag": """
Fine-tune on the Hub's SWAG (the default data when the Hub is reachable):

    lmctl train swag --model ./bert-base --max-seq-length 128

Your own multiple-choice records (any number of endings):

    lmctl train swag --model ./bert-base --train-file train.jsonl --validation-file dev.jsonl \
        --context-column question --question-column "" --ending-columns a,b,c --label-column answer
""",
}

train_app = typer.Typer(
    name="train",
    help="Train or fine-tune a model.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
)


def cli_only_parameters() -> list[inspect.Parameter]:
    kw = inspect.Parameter.KEYWORD_ONLY
    return [
        inspect.Parameter("config_file", kw, default=None, annotation=ConfigOpt),
        inspect.Parameter("json_output", kw, default=False, annotation=JsonOpt),
        inspect.Parameter("quiet", kw, default=False, annotation=QuietOpt),
        inspect.Parameter("no_progress", kw, default=False, annotation=NoProgressOpt),
        inspect.Parameter("dry_run", kw, default=False, annotation=DryRunOpt),
    ]


#: Runs one objective command: (objective, flags given, config file, dry run, console).
CommandBody = Callable[[str, dict[str, Any], str | None, bool, Console], dict[str, Any]]


def objective_command(
    name: str,
    verb: str,
    body: CommandBody,
    doc: str,
    include: Callable[[str, FieldInfo], bool] | None = None,
) -> Any:
    """``lmctl <verb> <name>``: the objective's config fields (those ``include`` keeps) as
    flags, plus the CLI-only options; ``body`` gets the flags that were actually given."""
    config_class = get_objective(name).config_class

    def command(**values: Any) -> None:
        output = OutputOptions(
            json=values.pop("json_output"),
            quiet=values.pop("quiet"),
            no_progress=values.pop("no_progress"),
        )
        config_file = values.pop("config_file")
        dry_run = values.pop("dry_run")
        cli_values = given(values, config_class)
        run_command(
            lambda console: body(name, cli_values, config_file, dry_run, console),
            output,
            f"{verb} {name}",
        )

    params = config_parameters(config_class, include=include) + cli_only_parameters()
    return with_signature(command, params, doc)


def _make_command(name: str) -> Any:
    doc = f"{get_objective(name).summary}.\n\n{EXAMPLES.get(name, '')}"
    return objective_command(name, "train", run_train, doc)


def run_train(
    name: str,
    cli_values: dict[str, Any],
    config_file: str | None,
    dry_run: bool,
    console: Console,
) -> dict[str, Any]:
    from lmctl.config.loader import build_config, dump_config, read_config_file, with_output_dir
    from lmctl.run.rundir import check_output_dir

    objective = get_objective(name)
    file_keys = set(read_config_file(config_file)) if config_file else set()
    defaults: dict[str, Any] = {}
    embedded = objective.embedded_default()
    if embedded and not any(key in cli_values or key in file_keys for key in SOURCE_KEYS):
        defaults = embedded
        console.info(
            f"no model and no data given: training the embedded default "
            f"({embedded.get('model_type')} from scratch on {embedded.get('train_file')})"
        )
    config = build_config(
        objective.config_class,
        cli_values=cli_values,
        config_file=config_file,
        defaults=defaults,
        objective=name,
    )
    config = with_output_dir(config)
    if dry_run:
        resolved = {"objective": name, **dump_config(config)}
        if not console.options.json:
            import yaml

            console.write(yaml.safe_dump(resolved, sort_keys=False))
        return {"dry_run": True, "config": resolved}
    if is_main_process():
        check_output_dir(config)
    from lmctl.engine import train

    result = train(config, objective, console)
    if is_main_process():
        console.summary(f"lmctl train {name}: {result['output_dir']}", headline(result["metrics"]))
    return result


def headline(metrics: dict[str, Any]) -> dict[str, Any]:
    keys = (
        "train_loss",
        "eval_loss",
        "perplexity",
        "eval_accuracy",
        "train_samples",
        "eval_samples",
        "train_runtime",
    )
    return {key: metrics[key] for key in keys if key in metrics}


def register() -> None:
    for name in OBJECTIVES:
        objective = get_objective(name)
        train_app.command(name, help=None, short_help=objective.summary)(_make_command(name))
