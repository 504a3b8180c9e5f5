"""The ``lmctl`` root command: wiring only. Each command group lives in its own module.

Commands are listed in the order of a workflow: train, prepare, data, eval, predict, resume,
push, then the helpers that look at configs, runs and the environment.
"""

from __future__ import annotations

import sys
from typing import Annotated

import typer

from lmctl import __version__
from lmctl.cli import config as config_cmd
from lmctl.cli import data as data_cmd
from lmctl.cli import env as env_cmd
from lmctl.cli import eval as eval_cmd
from lmctl.cli import predict, prepare, push, resume, runs, train
from lmctl.cli.help import OptionDoc, add_command, add_group, set_group_options

ROOT_HELP = """Train, fine-tune, evaluate, resume and publish transformer language models.

Exit codes: 0 success, 2 usage or config error, 3 data error, 4 training failed
(non-finite loss or a full disk), 5 model or tokenizer error, 6 Hub or object store
unreachable, 7 permission denied, 130 interrupted. Set LMCTL_DEBUG=1 to see tracebacks.
"""

app, ROOT = add_group(
    None,
    None,
    "lmctl",
    "Train, fine-tune, evaluate, resume and publish transformer language models.",
    ROOT_HELP,
)

train.register(app, ROOT)
prepare.register(app, ROOT)
data_cmd.register(app, ROOT)
eval_cmd.register(app, ROOT)
predict.register(app, ROOT)
resume.register(app, ROOT)
add_command(
    app, ROOT, "push", push.push_command, "Publish a run or model to the Hub or an object store."
)
config_cmd.register(app, ROOT)
runs.register(app, ROOT)
env_cmd.register(app, ROOT)


def _version(value: bool) -> None:
    if value:
        typer.echo(f"lmctl {__version__}")
        raise typer.Exit()


def root(
    version: Annotated[
        bool,
        typer.Option("--version", callback=_version, is_eager=True, help="Show the version."),
    ] = False,
) -> None:
    """The root options."""


#: Typer's own options of the root command.
_COMPLETION_OPTIONS = [
    OptionDoc(["--install-completion"], None, "Install completion for the current shell."),
    OptionDoc(
        ["--show-completion"],
        None,
        "Show completion for the current shell, to copy it or customize the installation.",
    ),
]
for _option in _COMPLETION_OPTIONS:
    _option.takes_value = False
set_group_options(app, ROOT, root, _COMPLETION_OPTIONS)


def main(argv: list[str] | None = None) -> None:
    """``lmctl``."""
    app(args=sys.argv[1:] if argv is None else list(argv), prog_name="lmctl")
