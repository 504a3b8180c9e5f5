"""``lmctl eval PATH``: evaluate a run directory, one of its checkpoints, or a model directory.

The data flags are generated from the config fields, like ``train``'s: the shared data
options plus every objective-specific one (block size, sequence length, masking, columns).
They default to the run's saved values, so no default is shown.
"""

from __future__ import annotations

import inspect
from typing import Annotated, Any, Literal

import typer

from lmctl.cli.help import CommandDoc, add_command
from lmctl.cli.options import PANEL_OUTPUT, JsonOpt, NoProgressOpt, QuietOpt
from lmctl.cli.params import config_parameters, with_signature
from lmctl.cli.runner import run_command
from lmctl.config.base import TrainConfig
from lmctl.console import Console, OutputOptions
from lmctl.evaluation.target import EVAL_FIELDS, objective_fields
from lmctl.objectives import OBJECTIVES

HELP = """Evaluate a run directory, one of its checkpoints, or a model directory.

A run (or checkpoint) is evaluated on its own validation data with its saved settings; the
flags below replace them. A bare model directory needs data, and the objective is inferred
from its architecture unless --task is given. Metrics: eval loss, perplexity and accuracy
(next-token for clm/plm, masked tokens for mlm with a fixed masking seed, choices for swag).

Results go to stdout, and to eval_results.json in the run or checkpoint directory when it
has none yet (training's own evaluation is never replaced unless you pass
--overwrite-results), or to --output FILE. A model without the objective's head (a bare
encoder evaluated with --task mlm) is refused unless --allow-random-head.

Evaluate the final model of a run, on its validation data:

    lmctl eval runs/clm-20250101-120000

A checkpoint on other data, as JSON:

    lmctl eval runs/clm-20250101-120000/checkpoint-500 \\
        --validation-file test.txt --json

A model directory:

    lmctl eval ./gpt2-small --task clm --validation-file test.txt \\
        --block-size 512 -O ppl.json
"""

PathArg = Annotated[
    str,
    typer.Argument(
        help="A run directory, a checkpoint directory or a model directory: a local path "
        "or a storage URL (s3://bucket/model, file:///abs/path, ...).",
        metavar="PATH",
        show_default=False,
    ),
]
Task: Any = Literal[tuple(OBJECTIVES)]
TaskOpt = Annotated[
    Task | None,
    typer.Option(
        "--task",
        help="Objective to evaluate a model directory with (default: the run's, or inferred "
        "from the model's architecture).",
        show_default=False,
    ),
]
OutputFileOpt = Annotated[
    str | None,
    typer.Option(
        "--output",
        "-O",
        help="Write the metrics to this JSON file.",
        rich_help_panel=PANEL_OUTPUT,
        show_default=False,
    ),
]
AllowRandomHeadOpt = Annotated[
    bool,
    typer.Option(
        "--allow-random-head",
        help="Evaluate a model that lacks the objective's head (its weights are then random, "
        "and so are the metrics); refused otherwise, with exit code 5.",
    ),
]
OverwriteResultsOpt = Annotated[
    bool,
    typer.Option(
        "--overwrite-results",
        help="Replace an existing eval_results.json in the run or checkpoint directory.",
        rich_help_panel=PANEL_OUTPUT,
    ),
]


def _parameters() -> list[inspect.Parameter]:
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("path", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=PathArg)
    ]
    params.append(inspect.Parameter("task", kw, default=None, annotation=TaskOpt))
    params += config_parameters(TrainConfig, only=EVAL_FIELDS, show_defaults=False)
    for name, model in objective_fields().items():
        params += config_parameters(model, only=(name,), show_defaults=False)
    params += [
        inspect.Parameter("allow_random_head", kw, default=False, annotation=AllowRandomHeadOpt),
        inspect.Parameter("output", kw, default=None, annotation=OutputFileOpt),
        inspect.Parameter("overwrite_results", kw, default=False, annotation=OverwriteResultsOpt),
        inspect.Parameter("json_output", kw, default=False, annotation=JsonOpt),
        inspect.Parameter("quiet", kw, default=False, annotation=QuietOpt),
        inspect.Parameter("no_progress", kw, default=False, annotation=NoProgressOpt),
    ]
    return params


def _command(path: str, **values: Any) -> None:
    output = OutputOptions(
        json=values.pop("json_output"),
        quiet=values.pop("quiet"),
        no_progress=values.pop("no_progress"),
    )
    task = values.pop("task")
    output_file = values.pop("output")
    overwrite_results = values.pop("overwrite_results")
    allow_random_head = values.pop("allow_random_head")
    options = {name: value for name, value in values.items() if value is not None and value != []}
    run_command(
        lambda console: run_eval(
            console,
            path,
            task=task,
            options=options,
            output_file=output_file,
            overwrite_results=overwrite_results,
            allow_random_head=allow_random_head,
        ),
        output,
        "eval",
    )


def run_eval(
    console: Console,
    path: str,
    *,
    task: str | None,
    options: dict[str, Any],
    output_file: str | None,
    overwrite_results: bool,
    allow_random_head: bool = False,
) -> dict[str, Any]:
    from lmctl.evaluation import run_evaluation

    result = run_evaluation(
        path,
        task=task,
        options=options,
        output=output_file,
        overwrite_results=overwrite_results,
        console=console,
        allow_random_head=allow_random_head,
    )
    console.summary(f"lmctl eval: {result['model']} ({result['objective']})", result["metrics"])
    return result


def register(app: typer.Typer, parent: CommandDoc) -> None:
    command = with_signature(_command, _parameters(), HELP)
    add_command(app, parent, "eval", command, "Evaluate a run, a checkpoint or a model.")
