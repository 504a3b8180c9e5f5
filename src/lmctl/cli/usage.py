"""Mistakes on the command line itself, told like every other error.

The root group first rewrites an upstream script's command line into lmctl's flags. The
parser (Typer's copy of Click) then finds an unknown option or command, a missing value or a
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
from lmctl.cli.upstream import upstream_arguments
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


def _in_lmctl_spelling(args: list[str]) -> list[str]:
    """``args`` with an upstream script's arguments after ``train OBJ`` rewritten into lmctl's
    flags (:mod:`lmctl.cli.upstream`), before the parser reads them, whichever way the app is
    started; a mistake found doing so is told like any other."""
    try:
        return upstream_arguments(args)
    except LmctlError as error:
        report(error, args, " ".join(args[:2]))


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


def usage_error(error: typer.TyperException, path: str) -> ConfigError:
    """The parser's ``error`` as lmctl's usage error: the flag it concerns, and the fix.
    ``path``: the command it was found in (``lmctl train mlm``)."""
    ctx = getattr(error, "ctx", None)
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


def _path(error: typer.TyperException, ctx: Any) -> str:
    """The command ``error`` was found in: its own context's, else the subcommand that ``ctx``
    (the group that caught it) was starting, else the group."""
    own = getattr(error, "ctx", None)
    if own is not None:
        return str(own.command_path)
    if ctx is None:
        return "lmctl"
    started = ctx.invoked_subcommand
    return f"{ctx.command_path} {started}" if started else str(ctx.command_path)


def _command(path: str) -> str:
    """The command as the ``--json`` object names it (``train mlm``)."""
    return " ".join(path.split()[1:])


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
        if parent is None and not extra.get("resilient_parsing"):
            args = _in_lmctl_spelling(argv)
        try:
            ctx = super().make_context(info_name, args, parent=parent, **extra)
        except typer.TyperException as error:
            path = _path(error, parent)
            report(usage_error(error, path), argv, _command(path))
        if parent is None:
            ctx.meta[_ARGV] = argv
        return ctx

    def invoke(self, ctx: Any) -> Any:
        try:
            return super().invoke(ctx)
        except typer.TyperException as error:
            path = _path(error, ctx)
            report(usage_error(error, path), ctx.meta.get(_ARGV, []), _command(path))
        except ConfigError as error:  # an unknown command (resolve_command)
            report(error, ctx.meta.get(_ARGV, []), _command(ctx.command_path))

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
