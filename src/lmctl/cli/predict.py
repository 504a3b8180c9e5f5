"""``lmctl predict PATH``: what a run, a checkpoint or a model predicts for given inputs.

The command only wires and checks its flags; :mod:`lmctl.prediction` resolves PATH (as
``lmctl eval`` does), reads the inputs, loads the model and predicts.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer

from lmctl.cli.eval import PathArg, Task
from lmctl.cli.help import CommandDoc, add_command
from lmctl.cli.options import JsonOpt, NoProgressOpt, QuietOpt
from lmctl.cli.params import with_signature
from lmctl.cli.runner import run_command
from lmctl.console import Console, OutputOptions
from lmctl.errors import ConfigError

HELP = """Show what a run, one of its checkpoints, or a model predicts for your inputs.

PATH is any path that lmctl eval takes: a run directory (its final model, or its newest
checkpoint when it has none yet), a checkpoint, a model directory or a storage URL. What is
predicted follows the objective (the run's, or --task for a model directory): clm and plm
models continue each prompt (greedy unless --do-sample); mlm models give the --top-k most
likely tokens, with probabilities, for each mask token ([MASK], <mask>, ... as the
tokenizer spells it) and the text filled in; swag models give the probability of each
ending of a record (they sum to 1) and the chosen one.

Inputs: --prompt TEXT (repeatable), and --input FILE with one prompt or masked text per
line. For swag each input is a record with the columns the run trained with (a --prompt
is a JSON object; --input a .csv file with a header row, or a .json/.jsonl file).

Continue a prompt with a run's final model:

    lmctl predict runs/clm-20250101-120000 --prompt "ROMEO:"

Sampled continuations of every line of a file, as JSON:

    lmctl predict runs/clm-20250101-120000/checkpoint-500 \\
        --input prompts.txt --do-sample --temperature 0.8 --json

Fill in the masks, five candidates each:

    lmctl predict runs/mlm-20250101-120000 \\
        --prompt "The [MASK] sat on the mat."

Score the endings of multiple-choice records, from a bucket:

    lmctl predict s3://bucket/runs/swag-1 --input dev.jsonl
"""

PANEL_INPUT = "Input"
PANEL_GENERATION = "Generation (clm, plm)"
PANEL_MASKS = "Masks (mlm)"

TaskOpt = Annotated[
    Task | None,
    typer.Option(
        "--task",
        help="Objective of a model directory's predictions (default: the run's, or inferred "
        "from the model's architecture).",
        show_default=False,
    ),
]

PromptOpt = Annotated[
    list[str] | None,
    typer.Option(
        "--prompt",
        "-p",
        help="A text to predict for; repeat for more (for swag: a JSON object record).",
        rich_help_panel=PANEL_INPUT,
        show_default=False,
    ),
]
InputOpt = Annotated[
    str | None,
    typer.Option(
        "--input",
        "-i",
        metavar="FILE",
        help="A file of inputs: one prompt or masked text per line; for swag a .csv, .json "
        "or .jsonl file of records.",
        rich_help_panel=PANEL_INPUT,
        show_default=False,
    ),
]
MaxNewTokensOpt = Annotated[
    int,
    typer.Option(
        "--max-new-tokens",
        help="Tokens to generate after each prompt.",
        min=1,
        rich_help_panel=PANEL_GENERATION,
        show_default="40",
    ),
]
DoSampleOpt = Annotated[
    bool,
    typer.Option(
        "--do-sample/--greedy",
        help="Sample each next token (with --temperature and --top-p) instead of taking the "
        "most likely one.",
        rich_help_panel=PANEL_GENERATION,
    ),
]
TemperatureOpt = Annotated[
    float | None,
    typer.Option(
        "--temperature",
        help="With --do-sample: divide the scores by this before sampling (lower: surer). "
        "[default: 1.0]",
        rich_help_panel=PANEL_GENERATION,
        show_default=False,
    ),
]
TopPOpt = Annotated[
    float | None,
    typer.Option(
        "--top-p",
        help="With --do-sample: sample among the most likely tokens whose probabilities add "
        "up to this (nucleus sampling).",
        rich_help_panel=PANEL_GENERATION,
        show_default="1.0",
    ),
]
SeedOpt = Annotated[
    int,
    typer.Option(
        "--seed",
        help="Random seed of sampling; each prompt draws from it afresh.",
        rich_help_panel=PANEL_GENERATION,
        show_default="42",
    ),
]
TopKOpt = Annotated[
    int,
    typer.Option(
        "--top-k",
        help="Candidates shown for each mask, most likely first.",
        min=1,
        rich_help_panel=PANEL_MASKS,
        show_default="5",
    ),
]


def _parameters() -> list[inspect.Parameter]:
    kw = inspect.Parameter.KEYWORD_ONLY
    return [
        inspect.Parameter("path", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=PathArg),
        inspect.Parameter("task", kw, default=None, annotation=TaskOpt),
        inspect.Parameter("prompt", kw, default=None, annotation=PromptOpt),
        inspect.Parameter("input_file", kw, default=None, annotation=InputOpt),
        inspect.Parameter("max_new_tokens", kw, default=40, annotation=MaxNewTokensOpt),
        inspect.Parameter("do_sample", kw, default=False, annotation=DoSampleOpt),
        inspect.Parameter("temperature", kw, default=None, annotation=TemperatureOpt),
        inspect.Parameter("top_p", kw, default=None, annotation=TopPOpt),
        inspect.Parameter("seed", kw, default=42, annotation=SeedOpt),
        inspect.Parameter("top_k", kw, default=5, annotation=TopKOpt),
        inspect.Parameter("json_output", kw, default=False, annotation=JsonOpt),
        inspect.Parameter("quiet", kw, default=False, annotation=QuietOpt),
        inspect.Parameter("no_progress", kw, default=False, annotation=NoProgressOpt),
    ]


def _command(path: str, **values: Any) -> None:
    output = OutputOptions(
        json=values.pop("json_output"),
        quiet=values.pop("quiet"),
        no_progress=values.pop("no_progress"),
    )
    run_command(lambda console: run_predict(console, path, **values), output, "predict")


def run_predict(
    console: Console,
    path: str,
    *,
    task: str | None,
    prompt: list[str] | None,
    input_file: str | None,
    max_new_tokens: int,
    do_sample: bool,
    temperature: float | None,
    top_p: float | None,
    seed: int,
    top_k: int,
) -> dict[str, Any]:
    """Check the flags (before anything heavy is imported), then predict."""
    prompts = list(prompt or [])
    if not prompts and input_file is None:
        raise ConfigError(
            "nothing to predict: no --prompt and no --input",
            "give --prompt TEXT (repeatable) or --input FILE",
        )
    if temperature is not None and temperature <= 0:
        raise ConfigError(
            f"--temperature {temperature}: must be above 0",
            "give e.g. --temperature 0.7, or --greedy for the most likely tokens",
        )
    if top_p is not None and not 0 < top_p <= 1:
        raise ConfigError(f"--top-p {top_p}: must be above 0 and at most 1", "e.g. --top-p 0.9")
    if not do_sample:
        given = (("--temperature", temperature), ("--top-p", top_p))
        unused = [flag for flag, value in given if value is not None]
        if unused:
            verb, pronoun = ("applies", "it") if len(unused) == 1 else ("apply", "them")
            console.warn(
                f"{' and '.join(unused)} {verb} to sampling only: add --do-sample, or drop "
                f"{pronoun}"
            )
    from lmctl.prediction import Generation, predict

    generation = Generation(
        max_new_tokens=max_new_tokens,
        do_sample=do_sample,
        temperature=1.0 if temperature is None else temperature,
        top_p=1.0 if top_p is None else top_p,
        seed=seed,
    )
    return predict(
        path,
        task=task,
        prompts=prompts,
        input_file=input_file,
        generation=generation,
        top_k=top_k,
        console=console,
    )


def register(app: typer.Typer, parent: CommandDoc) -> None:
    command = with_signature(_command, _parameters(), HELP)
    add_command(app, parent, "predict", command, "Show what a run or a model predicts.")
