"""``lmctl runs [DIR]``: every run directory's status and numbers at a glance."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from lmctl.cli.help import CommandDoc, add_command
from lmctl.cli.options import JsonOpt
from lmctl.cli.params import with_signature
from lmctl.cli.runner import run_command
from lmctl.console import Console, OutputOptions, format_number
from lmctl.errors import ConfigError

HELP = """List the runs in a folder: objective, model, status, steps, eval loss, age.

Status is finished, interrupted at step N (with the command that continues it) or failed.
Perplexity is shown for language-modelling objectives, accuracy for swag.

    lmctl runs
    lmctl runs /data/experiments --json
"""

DirArg = Annotated[
    str,
    typer.Argument(
        help="Folder holding run directories (or one run directory).",
        metavar="DIR",
        show_default="runs",
    ),
]
COLUMNS = ("run", "objective", "model", "status", "steps", "best eval", "final eval", "metric")


def _row(summary: Any) -> list[str]:
    from lmctl.run.summary import format_age

    def number(value: float | None) -> str:
        return "-" if value is None else format_number(round(value, 4))

    steps = "-" if summary.step is None else str(summary.step)
    if summary.max_steps and summary.step != summary.max_steps:
        steps += f"/{summary.max_steps}"
    metric = "-"
    if summary.perplexity is not None:
        metric = f"ppl {number(summary.perplexity)}"
    elif summary.accuracy is not None:
        metric = f"acc {number(summary.accuracy)}"
    return [
        Path(summary.path).name,
        summary.objective or "?",
        summary.model or "?",
        summary.status,
        steps,
        number(summary.best_eval_loss),
        number(summary.final_eval_loss),
        metric,
        format_age(summary.age_seconds),
    ]


def run_runs(folder: str, console: Console) -> dict[str, Any]:
    from lmctl.run.summary import find_runs, summarize
    from lmctl.storage.paths import local_folder_problem, local_path

    problem = local_folder_problem(
        "DIR", folder, "copy the runs to a local folder and list that folder"
    )
    if problem is not None:
        raise ConfigError(*problem)
    root = local_path(folder)
    if not root.exists():
        raise ConfigError(f"{folder}: no such directory", "give the folder that holds your runs")
    summaries = [summarize(path) for path in find_runs(root)]
    if not console.options.json:
        if not summaries:
            console.write(f"no runs in {folder}\n")
        else:
            rows = [[*COLUMNS, "age"], *(_row(s) for s in summaries)]
            widths = [max(len(row[i]) for row in rows) for i in range(len(rows[0]))]
            lines = [
                "  ".join(cell.ljust(width) for cell, width in zip(row, widths, strict=True))
                for row in rows
            ]
            waiting = [s for s in summaries if s.resume_command]
            if waiting:
                lines += ["", "continue interrupted runs with:"]
                lines += [f"  {s.resume_command}" for s in waiting]
            console.write("\n".join(line.rstrip() for line in lines) + "\n")
    return {"runs": [s.to_json() for s in summaries]}


def _command(folder: str = "runs", *, json_output: bool = False) -> None:
    run_command(lambda console: run_runs(folder, console), OutputOptions(json=json_output), "runs")


def register(app: typer.Typer, parent: CommandDoc) -> None:
    params = [
        inspect.Parameter(
            "folder", inspect.Parameter.POSITIONAL_OR_KEYWORD, default="runs", annotation=DirArg
        ),
        inspect.Parameter(
            "json_output", inspect.Parameter.KEYWORD_ONLY, default=False, annotation=JsonOpt
        ),
    ]
    command = with_signature(_command, params, HELP)
    add_command(app, parent, "runs", command, "List runs with their status and metrics.")
