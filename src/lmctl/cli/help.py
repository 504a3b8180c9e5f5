"""``--help`` for every command, laid out for a terminal of any width, and the command tree.

Each command declares its options once (``typer.Option`` in an ``Annotated`` signature); the
tree of :class:`CommandDoc` records those signatures as they are registered, and the same
model renders ``--help`` (rich), the CLI reference (``docs/cli.md``) and the static shell
completion. The layout: one row per option, the flag and its value on the first line, its
aliases and ``--no-`` form under it, the help text in a column that keeps at least 40
characters at 80 columns; panels in the order a user fills them; examples verbatim.
"""

from __future__ import annotations

import inspect
import os
import sys
import textwrap
import typing
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Annotated, Any, Literal, get_args, get_origin

import typer

from lmctl.cli.usage import CommandGroup
from lmctl.config.fields import PANEL_ORDER, PANEL_OUTPUT

#: Help text column kept at 80 columns and more.
MIN_HELP_WIDTH = 40
#: The flag column never grows past this; wider terminals give the room to the help text.
MAX_NAME_WIDTH = 36
#: Columns taken by a panel's borders and the gap between the two columns.
_PANEL_CHROME = 4 + 2
PANEL_ARGUMENTS = "Arguments"
PANEL_OPTIONS = "Options"


@dataclass
class OptionDoc:
    """One option or argument as ``--help`` shows it."""

    names: list[str]
    metavar: str | None
    help: str
    default: str | None = None
    panel: str = PANEL_OPTIONS
    choices: list[str] = field(default_factory=list)
    argument: bool = False
    takes_value: bool = True
    repeatable: bool = False


@dataclass
class CommandDoc:
    """A command or group: its help text, options and subcommands, in display order."""

    path: tuple[str, ...]
    summary: str
    text: str = ""
    options: list[OptionDoc] = field(default_factory=list)
    children: list[CommandDoc] = field(default_factory=list)

    @property
    def name(self) -> str:
        return " ".join(("lmctl", *self.path))

    def walk(self) -> Iterator[CommandDoc]:
        yield self
        for child in self.children:
            yield from child.walk()

    def usage(self) -> str:
        pieces = [self.name]
        if any(not o.argument for o in self.options):
            pieces.append("[OPTIONS]")
        pieces += [o.names[0] for o in self.options if o.argument]
        if self.children:
            pieces.append("COMMAND [ARGS]...")
        return " ".join(pieces)

    def panels(self) -> list[tuple[str, list[OptionDoc]]]:
        grouped: dict[str, list[OptionDoc]] = {}
        for option in self.options:
            grouped.setdefault(option.panel, []).append(option)
        order = [PANEL_ARGUMENTS, PANEL_OPTIONS, *PANEL_ORDER]

        def rank(name: str) -> tuple[int, int]:
            # Panels that are not listed come before Output, in the order they appear.
            if name in order:
                return (order.index(name) if name != order[-1] else len(order) + 1, 0)
            return (len(order), list(grouped).index(name))

        return sorted(grouped.items(), key=lambda item: rank(item[0]))


# Reading the declarations --------------------------------------------------------------------


def _unwrap(annotation: Any) -> tuple[Any, Any]:
    """``Annotated[T, info]`` -> (T without Optional, info)."""
    base, info = annotation, None
    if get_origin(annotation) is Annotated:
        base, *extra = get_args(annotation)
        info = next((item for item in extra if isinstance(item, typer.models.ParameterInfo)), None)
    if get_origin(base) in (typing.Union, getattr(__import__("types"), "UnionType", None)):
        args = [arg for arg in get_args(base) if arg is not type(None)]
        if len(args) == 1:
            base = args[0]
    return base, info


def _declared_names(info: Any, name: str) -> list[str]:
    decls = list(info.param_decls or ())
    if isinstance(info.default, str) and info.default.startswith("-"):
        decls.insert(0, info.default)
    names: list[str] = []
    for decl in decls or ["--" + name.replace("_", "-")]:
        names += [part.strip() for part in decl.split("/") if part.strip()]
    longs = [n for n in names if n.startswith("--")]
    shorts = [n for n in names if not n.startswith("--")]
    return longs[:1] + shorts + longs[1:]


