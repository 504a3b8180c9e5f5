"""Every test file that the CI script cites exists."""

from __future__ import annotations

import re
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent


def test_ci_script_cites_existing_tests() -> None:
    text = (ROOT / ".ci" / "run").read_text()
    cited = re.findall(r"tests/[\w/]+\.py", text)
    assert cited, "the CI script names the test that keeps it in sync with the README"
    missing = [path for path in cited if not (ROOT / path).is_file()]
    assert missing == []
