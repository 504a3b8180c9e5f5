"""``lmctl config show|validate|schema``: see and check configs without training."""

from __future__ import annotations

import inspect
import json
from typing import Annotated, Any, Literal

import typer

from lmctl.cli.help import CommandDoc, add_command, add_group
from lmctl.cli.options import PANEL_OUTPUT, JsonOpt, NoProgressOpt, QuietOpt
from lmctl.cli.params import with_signature
from lmctl.cli.runner import run_command
from lmctl.cli.train import SOURCE_KEYS, objective_command, resolve_train_config
from lmctl.console import Console, OutputOptions
from lmctl.errors import ConfigError
from lmctl.objectives import OBJECTIVES, get_objective

Task: Any = Literal[tuple(OBJECTIVES)]

SHOW_HELP = """Print the resolved config that 'lmctl train {name}' would use with these flags.

Defaults, the config file and the flags are merged exactly as training merges them (with
the embedded default when no model and no data are given). The output is a config file:
pass it back with --config and training resolves to the same config.

    lmctl config show {name} --config run.yaml --learning-rate 1e-4
    lmctl config show {name} --model-type gpt2 --train-tokenizer 800 \\\\
        --train-file a.txt > run.yaml
"""

VALIDATE_HELP = """Check a config file and report every problem in it at once.

Unknown keys get the closest known key as a hint, invalid values the accepted ones, and
the cross-field rules of training are checked too. Exit code 0 when it is valid, 2 when it
is not. The objective comes from the file's 'objective' key or from --task.

    lmctl config validate run.yaml
    lmctl config validate upstream_args.json --task mlm --json
"""

SCHEMA_HELP = """Print the JSON Schema of a config file for an objective.

Point your editor's YAML or JSON language server at it for completion and checking:

    lmctl config schema clm > lmctl-clm.schema.json
"""

FormatOpt = Annotated[
    Literal["yaml", "json"],
    typer.Option(
        "--format",
        help="Output format of the config.",
        rich_help_panel=PANEL_OUTPUT,
        show_default="yaml",
    ),
]
FileArg = Annotated[
    str,
    typer.Argument(help="Config file (YAML, JSON or TOML).", metavar="FILE", show_default=False),
]
TaskOpt = Annotated[
    Task | None,
    typer.Option(
        "--task",
        help="Objective to validate for (default: the file's 'objective' key).",
        show_default=False,
    ),
]
TaskArg = Annotated[Task, typer.Argument(help="Objective: clm, mlm, plm or swag.", metavar="TASK")]


def _output(values: dict[str, Any]) -> OutputOptions:
    return OutputOptions(
        json=values.pop("json_output"),
        quiet=values.pop("quiet"),
        no_progress=values.pop("no_progress"),
    )


def _output_parameters() -> list[inspect.Parameter]:
    kw = inspect.Parameter.KEYWORD_ONLY
    return [
        inspect.Parameter("json_output", kw, default=False, annotation=JsonOpt),
        inspect.Parameter("quiet", kw, default=False, annotation=QuietOpt),
        inspect.Parameter("no_progress", kw, default=False, annotation=NoProgressOpt),
    ]


def run_show(
    name: str,
    cli_values: dict[str, Any],
    config_file: str | None,
    options: dict[str, Any],
    console: Console,
) -> dict[str, Any]:
    from lmctl.config.loader import dump_config

    config = resolve_train_config(name, cli_values, config_file, console)
    resolved = {"objective": name, **dump_config(config)}
    if not console.options.json:
        if options["output_format"] == "json":
            console.write(json.dumps(resolved, indent=2) + "\n")
        else:
            import yaml

            console.write(yaml.safe_dump(resolved, sort_keys=False))
    return {"config": resolved}


def run_validate(file: str, task: str | None, console: Console) -> dict[str, Any]:
    from lmctl.config.loader import config_file_problems, read_config_file

    objective = task or read_config_file(file).get("objective")
    if objective not in OBJECTIVES:
        shown = f"'objective: {objective}'" if objective else "no 'objective' key"
        raise ConfigError(
            f"{file}: {shown}; can't tell which objective it configures",
            "give --task clm|mlm|plm|swag, or add 'objective: clm' to the file",
        )
    spec = get_objective(objective)
    embedded = spec.embedded_default()
    defaults = None
    if embedded and not set(SOURCE_KEYS) & set(read_config_file(file, spec.config_class)):
        defaults = embedded  # what train runs with when the file names no model and no data
    problems = config_file_problems(spec.config_class, file, objective, defaults)
    if not problems:
        if not console.options.json:
            console.write(f"{file}: a valid 'lmctl train {objective}' config\n")
        return {"file": file, "objective": objective, "valid": True}
    listed = [{"message": message, "hint": hint} for message, hint in problems]
    if not console.options.json:
        noun = "problem" if len(problems) == 1 else "problems"
        lines = [f"{file}: {len(problems)} {noun} for 'lmctl train {objective}':"]
        for index, (message, hint) in enumerate(problems, 1):
            lines += [f"  {index}. {message}", f"     hint: {hint}"]
        console.write("\n".join(lines) + "\n")
    noun = "problem" if len(problems) == 1 else "problems"
    raise ConfigError(
        f"{file} is not a valid 'lmctl train {objective}' config: {len(problems)} {noun}",
        "fix them, then run 'lmctl config validate' again",
        details={"file": file, "objective": objective, "valid": False, "problems": listed},
    )


def run_schema(task: str, console: Console) -> dict[str, Any]:
    from lmctl.config.loader import json_schema

    schema = json_schema(get_objective(task).config_class, task)
    console.write(json.dumps(schema, indent=2) + "\n")
    return schema


def _validate_command(file: str, **values: Any) -> None:
    output = _output(values)
    task = values.pop("task")
    run_command(lambda console: run_validate(file, task, console), output, "config validate")


def _schema_command(task: str) -> None:
    run_command(lambda console: run_schema(task, console), OutputOptions(), "config schema")


def register(app: typer.Typer, parent: CommandDoc) -> None:
    group, doc = add_group(
        app, parent, "config", "Show, validate and describe configs without training."
    )
    show, show_doc = add_group(
        group, doc, "show", "Print the resolved config that 'lmctl train' would use."
    )
    kw = inspect.Parameter.KEYWORD_ONLY
    fmt = inspect.Parameter("output_format", kw, default="yaml", annotation=FormatOpt)
    for name in OBJECTIVES:
        command = objective_command(
            name, "config show", run_show, SHOW_HELP.format(name=name), extra=[fmt]
        )
        add_command(show, show_doc, name, command, f"The resolved 'lmctl train {name}' config.")
    validate = with_signature(
        _validate_command,
        [
            inspect.Parameter("file", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=FileArg),
            inspect.Parameter("task", kw, default=None, annotation=TaskOpt),
            *_output_parameters(),
        ],
        VALIDATE_HELP,
    )
    add_command(group, doc, "validate", validate, "Check a config file; list every problem.")
    schema = with_signature(
        _schema_command,
        [inspect.Parameter("task", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=TaskArg)],
        SCHEMA_HELP,
    )
    add_command(group, doc, "schema", schema, "Print the JSON Schema of a config file.")
