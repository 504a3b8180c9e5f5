"""``lmctl data inspect <objective>``: what the data looks like to an objective, from a
bounded sample, before any training. Flags are the objective's data, model and objective
options (as ``lmctl prepare`` takes them) plus ``--per-device-train-batch-size`` and
``--seed`` for the padding estimate; the work is done by :mod:`lmctl.inspection`."""

from __future__ import annotations

import inspect
from typing import Annotated, Any

import typer
from pydantic.fields import FieldInfo

from lmctl.cli.help import CommandDoc, add_command, add_group
from lmctl.cli.prepare import decides_data
from lmctl.cli.train import objective_command
from lmctl.config.fields import PANEL_DATA, PANEL_OUTPUT
from lmctl.console import Console
from lmctl.objectives import OBJECTIVES, get_objective

#: The training options that the padding estimate reads.
BATCH_FIELDS = ("per_device_train_batch_size", "seed")
#: ``lmctl prepare``'s fields that say nothing about a sample of the data.
SKIPPED_FIELDS = ("do_train", "do_eval", "preprocessing_num_workers", "overwrite_cache")
DEFAULT_SAMPLE = 20000

EXAMPLES = """
Read the first {sample} lines of each split (the default sample) and report lengths, cuts,
padding, unknown tokens, {counts}:

    lmctl data inspect {name} --train-file corpus.txt --tokenizer-name ./tok{flags}

The data of a training config, a larger sample, as one JSON object, with a histogram of
tokens per sample:

    lmctl data inspect {name} --config run.yaml --sample 100000 --json \\
        --plot lengths.png

Findings that would spoil training are warnings naming the flag that fixes them: more than
5% unknown tokens, more than half the tokens cut{swag}.
"""
FLAGS = {
    "clm": " \\\n        --block-size 512",
    "mlm": " \\\n        --line-by-line --max-seq-length 128",
    "plm": " \\\n        --line-by-line --max-seq-length 128",
    "swag": " \\\n        --max-seq-length 128",
}

SampleOpt = Annotated[
    int,
    typer.Option(
        "--sample",
        help="Lines or records read from the start of each split (never the whole file).",
        rich_help_panel=PANEL_DATA,
    ),
]
PlotOpt = Annotated[
    str | None,
    typer.Option(
        "--plot",
        help="Write a histogram of tokens per sample to this PNG file (needs matplotlib).",
        rich_help_panel=PANEL_OUTPUT,
        metavar="FILE.png",
        show_default=False,
    ),
]


def _inspected(name: str, info: FieldInfo) -> bool:
    if name in BATCH_FIELDS:
        return True
    if name == "streaming":
        return True
    return decides_data(name, info) and name not in SKIPPED_FIELDS


def _make_command(name: str) -> Any:
    swag = " or a label that never appears" if name == "swag" else ""
    counts = (
        "endings, labels and context lengths" if name == "swag" else "blank and duplicate lines"
    )
    examples = EXAMPLES.format(
        name=name, sample=DEFAULT_SAMPLE, flags=FLAGS[name], swag=swag, counts=counts
    )
    if name == "swag":
        examples = examples.replace("corpus.txt", "train.csv").replace("lines", "records")
    doc = f"Inspect {name} data ({get_objective(name).summary}).\n\n{examples}"
    kw = inspect.Parameter.KEYWORD_ONLY
    extra = [
        inspect.Parameter("sample", kw, default=DEFAULT_SAMPLE, annotation=SampleOpt),
        inspect.Parameter("plot", kw, default=None, annotation=PlotOpt),
    ]
    return objective_command(
        name, "data inspect", run_inspect, doc, include=_inspected, extra=extra
    )


def run_inspect(
    name: str,
    cli_values: dict[str, Any],
    config_file: str | None,
    extra: dict[str, Any],
    console: Console,
) -> dict[str, Any]:
    from lmctl.config.loader import build_config
    from lmctl.inspection.report import inspect_data

    objective = get_objective(name)
    # Only a sample is read, never the whole data: a stream is read like a file.
    config = build_config(
        objective.config_class,
        cli_values=cli_values,
        config_file=config_file,
        objective=name,
        command="inspect",
    )
    return inspect_data(name, config, console, sample=extra["sample"], plot=extra["plot"])


def register(app: typer.Typer, parent: CommandDoc) -> None:
    group, doc = add_group(app, parent, "data", "Look at training data before training on it.")
    inspect_group, inspect_doc = add_group(
        group,
        doc,
        "inspect",
        "Report lengths, cuts, padding and unknown tokens of a sample of the data.",
    )
    for name in OBJECTIVES:
        summary = f"Inspect data for: {get_objective(name).summary}"
        add_command(inspect_group, inspect_doc, name, _make_command(name), summary)
