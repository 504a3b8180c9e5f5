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
from pydantic import BaseModel
from pydantic.fields import FieldInfo

from lmctl.config.fields import field_extra, flag_name


def unwrap_optional(annotation: Any) -> Any:
    if get_origin(annotation) in (Union, types.UnionType):
        args = [arg for arg in get_args(annotation) if arg is not type(None)]
        if len(args) == 1:
            return args[0]
    return annotation


def _cli_type(annotation: Any) -> tuple[Any, str | None, list[str]]:
    """The type Typer parses, its metavar, and completion choices.

    Scalars are taken as text and converted by pydantic, so that every bad value gets the
    same one-line error naming the flag; only flags and repeatable options keep their type.
    """
    inner = unwrap_optional(annotation)
    if inner is bool:
        return bool, None, []
    if get_origin(inner) is list:
        return list[str], "TEXT", []
    if get_origin(inner) is Literal:
        choices = [str(choice) for choice in get_args(inner)]
        return str, "[" + "|".join(choices) + "]", choices
    names = {int: "INT", float: "FLOAT"}
    return str, names.get(inner, "TEXT"), []


def _completer(choices: list[str]) -> Callable[[str], list[str]] | None:
    if not choices:
        return None

    def complete(incomplete: str) -> list[str]:
        return [choice for choice in choices if choice.startswith(incomplete)]

    return complete


def _shown_default(value: Any) -> str | bool:
    if value is None or value in ([], {}):
        return False
    if isinstance(value, bool):
        return "on" if value else "off"
    return str(value)


def config_parameters(
    model: type[BaseModel],
    *,
    only: tuple[str, ...] | None = None,
    include: Callable[[str, FieldInfo], bool] | None = None,
    hidden: bool = False,
    show_defaults: bool = True,
) -> list[inspect.Parameter]:
    """One keyword parameter (with its ``typer.Option``) per command-line config field.

    ``only`` keeps the named fields (in that order); ``include`` keeps the fields it accepts;
    ``hidden`` keeps the flags out of ``--help`` and completion (they still parse, so a
    command can refuse them by name); ``show_defaults=False`` for commands whose defaults come
    from elsewhere (a saved run).
    """
    names = only if only is not None else tuple(model.model_fields)
    params = []
    for name in names:
        info = model.model_fields[name]
        extra = field_extra(info)
        if not extra.get("cli", True) or (include is not None and not include(name, info)):
            continue
        cli_type, metavar, choices = _cli_type(info.annotation)
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
            show_default=_shown_default(info.default) if show_defaults else False,
            hidden=hidden,
            metavar=metavar,
            autocompletion=_completer(choices),
        )
        annotation = Annotated[typing.Optional[cli_type], option]  # type: ignore[valid-type] # noqa: UP045
        params.append(
            inspect.Parameter(
                name, inspect.Parameter.KEYWORD_ONLY, default=None, annotation=annotation
            )
        )
    return params


def union_fields(models: list[type[BaseModel]]) -> dict[str, type[BaseModel]]:
    """Every field name declared by any of ``models``, with the first model declaring it."""
    out: dict[str, type[BaseModel]] = {}
    for model in models:
        for name in model.model_fields:
            out.setdefault(name, model)
    return out


def given_flags(values: dict[str, Any], names: list[str] | tuple[str, ...]) -> list[str]:
    """The flags among ``names`` that were given on the command line."""
    return [flag_name(name) for name in names if values.get(name) not in (None, [])]


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
