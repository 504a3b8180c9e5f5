"""``lmctl resume RUN_DIR``: continue a run from its newest complete checkpoint.

The visible flags are the overrides a resumed run accepts (declared once, on the config
fields). Every other training flag still parses, hidden, so that giving one is refused with
a message that names it instead of a bare "no such option".
"""

from __future__ import annotations

import inspect
from pathlib import Path
from typing import Annotated, Any

import typer
from pydantic import BaseModel

from lmctl.cli.help import CommandDoc, add_command
from lmctl.cli.options import DryRunOpt, JsonOpt, NoProgressOpt, QuietOpt
from lmctl.cli.params import config_parameters, given, given_flags, union_fields, with_signature
from lmctl.cli.runner import run_command
from lmctl.config.base import TrainConfig
from lmctl.console import Console, OutputOptions
from lmctl.objectives import OBJECTIVES, get_objective
from lmctl.run.resume import RESUME_OVERRIDES

HELP = """Continue an interrupted or finished run from its newest complete checkpoint.

The run's saved config (RUN_DIR/lmctl.yaml) is used as is: model, optimizer, scheduler,
random states and the data position are restored from the checkpoint, and training goes on
to the configured end. A half-written or corrupted checkpoint is skipped with a warning.
Only the options below may change; the objective, model, tokenizer, data, preprocessing and
optimisation are fixed by the run (exit code 2 if you try).

Continue an interrupted run:

    lmctl resume runs/clm-20250101-120000

Continue a run kept in a bucket (--output-dir s3://...), on any machine: its newest complete
checkpoint is fetched when this machine has no copy of the run:

    lmctl resume s3://my-bucket/runs/clm-1

Extend a finished run to 2000 steps, saving every 200:

    lmctl resume runs/clm-20250101-120000 --max-steps 2000 --save-steps 200
"""

RunDirArg = Annotated[
    str,
    typer.Argument(
        help="Run directory written by 'lmctl train' (its --output-dir: a folder or a URL).",
        metavar="RUN_DIR",
        show_default=False,
    ),
]


def _fixed_fields() -> dict[str, type[BaseModel]]:
    models: list[type[BaseModel]] = [
        TrainConfig,
        *(get_objective(name).config_class for name in OBJECTIVES),
    ]
    return {
        name: model for name, model in union_fields(models).items() if name not in RESUME_OVERRIDES
    }


def _parameters() -> list[inspect.Parameter]:
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [
        inspect.Parameter("run_dir", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=RunDirArg)
    ]
    params += config_parameters(TrainConfig, only=RESUME_OVERRIDES, show_defaults=False)
    for name, model in _fixed_fields().items():
        params += config_parameters(model, only=(name,), hidden=True)
    hidden_config = Annotated[str | None, typer.Option("--config", "-c", hidden=True)]
    params += [
        inspect.Parameter("config_file", kw, default=None, annotation=hidden_config),
        inspect.Parameter("json_output", kw, default=False, annotation=JsonOpt),
        inspect.Parameter("quiet", kw, default=False, annotation=QuietOpt),
        inspect.Parameter("no_progress", kw, default=False, annotation=NoProgressOpt),
        inspect.Parameter("dry_run", kw, default=False, annotation=DryRunOpt),
    ]
    return params


def _command(run_dir: str, **values: Any) -> None:
    output = OutputOptions(
        json=values.pop("json_output"),
        quiet=values.pop("quiet"),
        no_progress=values.pop("no_progress"),
    )
    dry_run = values.pop("dry_run")
    forbidden = given_flags(values, list(_fixed_fields()))
    if values.pop("config_file") is not None:
        forbidden.insert(0, "--config")
    overrides = {
        name: value
        for name, value in given(values, TrainConfig).items()
        if name in RESUME_OVERRIDES
    }
    run_command(
        lambda console: run_resume(run_dir, overrides, forbidden, dry_run, console),
        output,
        "resume",
    )


def local_copy(path: str, console: Console, overrides: dict[str, Any]) -> tuple[Path, str | None]:
    """The local run directory to resume, and the storage URL of a remote one (whose newest
    complete checkpoint is fetched first when this machine has no copy of it, and always
    when the run spans several machines)."""
    from lmctl.run.resume import remote_location
    from lmctl.storage.paths import local_path

    location = remote_location(path)
    if location is None:
        return local_path(path), None
    from lmctl.distributed import launched, machine
    from lmctl.mirror.fetch import fetch_run
    from lmctl.run.lease import refuse_if_held
    from lmctl.storage.locations import run_staging_dir

    node, nodes = machine(_given_int(overrides, "node_rank", 0), _given_int(overrides, "nnodes", 1))
    if not launched() and nodes == 1:
        # Launched processes resume under the lease of their launcher; the machines of a run
        # of several start together, and the lease its main process takes may be the run's own.
        refuse_if_held(location, path)
    staging = overrides.get("staging_dir")
    local = local_path(staging) if staging is not None else run_staging_dir(location, node, nodes)
    return fetch_run(location, local, console, whole=nodes > 1), location


def _given_int(overrides: dict[str, Any], name: str, default: int) -> int:
    """A number given on the command line, before the config validates it (which reports a
    bad value by its flag); of a range (``--nnodes MIN:MAX``) the largest."""
    try:
        return int(str(overrides.get(name, default)).rpartition(":")[2])
    except ValueError:
        return default


def run_resume(
    path: str,
    overrides: dict[str, Any],
    forbidden: list[str],
    dry_run: bool,
    console: Console,
) -> dict[str, Any]:
    from lmctl.config.slices import LaunchSpec, RunDirSpec, take
    from lmctl.distributed import is_main_process
    from lmctl.run.launch import relaunch
    from lmctl.run.lock import holding, in_use
    from lmctl.run.resume import discard_unfinished_saves, plan_resume, refuse_fixed_options
    from lmctl.run.rundir import commits_checkpoints

    refuse_fixed_options(forbidden, path)
    run_dir, location = local_copy(path, console, overrides)
    plan = plan_resume(run_dir, overrides, console, location)
    if dry_run:
        if not in_use(run_dir):  # else the leftovers may be a live run's saves in progress
            discard_unfinished_saves(run_dir, console)
        described = plan.describe()
        if not console.options.json:
            import yaml

            console.write(yaml.safe_dump(described, sort_keys=False))
        return {"dry_run": True, **described}
    launch, spec = take(LaunchSpec, plan.config), take(RunDirSpec, plan.config)
    with holding(spec, launch, console, "lmctl resume"):
        relaunch(launch, console)
        console.info(
            f"resuming {location or run_dir} from {plan.checkpoint.name} (step {plan.step})"
        )
        if commits_checkpoints(spec):
            discard_unfinished_saves(run_dir, console)
        from lmctl.cli.train import headline
        from lmctl.engine import train

        result = train(plan.config, plan.objective, console)
    if is_main_process():
        shown = headline(result["metrics"], result["output_dir"])
        console.summary(f"lmctl resume: {result['output_dir']}", shown)
    return {"resumed_from": str(plan.checkpoint), **result}


def register(app: typer.Typer, parent: CommandDoc) -> None:
    command = with_signature(_command, _parameters(), HELP)
    summary = "Continue an interrupted or finished run from its newest checkpoint."
    add_command(app, parent, "resume", command, summary)
