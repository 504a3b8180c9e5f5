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


def _hint_files() -> list[Path]:
    """Where install hints are written: messages and help in src, the README and the docs."""
    return [*(ROOT / "src").rglob("*.py"), ROOT / "README.md", *(ROOT / "docs").glob("*.md")]


def test_every_extra_named_in_a_hint_exists() -> None:
    """``pip install 'lmctl-train[X]'`` in a message or a doc names an extra that pyproject
    declares."""
    import tomllib

    from lmctl import DISTRIBUTION
    from lmctl.storage.locations import EXTRAS

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    declared = set(project["optional-dependencies"])
    extra = re.compile(rf"{re.escape(DISTRIBUTION)}\[([a-z0-9_-]+)\]")
    named = {name for f in _hint_files() for name in extra.findall(f.read_text())}
    named |= {extra for extra, _ in EXTRAS.values()}
    assert {"deepspeed", "peft", "plot", "s3"} <= named
    assert named <= declared, sorted(named - declared)


def test_the_distribution_is_not_named_after_another_project() -> None:
    """``lmctl`` on PyPI is an unrelated tool: pip installs this project as ``lmctl-train``,
    and no hint, doc or extra tells a user to install the other one."""
    import tomllib

    from lmctl import DISTRIBUTION, install_hint

    project = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]
    assert project["name"] == DISTRIBUTION == "lmctl-train"
    assert project["scripts"] == {"lmctl": "lmctl.cli.app:main"}  # the command keeps its name
    assert install_hint("plot") == "pip install 'lmctl-train[plot]'"
    # `pip install lmctl`, `pip install 'lmctl[s3]'`, "Needs lmctl[peft]", an extra that
    # installs `lmctl[...]` itself: each would fetch the other project.
    old = re.compile(r"pip install ['\"]?lmctl(?![\w-])|(?<![\w.-])lmctl\[[a-z]")
    found = [
        f"{path.relative_to(ROOT)}:{number}: {line.strip()}"
        for path in [*_hint_files(), ROOT / "pyproject.toml"]
        for number, line in enumerate(path.read_text().splitlines(), 1)
        if old.search(line)
    ]
    assert not found, found


def test_model_card_links_to_this_project(tmp_path: Path) -> None:
    """The card's link to lmctl is this project's page, not the other ``lmctl``'s."""
    from lmctl.console import Console, OutputOptions
    from lmctl.run.card import refresh_model_card

    (tmp_path / "lmctl.yaml").write_text("objective: clm\nmodel_type: gpt2\ntrain_file: t.txt\n")
    refresh_model_card(tmp_path, Console(OutputOptions(no_progress=True)))
    card = (tmp_path / "README.md").read_text()
    assert "[lmctl](https://pypi.org/project/lmctl-train/)" in card
    assert "pypi.org/project/lmctl/" not in card
