"""``lmctl env``: versions, devices and precision support, for bug reports."""

from __future__ import annotations

import inspect
from typing import Any

import typer

from lmctl.cli.help import CommandDoc, add_command
from lmctl.cli.options import JsonOpt
from lmctl.cli.params import with_signature
from lmctl.cli.runner import run_command
from lmctl.console import Console, OutputOptions

HELP = """Show lmctl's environment: versions, devices, bf16 support and CPU threads.

Paste it into a bug report:

    lmctl env
    lmctl env --json
"""


def run_env(console: Console) -> dict[str, Any]:
    from lmctl.environment import report

    info = report()
    if not console.options.json:
        rows: list[tuple[str, str]] = []
        for key, value in info.items():
            if isinstance(value, dict):
                rows += [(name, str(v)) for name, v in value.items()]
            elif isinstance(value, list):
                rows.append((key, ", ".join(map(str, value)) or "none"))
            else:
                rows.append((key, str(value)))
        width = max(len(key) for key, _ in rows)
        console.write("\n".join(f"{key:<{width}}  {value}" for key, value in rows) + "\n")
    return info


def _command(*, json_output: bool = False) -> None:
    run_command(run_env, OutputOptions(json=json_output), "env")


def register(app: typer.Typer, parent: CommandDoc) -> None:
    kw = inspect.Parameter.KEYWORD_ONLY
    params = [inspect.Parameter("json_output", kw, default=False, annotation=JsonOpt)]
    command = with_signature(_command, params, HELP)
    add_command(app, parent, "env", command, "Show versions, devices and precision support.")