def _choices(base: Any, info: Any) -> list[str]:
    if get_origin(base) is Literal:
        return [str(choice) for choice in get_args(base)]
    completer = getattr(info, "autocompletion", None)
    if completer is not None:
        try:
            return [str(item) for item in completer("")]
        except TypeError:
            return []
    return []


_METAVARS = {int: "INT", float: "FLOAT", str: "TEXT"}


def option_doc(param: inspect.Parameter) -> OptionDoc | None:
    """The help entry of one signature parameter (None when hidden)."""
    base, info = _unwrap(param.annotation)
    if info is None or getattr(info, "hidden", False):
        return None
    choices = _choices(base, info)
    repeatable = get_origin(base) is list
    help_text = " ".join((info.help or "").split())
    if isinstance(info, typer.models.ArgumentInfo):
        label = info.metavar or param.name.upper()
        return OptionDoc([label], None, help_text, argument=True, panel=PANEL_ARGUMENTS)
    names = _declared_names(info, param.name)
    flag = base is bool
    metavar: str | None = None
    if not flag:
        metavar = info.metavar or _METAVARS.get(base, "TEXT")
        if choices:
            metavar = "[" + "|".join(choices) + "]"
    default = info.show_default if isinstance(info.show_default, str) else None
    return OptionDoc(
        names=names,
        metavar=metavar,
        help=help_text,
        default=default or None,
        panel=info.rich_help_panel or PANEL_OPTIONS,
        choices=choices,
        takes_value=not flag,
        repeatable=repeatable,
    )


def options_of(function: Callable[..., Any]) -> list[OptionDoc]:
    docs = (option_doc(p) for p in inspect.signature(function, eval_str=True).parameters.values())
    return [doc for doc in docs if doc is not None]


# The help option and registration ----------------------------------------------------------------

HELP_TEXT = "Show this help and exit."


def _help_parameter(doc: CommandDoc) -> inspect.Parameter:
    def show(ctx: typer.Context, value: bool) -> None:
        if value and not ctx.resilient_parsing:
            print_help(doc)
            raise typer.Exit()

    option = typer.Option(
        "--help", "-h", help=HELP_TEXT, is_eager=True, expose_value=False, callback=show
    )
    return inspect.Parameter(
        "show_help",
        inspect.Parameter.KEYWORD_ONLY,
        default=False,
        annotation=Annotated[bool, option],
    )


def _with_help(function: Callable[..., Any], doc: CommandDoc) -> Callable[..., Any]:
    """``function`` with the ``--help`` option added to its signature."""
    signature = inspect.signature(function, eval_str=True)
    params = sorted([*signature.parameters.values(), _help_parameter(doc)], key=lambda p: p.kind)

    def command(*args: Any, **kwargs: Any) -> Any:
        kwargs.pop("show_help", None)
        return function(*args, **kwargs)

    command.__signature__ = signature.replace(parameters=params)  # type: ignore[attr-defined]
    command.__annotations__ = {p.name: p.annotation for p in params}
    command.__doc__ = function.__doc__
    command.__name__ = getattr(function, "__name__", "command")
    return command


def add_command(
    app: typer.Typer,
    parent: CommandDoc,
    name: str,
    function: Callable[..., Any],
    summary: str,
    *,
    text: str | None = None,
) -> CommandDoc:
    """Register ``function`` as ``name`` under ``app`` with lmctl's ``--help``."""
    text = text if text is not None else (function.__doc__ or "")
    doc = CommandDoc((*parent.path, name), summary, inspect.cleandoc(text))
    options = options_of(function)
    output = any(option.panel == PANEL_OUTPUT for option in options)
    doc.options = [*options, _help_entry(PANEL_OUTPUT if output else PANEL_OPTIONS)]
    app.command(name, help=text or summary, short_help=summary)(_with_help(function, doc))
    parent.children.append(doc)
    return doc


