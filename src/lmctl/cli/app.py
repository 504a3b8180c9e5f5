"""The ``lmctl`` root command: wiring only. Each command group lives in its own module."""

from __future__ import annotations

from typing import Annotated

import typer

from lmctl import __version__
from lmctl.cli import eval as eval_cmd
from lmctl.cli import prepare, push, resume, train

app = typer.Typer(
    name="lmctl",
    help="Train, fine-tune, evaluate, resume and publish transformer language models.",
    no_args_is_help=True,
    rich_markup_mode="markdown",
    pretty_exceptions_enable=False,
    context_settings={"help_option_names": ["-h", "--help"]},
)

train.register()
app.add_typer(train.train_app, name="train")
prepare.register()
app.add_typer(prepare.prepare_app, name="prepare")
eval_cmd.register(app)
resume.register(app)
app.command("push", short_help="Publish a run or model to the Hub or an object store.")(
    push.push_command
)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"lmctl {__version__}")
        raise typer.Exit()


@app.callback()
def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """Train, fine-tune, evaluate, resume and publish transformer language models.

    Exit codes: 0 success, 2 usage or config error, 3 data error, 4 training failed
    (non-finite loss or a full disk), 5 model or tokenizer error, 6 Hub or object store
    unreachable, 7 permission denied, 130 interrupted. Set LMCTL_DEBUG=1 to see tracebacks.
    """


def main() -> None:
    app(prog_name="lmctl")
