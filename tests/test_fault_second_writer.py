"""A second writer into a live run directory: ``lmctl train --overwrite-output-dir`` and
``lmctl resume`` started while a run trains there are refused with exit code 2 naming the
run that holds it, and that run finishes with its own checkpoints only."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import threading
from pathlib import Path

import pytest

from lmctl.run import rundir
from lmctl.storage import atomic
from tests.conftest import assert_clean_failure, lmctl, tiny_clm_args

pytestmark = [pytest.mark.e2e, pytest.mark.faults]


def test_a_second_writer_is_refused_and_the_first_run_keeps_its_checkpoints(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    out = tmp_path / "runs" / "x"
    first_args = tiny_clm_args(
        bpe_tokenizer, text_files, "--save-steps", "2", "-o", out, block_size=32, steps=6
    )
    # The first run stops inside its save of checkpoint-4 (its files written, not yet
    # renamed into place), where it is held with SIGSTOP while the others try.
    first = subprocess.Popen(
        [sys.executable, "-m", "lmctl", *map(str, first_args)],
        cwd=tmp_path,
        env={**os.environ, "CI": "1", atomic.TEST_PAUSE_ENV: "checkpoint-4:3"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    paused = threading.Event()

    def read() -> None:
        assert first.stderr is not None
        for line in first.stderr:
            lines.append(line)
            if "pausing 3s before committing checkpoint-4" in line:
                first.send_signal(signal.SIGSTOP)
                paused.set()
        paused.set()  # the run ended without pausing: the assertion below says so

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert paused.wait(timeout=300) and first.poll() is None, "".join(lines)
        staged = [p.name for p in out.iterdir() if p.name.startswith(".tmp-checkpoint-4-")]
        assert staged and (out / "checkpoint-2").is_dir()

        second_args = tiny_clm_args(
            bpe_tokenizer, text_files, "--save-steps", "3", "-o", out, block_size=32, steps=6
        )
        second = lmctl(*second_args, "--overwrite-output-dir", cwd=tmp_path, timeout=300)
        holder = f"pid {first.pid} on "
        assert_clean_failure(second, 2, "in use by another run", holder, "lmctl train clm")
        assert f"kill {first.pid}" in second.stderr

        resumed = lmctl("resume", out, cwd=tmp_path, timeout=300)
        assert_clean_failure(resumed, 2, "in use by another run", holder)
        planned = lmctl("resume", out, "--dry-run", cwd=tmp_path, timeout=300)
        assert planned.returncode == 0, planned.stderr
        # The half-written save of the live run is not taken for a killed save's leftover.
        assert [p.name for p in out.iterdir() if p.name.startswith(".tmp-checkpoint-4-")] == staged
    finally:
        first.send_signal(signal.SIGCONT)
    first.wait(timeout=300)
    reader.join(timeout=30)
    assert first.returncode == 0, "".join(lines)
    names = sorted(p.name for p in out.iterdir() if p.name.startswith("checkpoint-"))
    assert names == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert not (out / rundir.HOLDER_FILE).exists()  # let go when the run ended
    assert "in use" not in "".join(lines)
