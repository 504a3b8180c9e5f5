"""Regenerate docs/cli.md (the CLI reference) and tests/snapshots/help-80.txt (every
command's --help at 80 columns) from the app; ``--check`` fails when either is stale."""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
REFERENCE = ROOT / "docs" / "cli.md"
HELP_SNAPSHOT = ROOT / "tests" / "snapshots" / "help-80.txt"


def render_all() -> dict[Path, str]:
    from lmctl.cli.app import ROOT as COMMANDS
    from lmctl.cli.help import help_text
    from lmctl.cli.reference import markdown_reference

    pages = [f"$ {doc.name} --help\n{help_text(doc, 80)}" for doc in COMMANDS.walk()]
    return {REFERENCE: markdown_reference(COMMANDS), HELP_SNAPSHOT: "\n".join(pages)}


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__)
    parser.add_argument("--check", action="store_true", help="fail if a file is stale")
    parser.add_argument("only", nargs="*", help="check or write only these files")
    args = parser.parse_args()
    stale = []
    wanted = {(ROOT / name).resolve() for name in args.only}
    for path, text in render_all().items():
        if wanted and path.resolve() not in wanted:
            continue
        if args.check:
            if not path.is_file() or path.read_text(encoding="utf-8") != text:
                stale.append(str(path.relative_to(ROOT)))
        else:
            path.parent.mkdir(parents=True, exist_ok=True)
            path.write_text(text, encoding="utf-8")
    if stale:
        print(
            "stale generated files: " + ", ".join(stale),
            "- run: python scripts/gen_cli_docs.py",
            file=sys.stderr,
        )
        return 1
    return 0


if __name__ == "__main__":
    sys.exit(main())
