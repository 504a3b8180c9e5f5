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
Perplexity is shown for language-modelling objectives, accuracy for swag. Below the table:
for runs with named sources, the share of each training source trained on and the eval
loss of each validation source; each restart of a run by --max-restarts, with the step it
continued from and its cause.

    lmctl runs
    lmctl runs /data/experiments --json
    lmctl runs s3://my-bucket/runs
"""

DirArg = Annotated[
    str,
    typer.Argument(
        help="Folder holding run directories (or one run directory), or a storage URL.",
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
    from lmctl.storage.paths import local_folder_problem

    if local_folder_problem("DIR", folder, "") is not None:
        summaries = _remote_summaries(folder)
    else:
        summaries = [summarize(path) for path in find_runs(_local_root(folder))]
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
            sourced = [s for s in summaries if s.train_shares or s.source_eval_loss]
            if sourced:
                lines += ["", "sources:"]
                lines += [f"  {Path(s.path).name}: {_sources(s)}" for s in sourced]
            restarted = [s for s in summaries if s.restarts]
            if restarted:
                lines += ["", "restarts:"]
                lines += [
                    f"  {Path(s.path).name}: restart {r['restart']} from step {r['step']} "
                    f"after {r['cause']}{_processes(r)}"
                    for s in restarted
                    for r in s.restarts
                ]
            waiting = [s for s in summaries if s.resume_command]
            if waiting:
                lines += ["", "continue interrupted runs with:"]
                lines += [f"  {s.resume_command}" for s in waiting]
            console.write("\n".join(line.rstrip() for line in lines) + "\n")
    return {"runs": [s.to_json() for s in summaries]}


def _local_root(folder: str) -> Path:
    from lmctl.storage.paths import local_path

    root = local_path(folder)
    if not root.exists():
        raise ConfigError(f"{folder}: no such directory", "give the folder that holds your runs")
    return root


def _remote_summaries(url: str) -> list[Any]:
    """The runs of a remote folder (or one remote run directory), read in place: only the
    few small files a summary needs are fetched."""
    import tempfile

    from lmctl.mirror.fetch import fetch_summary, find_remote_runs
    from lmctl.run.resume import resume_command
    from lmctl.run.summary import summarize
    from lmctl.storage.locations import run_location_problem

    problem = run_location_problem("DIR", url)
    if problem is not None:
        raise ConfigError(*problem)
    summaries = []
    with tempfile.TemporaryDirectory(prefix="lmctl-runs-") as tmp:
        for index, run in enumerate(find_remote_runs(url)):
            summary = summarize(fetch_summary(run, Path(tmp) / str(index)))
            summary.path = run
            if summary.resume_command is not None:
                summary.resume_command = resume_command(run)
            summaries.append(summary)
    return summaries


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


def _processes(restart: dict[str, Any]) -> str:
    """How the number of processes changed at a restart, if it did."""
    if "processes" not in restart:
        return ""
    return f"; on {restart['processes']} process(es) instead of {restart['processes_before']}"


def _sources(summary: Any) -> str:
    """A run's named sources: the share of each trained on, each one's latest eval loss."""
    parts = []
    if summary.train_shares:
        shares = ", ".join(f"{name} {share:.1%}" for name, share in summary.train_shares.items())
        parts.append(f"trained on {shares}")
    if summary.source_eval_loss:
        losses = ", ".join(
            f"{name} {format_number(round(loss, 4))}"
            for name, loss in summary.source_eval_loss.items()
        )
        parts.append(f"eval loss {losses}")
    return "; ".join(parts)
