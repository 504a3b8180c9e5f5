"""``lmctl push PATH --to DEST``: publish a run or model directory."""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer

from lmctl.cli.options import PANEL_OUTPUT, JsonOpt, NoProgressOpt, QuietOpt
from lmctl.cli.params import config_parameters, given, with_signature
from lmctl.cli.runner import run_command
from lmctl.config.push import PushConfig
from lmctl.console import Console, OutputOptions

HELP = """Publish a run or model directory to the Hugging Face Hub or an object store.

PATH is a run directory (its model card is regenerated first from its config and results),
one of its checkpoint-N folders, or a model directory written by save_pretrained.
A run's checkpoints stay behind unless --include-checkpoints (then whole). Of a checkpoint
pushed on its own only the model files go: its optimizer, scheduler, RNG and trainer state
only with --include-optimizer. A model
whose files do not match the manifest of its save is refused (exit 5).

Object stores get an atomic publication: staged, verified, moved into place, and a manifest
(lmctl-manifest.json) written last; rerun an interrupted push and it resumes without
uploading verified files again.

Credentials: the Hub token comes from --token-file, --token, HF_TOKEN or 'hf auth login';
object stores use their provider's environment variables and config files (e.g.
`AWS_ACCESS_KEY_ID`, `~/.aws/credentials`, `AWS_ENDPOINT_URL`) and
`FSSPEC_<PROTOCOL>_<OPTION>` variables.

Push a run to the Hub, privately, on a branch:

    lmctl push runs/clm-20260101-120000 --to hf://my-user/tiny-gpt2 \\
        --private --revision v1

Publish to S3 (see what would be uploaded first):

    lmctl push runs/mine --to s3://my-bucket/models/mine --dry-run
    lmctl push runs/mine --to s3://my-bucket/models/mine --json
"""

PathArg = Annotated[
    Path,
    typer.Argument(
        help="Run directory (--output-dir of lmctl train) or model directory.",
        metavar="PATH",
        show_default=False,
    ),
]
PushDryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="List the files and sizes that would be uploaded (and those of another model at "
        "the destination that would be deleted), and exit.",
        rich_help_panel=PANEL_OUTPUT,
    ),
]


def _command(**values: Any) -> None:
    output = OutputOptions(
        json=values.pop("json_output"),
        quiet=values.pop("quiet"),
        no_progress=values.pop("no_progress"),
    )
    path: Path = values.pop("path")
    dry_run: bool = values.pop("dry_run")
    cli_values = given(values, PushConfig)
    run_command(lambda console: run_push(path, cli_values, dry_run, console), output, "push")


def run_push(
    path: Path, cli_values: dict[str, Any], dry_run: bool, console: Console
) -> dict[str, Any]:
    from lmctl.config.loader import build_config
    from lmctl.publish.files import human_size
    from lmctl.publish.push import push, target_for

    config = build_config(PushConfig, cli_values=cli_values)
    assert config.to is not None
    target = target_for(
        config.to,
        flag="--to",
        console=console,
        token=config.token_value(),
        private=config.private,
        revision=config.revision,
        message=config.message,
    )
    result = push(
        path,
        target,
        include_checkpoints=config.include_checkpoints,
        include_optimizer=config.include_optimizer,
        dry_run=dry_run,
        console=console,
    )
    if dry_run:
        _print_listing(result, console)
    else:
        shown = {"destination": result["destination"], "files": len(result["files"])}
        shown["size"] = human_size(result["bytes"])
        if "uploaded" in result:
            shown["uploaded"] = len(result["uploaded"])
            shown["already verified"] = len(result["reused"])
        if "commit_url" in result:
            shown["commit"] = result["commit_url"]
        console.summary(f"lmctl push {path}", shown)
    return result


def _print_listing(result: dict[str, Any], console: Console) -> None:
    from lmctl.publish.files import human_size

    if console.options.json:
        return
    files = result["files"]
    width = max((len(item["path"]) for item in files), default=0)
    lines = [f"would upload {len(files)} files to {result['destination']}:"]
    lines += [f"  {item['path']:<{width}}  {human_size(item['size']):>9}" for item in files]
    lines.append(f"  {'total':<{width}}  {human_size(result['bytes']):>9}")
    deleted = result.get("delete") or []
    if deleted:
        lines.append(
            f"would delete {len(deleted)} files of the model now at {result['destination']}:"
        )
        lines += [f"  {rel}" for rel in deleted]
    console.write("\n".join(lines) + "\n")


def _parameters() -> list[inspect.Parameter]:
    kw = inspect.Parameter.KEYWORD_ONLY
    return [
        inspect.Parameter("path", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=PathArg),
        *config_parameters(PushConfig),
        inspect.Parameter("dry_run", kw, default=False, annotation=PushDryRunOpt),
        inspect.Parameter("json_output", kw, default=False, annotation=JsonOpt),
        inspect.Parameter("quiet", kw, default=False, annotation=QuietOpt),
        inspect.Parameter("no_progress", kw, default=False, annotation=NoProgressOpt),
    ]


push_command = with_signature(_command, _parameters(), HELP)
