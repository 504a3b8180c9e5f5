"""docs/cli.md is the CLI reference generated from the app, and stays true to it."""

from __future__ import annotations

import subprocess
import sys
from pathlib import Path

from lmctl.cli.app import ROOT as COMMANDS

REPO = Path(__file__).resolve().parent.parent


def test_cli_reference_is_fresh() -> None:
    proc = subprocess.run(
        [sys.executable, str(REPO / "scripts" / "gen_cli_docs.py"), "--check", "docs/cli.md"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_cli_reference_covers_every_command_and_flag() -> None:
    text = (REPO / "docs" / "cli.md").read_text(encoding="utf-8")
    for doc in COMMANDS.walk():
        assert f"## {doc.name}\n" in text
        for option in doc.options:
            for name in option.names:
                assert f"`{name}" in text, (doc.name, name)