def add_group(
    app: typer.Typer | None, parent: CommandDoc | None, name: str, summary: str, text: str = ""
) -> tuple[typer.Typer, CommandDoc]:
    """A command group; without a subcommand (or with ``--help``) it shows its help."""
    path = (*parent.path, name) if parent is not None else ()
    doc = CommandDoc(path, summary, inspect.cleandoc(text or summary))
    group = typer.Typer(
        name=name,
        help=text or summary,
        add_completion=app is None,
        pretty_exceptions_enable=False,
        context_settings={"help_option_names": []},
        cls=CommandGroup,
    )

    def callback(ctx: typer.Context) -> None:
        if ctx.invoked_subcommand is None and not ctx.resilient_parsing:
            print_help(doc)
            raise typer.Exit()

    callback.__doc__ = text or summary
    doc.options = [_help_entry()]
    group.callback(invoke_without_command=True)(_with_help(callback, doc))
    if app is not None and parent is not None:
        app.add_typer(group, name=name, help=text or summary, short_help=summary)
        parent.children.append(doc)
    return group, doc


def set_group_options(
    group: typer.Typer, doc: CommandDoc, function: Callable[..., Any], extra: list[OptionDoc]
) -> None:
    """Replace a group's callback with ``function`` (its own options, e.g. ``--version``)."""

    def callback(ctx: typer.Context, **values: Any) -> None:
        function(**values)
        if ctx.invoked_subcommand is None and not ctx.resilient_parsing:
            print_help(doc)
            raise typer.Exit()

    params = [
        inspect.Parameter("ctx", inspect.Parameter.POSITIONAL_OR_KEYWORD, annotation=typer.Context)
    ]
    params += list(inspect.signature(function, eval_str=True).parameters.values())
    callback.__signature__ = inspect.Signature(params)  # type: ignore[attr-defined]
    callback.__annotations__ = {p.name: p.annotation for p in params}
    doc.options = options_of(function) + extra + [_help_entry()]
    group.callback(invoke_without_command=True)(_with_help(callback, doc))


def _help_entry(panel: str = PANEL_OPTIONS) -> OptionDoc:
    return OptionDoc(["--help", "-h"], None, HELP_TEXT, panel=panel, takes_value=False)


# Rendering ---------------------------------------------------------------------------------------


def terminal_width() -> int:
    """COLUMNS (or TERMINAL_WIDTH), else the terminal's width, else 80."""
    for name in ("COLUMNS", "TERMINAL_WIDTH"):
        value = os.environ.get(name, "")
        if value.isdigit() and int(value) > 0:
            return int(value)
    try:
        return os.get_terminal_size(sys.stdout.fileno()).columns
    except (OSError, ValueError, AttributeError):
        return 80


def blocks(text: str) -> list[tuple[str, str]]:
    """Split help text into ("text", paragraph) and ("code", verbatim lines) blocks."""
    out: list[tuple[str, str]] = []
    for chunk in inspect.cleandoc(text).split("\n\n"):
        if not chunk.strip():
            continue
        lines = chunk.split("\n")
        if all(line.startswith("    ") or not line.strip() for line in lines):
            out.append(("code", textwrap.dedent(chunk).strip("\n")))
        else:
            out.append(("text", " ".join(line.strip() for line in lines if line.strip())))
    return out


def _name_lines(option: OptionDoc, width: int) -> list[str]:
    """The option's first column: flag and value, then aliases (wrapped to ``width``)."""
    first = option.names[0]
    lines = [first]
    metavar = _shown_metavar(option, width)
    if metavar:
        if len(f"{first} {metavar}") <= width:
            lines = [f"{first} {metavar}"]
        else:
            lines.append(f"  {metavar}")
    current = ""
    for alias in option.names[1:]:
        piece = alias if not current else f"{current}, {alias}"
        if current and len("  " + piece) > width:
            lines.append("  " + current)
            current = alias
        else:
            current = piece
    if current:
        lines.append("  " + current)
    return lines


