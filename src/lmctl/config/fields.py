"""Declaring a config field once: its type, default, help text, CLI flags and help panel.

Every option of every command is a pydantic field declared with :func:`option`. The CLI
layer builds its flags from these declarations, so a flag, its help text and its validation
can never drift apart.
"""

from __future__ import annotations

from typing import Any

from pydantic import Field
from pydantic.fields import FieldInfo

PANEL_MODEL = "Model"
PANEL_DATA = "Data"
PANEL_TRAINING = "Training"
PANEL_EVAL = "Evaluation and checkpoints"
PANEL_OBJECTIVE = "Objective"
PANEL_PUBLISH = "Publishing"
PANEL_HUB = "Hub (hf://)"
PANEL_OUTPUT = "Output"
#: Help panels in the order a user fills them in; panels not listed come before Output.
PANEL_ORDER = (
    PANEL_MODEL,
    PANEL_DATA,
    PANEL_OBJECTIVE,
    PANEL_TRAINING,
    PANEL_EVAL,
    PANEL_PUBLISH,
    PANEL_HUB,
    PANEL_OUTPUT,
)


def option(
    default: Any,
    help: str,
    *,
    panel: str,
    flags: tuple[str, ...] = (),
    secret: bool = False,
    cli: bool = True,
    **constraints: Any,
) -> Any:
    """A config field that is also a command-line flag.

    ``flags`` adds short aliases to the flag derived from the field name
    (``model_name_or_path`` -> ``--model-name-or-path``). ``secret`` fields are never written
    to disk or printed. ``cli=False`` keeps a field out of the command line (config file only).
    """
    extra: dict[str, Any] = {"panel": panel, "flags": list(flags), "secret": secret, "cli": cli}
    return Field(default, description=help, json_schema_extra=extra, **constraints)


def flag_name(field_name: str) -> str:
    return "--" + field_name.replace("_", "-")


def field_extra(info: FieldInfo) -> dict[str, Any]:
    extra = info.json_schema_extra
    return extra if isinstance(extra, dict) else {}
