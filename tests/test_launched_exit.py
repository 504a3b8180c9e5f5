"""A process a launcher started ends without interpreter shutdown once its command has
reported, and still does everything Python's own exit does for the program."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from tests.conftest import lmctl

pytestmark = pytest.mark.e2e

# Imported at start-up through PYTHONPATH: writes a file when the interpreter's shutdown
# destroys this module's globals (builtins are gone by then, hence the bound defaults).
_FINALIZE_MARK = """\
import os
import sys


class _Mark:
    def __del__(self, _open=os.open, _write=os.write, _path=os.environ["FINALIZE_MARK"],
                _flags=os.O_WRONLY | os.O_CREAT):
        _write(_open(_path, _flags), b"finalized")


sys.modules[__name__].mark = _Mark()
"""


@pytest.mark.parametrize("launched", [False, True], ids=["alone", "launched"])
def test_a_launched_process_skips_interpreter_shutdown(tmp_path: Path, launched: bool) -> None:
    site = tmp_path / "site"
    site.mkdir()
    (site / "sitecustomize.py").write_text(_FINALIZE_MARK)
    mark = tmp_path / "finalized"
    env = {"PYTHONPATH": str(site), "FINALIZE_MARK": str(mark)}
    if launched:
        env |= {"RANK": "0", "WORLD_SIZE": "1"}
    result = lmctl("train", "clm", "--json", "--block-size", "-3", env=env)
    assert result.returncode == 2, result.stderr
    assert json.loads(result.stdout)["exit_code"] == 2  # the result still reaches stdout
    assert "--block-size" in result.stderr
    # Alone, the interpreter shuts down as usual (the check can tell); launched, it does not.
    assert mark.exists() is not launched


def test_ending_a_launched_process_keeps_what_python_exit_does(tmp_path: Path) -> None:
    script = textwrap.dedent(
        f"""
        import atexit, sys, threading, time
        from pathlib import Path
        from lmctl.run.launch import end_launched_process

        folder = Path({str(tmp_path)!r})
        atexit.register(lambda: (folder / "handler").write_text("ran"))

        def late():
            time.sleep(0.5)
            (folder / "thread").write_text("done")

        threading.Thread(target=late).start()
        sys.stdout.write("buffered result")  # a pipe: block-buffered, not yet written
        sys.stderr.write("last words")
        end_launched_process(3)
        """
    )
    result = subprocess.run(
        [sys.executable, "-c", script],
        capture_output=True,
        text=True,
        timeout=120,
        check=False,
        env={**os.environ, "RANK": "0", "WORLD_SIZE": "1"},
    )
    assert result.returncode == 3
    assert result.stdout == "buffered result"
    assert result.stderr.endswith("last words")
    assert (tmp_path / "handler").read_text() == "ran"
    assert (tmp_path / "thread").read_text() == "done"
