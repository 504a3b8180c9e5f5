"""Regenerate completions/lmctl.{bash,zsh,fish} from the app; ``--check`` fails when stale.

bash gets a static table of the commands, options and choices (it answers without starting
Python); zsh and fish get Typer's scripts, which ask lmctl itself.
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
SHELLS = {"bash": "lmctl.bash", "zsh": "lmctl.zsh", "fish": "lmctl.fish"}


def render(shell: str) -> str:
    """The completion script for ``shell``."""
    if shell == "bash":
        from lmctl.cli.app import ROOT as COMMANDS
        from lmctl.cli.reference import bash_completion

        return bash_completion(COMMANDS)
    env = {**os.environ, "_TYPER_COMPLETE_TEST_DISABLE_SHELL_DETECTION": "1"}
    proc = subprocess.run(
        [sys.executable, "-m", "lmctl", "--show-completion", shell],
        capture_output=True,
        text=True,
        env=env,
        check=True,
    )
    return proc.stdout.rstrip("\n") + "\n"


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a file is stale")
    args = parser.parse_args()
    stale = []
    for shell, name in SHELLS.items():
        path = ROOT / "completions" / name
        text = render(shell)
        if args.check:
            if not path.is_file() or path.read_text() != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.parent.mkdir(exist_ok=True)
            path.write_text(text)
    if stale:
        print(
            "stale completion scripts: " + ", ".join(stale),
            "- run: python scripts/gen_completions.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
