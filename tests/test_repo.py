"""The repository keeps its promises: README commands, CI script, generated files."""

from __future__ import annotations

import os
import re
import subprocess
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def _readme_commands() -> list[str]:
    text = (ROOT / "README.md").read_text()
    section = text.split("## Two commands", 1)[1].split("\n## ", 1)[0]
    return re.findall(r"```bash\n(.+?)\n```", section)


def test_readme_has_the_two_commands() -> None:
    run_default, run_tests = _readme_commands()
    assert run_default.endswith("lmctl train clm")
    assert "pytest" in run_tests


def test_ci_runs_the_readme_test_command() -> None:
    _, run_tests = _readme_commands()
    ci = (ROOT / ".ci" / "run").read_text()
    assert run_tests in ci.splitlines()


def test_completions_are_fresh() -> None:
    proc = subprocess.run(
        [sys.executable, str(ROOT / "scripts" / "gen_completions.py"), "--check"],
        capture_output=True,
        text=True,
        check=False,
    )
    assert proc.returncode == 0, proc.stderr


def test_completion_answers_without_heavy_imports() -> None:
    code = (
        "import sys, runpy\n"
        "sys.argv = ['lmctl']\n"
        "try:\n"
        "    runpy.run_module('lmctl', run_name='__main__')\n"
        "except SystemExit:\n"
        "    pass\n"
        "heavy = [m for m in sys.modules if m.split('.')[0] in "
        "('torch', 'transformers', 'datasets', 'accelerate', 'evaluate')]\n"
        "sys.stderr.write('HEAVY=%d' % len(heavy))\n"
    )
    env = {
        **os.environ,
        "_LMCTL_COMPLETE": "complete_bash",
        "COMP_WORDS": "lmctl train clm --learning-ra",
        "COMP_CWORD": "3",
    }
    proc = subprocess.run(
        [sys.executable, "-c", code], capture_output=True, text=True, env=env, check=False
    )
    assert "--learning-rate" in proc.stdout
    assert "HEAVY=0" in proc.stderr


def test_every_extra_named_in_a_hint_exists() -> None:
    """``pip install 'lmctl[X]'`` in a message or a doc names an extra that pyproject declares."""
    import tomllib

    from lmctl.storage.locations import EXTRAS

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = set(project["optional-dependencies"])
    files = [*(ROOT / "src").rglob("*.py"), ROOT / "README.md", *(ROOT / "docs").glob("*.md")]
    named = {name for f in files for name in re.findall(r"lmctl\[([a-z0-9_-]+)\]", f.read_text())}
    named |= {extra for extra, _ in EXTRAS.values()}
    assert {"deepspeed", "peft", "plot", "s3"} <= named
    assert named <= declared, sorted(named - declared)
