"""Mistakes on the command line itself, told like every other error.

The parser (Typer's copy of Click) finds an unknown option or command, a missing value or a
value of the wrong type before any command code runs, and would print its own box with no
hint and nothing on stdout. :class:`CommandGroup`, the class of every lmctl command group,
hands those to :func:`report` instead: one ``error:`` line naming the flag and a ``hint:``
naming the fix, exit code 2, and with ``--json`` anywhere on the command line the one JSON
object on stdout that every failure prints.
"""

from __future__ import annotations

import difflib
import sys
from collections.abc import Sequence
from typing import Any, NoReturn

import typer
from typer._click.exceptions import NoSuchOption  # typer 0.29 carries its own Click
from typer.core import TyperGroup

from lmctl.cli.runner import run_command
from lmctl.console import Console, OutputOptions
from lmctl.errors import ConfigError, LmctlError

#: Where the root group keeps the command line, for the failures found below it.
_ARGV = "lmctl.argv"


def output_options(args: Sequence[str]) -> OutputOptions:
    """The output a command line asks for, read from its words (the parser did not finish)."""
    return OutputOptions(json="--json" in args, quiet="--quiet" in args or "-q" in args)


def report(error: LmctlError, args: Sequence[str], command: str) -> NoReturn:
    """Tell ``error`` like a command's own failure, then exit with its code."""

    def body(console: Console) -> NoReturn:
        raise error

    try:
        run_command(body, output_options(args), command)
    except typer.Exit as done:
        sys.exit(done.exit_code)
    sys.exit(int(error.exit_code))


def _visible_options(command: Any) -> list[str]:
    """The option names ``--help`` shows for ``command`` (hidden ones are never suggested)."""
    names: list[str] = []
    for param in getattr(command, "params", []):
        if param.param_type_name == "option" and not getattr(param, "hidden", False):
            names += [*param.opts, *param.secondary_opts]
    return names


def _closest(word: str, names: list[str]) -> list[str]:
    """The names nearest to ``word``: the best match and those about as close (``--model``
    and ``--model-type`` for ``--model-name``), not every name that is somewhat alike."""
    scored = [
        (difflib.SequenceMatcher(None, word, name).ratio(), name)
        for name in difflib.get_close_matches(word, names, n=3)
    ]
    best = max((score for score, _ in scored), default=0.0)
    return [name for score, name in scored if score >= best - 0.05]


def usage_error(error: typer.TyperException) -> ConfigError:
    """The parser's ``error`` as lmctl's usage error: the flag it concerns, and the fix."""
    ctx = getattr(error, "ctx", None)
    path = ctx.command_path if ctx is not None else "lmctl"
    if isinstance(error, NoSuchOption):
        known = _visible_options(ctx.command) if ctx is not None else []
        close = _closest(error.option_name, known)
        guess = f" (did you mean {' or '.join(close)}?)" if close else ""
        return ConfigError(
            f"{error.option_name}: no such option of '{path}'{guess}",
            f"'{path} --help' lists its options",
        )
    message = " ".join(error.format_message().split()).rstrip(".")
    return ConfigError(f"{path}: {message}", f"'{path} --help' shows how to call it")


def _command_of(ctx: Any) -> str:
    """The command as the ``--json`` object names it (``train mlm``)."""
    return " ".join(ctx.command_path.split()[1:]) if ctx is not None else ""


class CommandGroup(TyperGroup):
    """A command group whose command-line mistakes :func:`report` tells."""

    def make_context(
        self,
        info_name: str | None,
        args: list[str],
        parent: Any = None,
        **extra: Any,
    ) -> Any:
        argv = list(args) if parent is None else parent.meta.get(_ARGV, list(args))
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except typer.TyperException as error:
            report(usage_error(error), argv, _command_of(getattr(error, "ctx", None)))
        if parent is None:
            ctx.meta[_ARGV] = argv
        return ctx

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except typer.TyperException as error:
            failed = getattr(error, "ctx", None) or ctx
            report(usage_error(error), ctx.meta.get(_ARGV, []), _command_of(failed))
        except ConfigError as error:  # an unknown command (resolve_command)
            report(error, ctx.meta.get(_ARGV, []), _command_of(ctx))

    def resolve_command(self, ctx: Any, args: list[str]) -> Any:
        name = args[0] if args else ""
        unknown = name and not name.startswith("-") and self.get_command(ctx, name) is None
        if unknown and not ctx.resilient_parsing:
            raise self._unknown_command(ctx, name)
        return super().resolve_command(ctx, args)

    def _unknown_command(self, ctx: Any, name: str) -> ConfigError:
        """``lmctl train bert``: the commands there are, and the closest to what was typed."""
        path = ctx.command_path
        commands = sorted(
            command
            for command in self.list_commands(ctx)
            if not getattr(self.get_command(ctx, command), "hidden", False)
        )
        close = difflib.get_close_matches(name, commands, n=1)
        guess = f" (did you mean '{path} {close[0]}'?)" if close else ""
        return ConfigError(
            f"'{path}' has no command '{name}'{guess}; its commands are {', '.join(commands)}",
            f"'{path} --help' says what each does",
        )
