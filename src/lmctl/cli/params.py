"""Command-line flags generated from config fields.

Each config field (``lmctl.config``) declares its help text, panel and aliases once; this
module turns a config model into a Typer-compatible function signature. Every flag defaults
to ``None`` so that "not given" differs from "given with the default value", which is what
the defaults < config file < flags merge needs.
"""

from __future__ import annotations

import inspect
import types
import typing
from collections.abc import Callable
from typing import Annotated, Any, Literal, Union, get_args, get_origin

import typer
from pydantic import BaseModel, SecretStr
from pydantic.fields import FieldInfo

from lmctl.config.fields import field_extra, flag_name


def _unwrap_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _cli_type(annotation: Any) -> Any:
    inner = _unwrap_optional(annotation)
    if inner is SecretStr:
        return str
    if get_origin(inner) is Literal:
        return inner
    if get_origin(inner) is list:
        return list[get_args(inner)[0]]  # type: ignore[misc]
    return inner


def _shown_default(value: Any) -> str | bool:
    if value is None or value in ([], {}):
        return False
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def config_parameters(
    model: type[BaseModel], include: Callable[[str, FieldInfo], bool] | None = None
) -> list[inspect.Parameter]:
    """One keyword parameter (with its ``typer.Option``) per command-line config field
    (those ``include`` accepts, when given)."""
    params = []
    for name, info in model.model_fields.items():
        extra = field_extra(info)
        if not extra.get("cli", True) or (include is not None and not include(name, info)):
            continue
        cli_type = _cli_type(info.annotation)
        declared = list(extra.get("flags", []))
        if cli_type is bool:
            toggles = [decl for decl in declared if "/" in decl]
            decls = toggles or [f"{flag_name(name)}/--no-{flag_name(name)[2:]}"]
            decls += [decl for decl in declared if "/" not in decl]
        else:
            decls = [flag_name(name), *declared]
        option = typer.Option(
            *decls,
            help=info.description,
            rich_help_panel=extra.get("panel"),
            show_default=_shown_default(info.default),
        )
        annotation = Annotated[typing.Optional[cli_type], option]  # type: ignore[valid-type] # noqa: UP045
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
            )
        )
    return params


def with_signature(
    function: Callable[..., Any], params: list[inspect.Parameter], doc: str
) -> Callable[..., Any]:
    """Give ``function(**kwargs)`` an explicit signature that Typer reads as its options."""
    ordered = sorted(params, key=lambda p: p.kind)
    function.__signature__ = inspect.Signature(ordered)  # type: ignore[attr-defined]
    function.__annotations__ = {p.name: p.annotation for p in ordered}
    function.__doc__ = doc
    return function


def given(values: dict[str, Any], model: type[BaseModel]) -> dict[str, Any]:
    """The config fields that were actually given on the command line."""
    out = {}
    for name in model.model_fields:
        value = values.get(name)
        if value is None or (isinstance(value, list) and not value):
            continue
        out[name] = value
    return out
