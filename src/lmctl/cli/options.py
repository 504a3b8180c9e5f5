"""Options that belong to the command line rather than to a config, declared once."""

from __future__ import annotations

from typing import Annotated

import typer

from lmctl.config.fields import PANEL_OUTPUT

ConfigOpt = Annotated[
    str | None,
    typer.Option(
        "--config",
        "-c",
        help="Config file (YAML, JSON or TOML; upstream run_*.py JSON args files work too). "
        "Flags given on the command line override it.",
        rich_help_panel=PANEL_OUTPUT,
        show_default=False,
    ),
]
JsonOpt = Annotated[
    bool,
    typer.Option(
        "--json",
        help="Print one JSON result object on stdout; everything else goes to stderr.",
        rich_help_panel=PANEL_OUTPUT,
    ),
]
QuietOpt = Annotated[
    bool,
    typer.Option(
        "--quiet", "-q", help="Only warnings, errors and the result.", rich_help_panel=PANEL_OUTPUT
    ),
]
NoProgressOpt = Annotated[
    bool,
    typer.Option(
        "--no-progress",
        help="Plain timestamped log lines instead of a live display (automatic when not a "
        "terminal or CI is set).",
        rich_help_panel=PANEL_OUTPUT,
    ),
]
DryRunOpt = Annotated[
    bool,
    typer.Option(
        "--dry-run",
        help="Validate, print the resolved config and exit without training.",
        rich_help_panel=PANEL_OUTPUT,
    ),
]