def _shown_metavar(option: OptionDoc, width: int) -> str | None:
    """The value placeholder; a list of choices too long for the column becomes CHOICE (the
    choices are then listed in the help text)."""
    metavar = option.metavar
    if metavar and option.choices and not _choices_fit(option, width):
        return "CHOICE"
    return metavar


def _choices_fit(option: OptionDoc, width: int) -> bool:
    metavar = option.metavar or ""
    return len(f"{option.names[0]} {metavar}") <= width or len(f"  {metavar}") <= width


def _help_line(option: OptionDoc, name_width: int) -> str:
    text = option.help
    if option.choices and not _choices_fit(option, name_width):
        text += " One of: " + ", ".join(option.choices) + "."
    if option.default is not None:
        text += f" [default: {option.default}]"
    return text.strip()


def name_column_width(doc: CommandDoc, width: int) -> int:
    """Wide enough for every flag name, narrow enough to leave the help its minimum."""
    cap = max(min(width - _PANEL_CHROME - MIN_HELP_WIDTH, MAX_NAME_WIDTH), 0)
    longest_name = max((len(n) + 2 for o in doc.options for n in o.names), default=0)
    # Measured with long choice lists moved to the help text (see _shown_metavar).
    natural = max((len(line) for o in doc.options for line in _name_lines(o, cap)), default=0)
    return max(min(natural, cap), min(longest_name, width - _PANEL_CHROME - 10))


def render(doc: CommandDoc, width: int, *, color: bool = False) -> Any:
    """The help page as a rich renderable group for a console ``width`` columns wide."""
    from rich import box
    from rich.console import Group
    from rich.padding import Padding
    from rich.panel import Panel
    from rich.table import Table
    from rich.text import Text

    items: list[Any] = [Padding(Text(f"Usage: {doc.usage()}", style="bold"), (1, 1, 1, 1))]
    for kind, body in blocks(doc.text or doc.summary):
        if kind == "code":
            items.append(Padding(Text(body, style="cyan", overflow="fold"), (0, 1, 1, 5)))
        else:
            items.append(Padding(Text(body), (0, 1, 1, 1)))
    name_width = name_column_width(doc, width)
    for title, options in doc.panels():
        table = Table(box=None, show_header=False, padding=(0, 1), pad_edge=False, expand=True)
        table.add_column(width=name_width, no_wrap=True, overflow="fold")
        table.add_column(ratio=1, overflow="fold")
        for option in options:
            names = Text(overflow="fold")
            for index, line in enumerate(_name_lines(option, name_width)):
                if index:
                    names.append("\n")
                style = "bold cyan" if line.lstrip().startswith("-") else "yellow"
                if option.argument:
                    style = "bold yellow"
                flag, _, value = line.partition(" ") if index == 0 else (line, "", "")
                names.append(flag, style=style)
                if value:
                    names.append(" " + value, style="yellow")
            help_text = Text(_help_line(option, name_width))
            table.add_row(names, help_text)
        items.append(Panel(table, title=title, title_align="left", box=box.ROUNDED))
    if doc.children:
        table = Table(box=None, show_header=False, padding=(0, 1), pad_edge=False, expand=True)
        table.add_column(no_wrap=True, style="bold cyan")
        table.add_column(ratio=1)
        for child in doc.children:
            table.add_row(child.path[-1], child.summary)
        items.append(Panel(table, title="Commands", title_align="left", box=box.ROUNDED))
    return Group(*items)


def help_text(doc: CommandDoc, width: int) -> str:
    """The help page as plain text, ``width`` columns wide (what tests and docs read)."""
    from rich.console import Console

    console = Console(
        width=width, color_system=None, force_terminal=False, highlight=False, record=True
    )
    with console.capture() as capture:
        console.print(render(doc, width))
    return "\n".join(line.rstrip() for line in capture.get().splitlines()) + "\n"


def print_help(doc: CommandDoc) -> None:
    from rich.console import Console

    width = terminal_width()
    console = Console(width=width, highlight=False)
    console.print(render(doc, width))
