"""``--help`` reads well at 80 columns and more: whole flag names, a help column of at least
40 characters, examples once and verbatim, panels and commands in the order people use them,
and the checked-in 80-column pages (tests/snapshots/help-80.txt) match the app."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

import pytest

from lmctl.cli.app import ROOT as COMMANDS
from lmctl.cli.help import MIN_HELP_WIDTH, CommandDoc, blocks, help_text

REPO = Path(__file__).resolve().parent.parent
DOCS = list(COMMANDS.walk())


def whole(name: str, text: str) -> bool:
    return re.search(r"(?<![\w-])" + re.escape(name) + r"(?![\w-])", text) is not None


def help_column_width(doc: CommandDoc, text: str, option_help: str, flag: str) -> int:
    """Width of the help column on the row of ``flag``: from where its help starts to the
    panel's right border."""
    start = option_help.split(maxsplit=1)[0]
    for line in text.splitlines():
        if not line.startswith("│"):
            continue  # not a panel row
        stripped = line.lstrip("│ ")
        if stripped.startswith(flag + " ") or stripped == flag:
            position = line.find(start, line.find(flag) + len(flag))
            assert position > 0, f"{doc.name}: no help text on the row of {flag}:\n{line}"
            return line.rindex("│") - 1 - position
    raise AssertionError(f"{doc.name}: {flag} has no row of its own:\n{text}")


@pytest.mark.parametrize("doc", DOCS, ids=[doc.name for doc in DOCS])
def test_help_reads_well_at_80_columns(doc: CommandDoc) -> None:
    text = help_text(doc, 80)
    assert "…" not in text, text
    assert max(len(line) for line in text.splitlines()) <= 80
    assert "\n\n\n" not in text, "doubled blank lines"
    for option in doc.options:
        for name in option.names:
            assert whole(name, text), f"{doc.name}: {name} is not shown whole"
        if option.help and not option.argument:
            width = help_column_width(doc, text, option.help, option.names[0])
            assert width >= MIN_HELP_WIDTH, f"{doc.name} {option.names[0]}: help column {width}"
    rendered_lines = [line.strip() for line in text.splitlines()]
    for kind, body in blocks(doc.text):
        if kind == "code":
            for line in body.splitlines():
                assert rendered_lines.count(line.strip()) == 1, f"{doc.name}: example {line!r}"


def test_the_layout_check_catches_a_squeezed_help_column() -> None:
    """The Typer layout this replaced: flag names cut and a narrow help column."""
    squeezed = (
        "│ --model-name-or-…      TEXT      Pretrained model: a   │\n"
        "│                                  local directory       │\n"
    )
    assert not whole("--model-name-or-path", squeezed)
    train = next(doc for doc in DOCS if doc.name == "lmctl train clm")
    width = help_column_width(train, squeezed, "Pretrained model", "--model-name-or-…")
    assert width < MIN_HELP_WIDTH


@pytest.mark.parametrize("columns", [80, 100, 120])
def test_terminal_width_is_honoured(columns: int) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "lmctl", "train", "clm", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": str(columns), "TERM": "dumb"},
    )
    lines = proc.stdout.splitlines()
    assert max(len(line) for line in lines) == columns
    # Wider terminals give the room to the help text, not to the flag column.
    train = next(doc for doc in DOCS if doc.name == "lmctl train clm")
    width = help_column_width(train, proc.stdout, "Pretrained model", "--model-name-or-path")
    assert width >= columns - 42
    assert "…" not in proc.stdout
    # Angle brackets are text, not markup; continued example lines keep their breaks.
    assert "runs/<objective>-<date>-<time>" in re.sub(r"\s*│\s*", " ", proc.stdout)
    assert "    lmctl train clm --model-type gpt2 \\" in proc.stdout
    assert "        --config-overrides n_layer=2,n_embd=64,n_head=2 \\" in proc.stdout


def test_panels_in_the_order_a_user_fills_them() -> None:
    text = help_text(next(doc for doc in DOCS if doc.name == "lmctl train clm"), 100)
    titles = re.findall(r"╭─ (.+?) ─", text)
    assert titles == [
        "Model",
        "Data",
        "Objective",
        "Training",
        "Processes, sharding and adapters",
        "Evaluation and checkpoints",
        "Publishing",
        "Output",
    ]


def test_commands_in_workflow_order() -> None:
    text = help_text(COMMANDS, 100)
    rows = re.findall(r"^│ (\w+) ", text.split("Commands", 1)[1], flags=re.M)
    assert rows == [
        "train",
        "prepare",
        "data",
        "eval",
        "predict",
        "resume",
        "push",
        "config",
        "runs",
        "env",
    ]


def test_help_snapshot_is_fresh() -> None:
    """tests/snapshots/help-80.txt is every page at 80 columns: a new or changed flag shows in
    review; regenerate with python scripts/gen_cli_docs.py."""
    proc = subprocess.run(
        [
            sys.executable,
            str(REPO / "scripts" / "gen_cli_docs.py"),
            "--check",
            "tests/snapshots/help-80.txt",
        ],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr
