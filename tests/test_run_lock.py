"""One writer per run directory (lmctl.run.lock): taken, refused naming its holder, taken over
from a holder that was killed, and left out of everything that reads a run directory."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
import textwrap
from collections.abc import Iterator
from pathlib import Path

import pytest

from lmctl.config.slices import LaunchSpec, RunDirSpec
from lmctl.console import Console, OutputOptions
from lmctl.errors import ConfigError, ExitCode
from lmctl.publish.files import select_files
from lmctl.run import lock, rundir

CONSOLE = Console(OutputOptions())

#: Holds the lock of the run directory argv[1] until killed, after saying so.
HOLD = textwrap.dedent(
    """
    import sys, time
    from pathlib import Path
    from lmctl.console import Console, OutputOptions
    from lmctl.run.lock import RunDirLock

    held = RunDirLock(Path(sys.argv[1]), "lmctl train clm")
    held.acquire(Console(OutputOptions(quiet=True)), sys.argv[1])
    print("held", flush=True)
    time.sleep(600)
    """
)


@pytest.fixture
def holder(tmp_path: Path) -> Iterator[tuple[subprocess.Popen[str], Path]]:
    """Another process that holds ``tmp_path/run``."""
    run = tmp_path / "run"
    proc = subprocess.Popen(
        [sys.executable, "-c", HOLD, str(run)], stdout=subprocess.PIPE, text=True
    )
    assert proc.stdout is not None and proc.stdout.readline().strip() == "held"
    try:
        yield proc, run
    finally:
        proc.kill()
        proc.wait()


def _spec(output_dir: Path | str, **changes: object) -> RunDirSpec:
    values: dict[str, object] = {
        "output_dir": str(output_dir),
        "staging_dir": None,
        "overwrite_output_dir": False,
        "resume_from_checkpoint": None,
        "strict_resume": False,
    }
    return RunDirSpec(**{**values, **changes})  # type: ignore[arg-type]


def _launch(nproc: int | None = None, nnodes: int = 1) -> LaunchSpec:
    return LaunchSpec(nproc, nnodes, None, 0, None, None, "torchrun", 0)


def test_the_holder_is_recorded_and_a_new_directory_goes_when_nothing_was_written(
    tmp_path: Path,
) -> None:
    run = tmp_path / "runs" / "x"
    held = lock.RunDirLock(run, "lmctl train clm")
    held.acquire(CONSOLE, str(run))
    record = lock.read_holder(run)
    assert record is not None
    assert (record.pid, record.host, record.command) == (
        os.getpid(),
        socket.gethostname(),
        "lmctl train clm",
    )
    held.release()
    # A run that failed before it wrote anything leaves no directory (nor runs/ above it).
    assert not (tmp_path / "runs").exists()


def test_release_keeps_the_run_and_drops_the_record(tmp_path: Path) -> None:
    run = tmp_path / "run"
    held = lock.RunDirLock(run, "lmctl train clm")
    held.acquire(CONSOLE, str(run))
    (run / "metrics.jsonl").write_text("{}\n")
    held.release()
    # Not a run directory (no marker): left as it was found.
    assert [p.name for p in run.iterdir()] == ["metrics.jsonl"]
    assert (run / "metrics.jsonl").read_text() == "{}\n"
    rundir.prepare_output_dir(_spec(run))  # now a run directory
    held.acquire(CONSOLE, str(run))
    held.release()
    # A run directory keeps the empty lock file every later writer shares, not the record.
    assert (run / rundir.LOCK_FILE).exists() and not (run / rundir.HOLDER_FILE).exists()
    again = lock.RunDirLock(run, "lmctl resume")
    again.acquire(CONSOLE, str(run))  # free again
    again.release()


def test_a_second_writer_is_refused_naming_the_holder(
    holder: tuple[subprocess.Popen[str], Path],
) -> None:
    proc, run = holder
    (run / "checkpoint-2").mkdir()
    with pytest.raises(ConfigError) as caught:
        lock.RunDirLock(run, "lmctl train clm").acquire(CONSOLE, "runs/x")
    error = caught.value
    assert error.exit_code == ExitCode.USAGE
    assert "runs/x is in use by another run" in error.message
    assert f"pid {proc.pid} on {socket.gethostname()} since " in error.message
    assert "lmctl train clm" in error.message
    assert error.hint is not None and f"kill {proc.pid}" in error.hint
    assert "lmctl resume runs/x" in error.hint and "another --output-dir" in error.hint
    assert error.details["holder"]["pid"] == proc.pid
    # Nothing of the holder's was touched, its record included.
    assert (run / "checkpoint-2").is_dir()
    record = lock.read_holder(run)
    assert record is not None and record.pid == proc.pid


def test_a_killed_holder_is_taken_over_with_a_line(
    holder: tuple[subprocess.Popen[str], Path], capsys: pytest.CaptureFixture[str]
) -> None:
    proc, run = holder
    assert lock.in_use(run)
    proc.send_signal(signal.SIGKILL)  # the kernel releases the lock; the record stays
    proc.wait()
    assert not lock.in_use(run)
    assert lock.read_holder(run) is not None
    held = lock.RunDirLock(run, "lmctl resume")
    held.acquire(CONSOLE, "runs/x")
    try:
        err = capsys.readouterr().err
        assert f"runs/x: taking over the run directory from pid {proc.pid} on " in err
        assert "which is gone" in err
        record = lock.read_holder(run)
        assert record is not None and record.pid == os.getpid()
    finally:
        held.release()


def test_the_lock_is_no_content_of_the_run(tmp_path: Path) -> None:
    """A directory holding only a lock (left by a run killed before it wrote anything) is
    empty to the output-dir check; --overwrite-output-dir neither removes nor reports the
    lock; uploads and pushes leave it out."""
    run = tmp_path / "run"
    held = lock.RunDirLock(run, "lmctl train clm")
    held.acquire(CONSOLE, str(run))
    try:
        rundir.check_output_dir(_spec(run))  # empty but for the lock: no refusal
        rundir.prepare_output_dir(_spec(run))
        (run / "train_results.json").write_text("{}")
        rundir.record_written(run, "train_results.json")
        (run / "notes.txt").write_text("mine")
        kept = rundir.prepare_output_dir(_spec(run, overwrite_output_dir=True))
        assert kept == ["notes.txt"]
        assert (run / rundir.LOCK_FILE).exists() and (run / rundir.HOLDER_FILE).exists()
        assert rundir.LOCK_FILE not in json.loads((run / rundir.RUN_MARKER).read_text())["files"]
        (run / "train_results.json").write_text("{}")
        selected = select_files(
            run, include_checkpoints=True, include_optimizer=True, require_model=False
        )
        names = {item.rel for item in selected.files}
        assert rundir.LOCK_FILE not in names and rundir.HOLDER_FILE not in names
    finally:
        held.release()


def test_which_process_holds_it(monkeypatch: pytest.MonkeyPatch, tmp_path: Path) -> None:
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", lock.HELD_ENV):
        monkeypatch.delenv(name, raising=False)
    spec = _spec(tmp_path / "run")
    assert lock.holds_run_dir(spec, _launch())  # one process
    assert lock.holds_run_dir(spec, _launch(nproc=2))  # starts the launcher on one machine
    assert not lock.holds_run_dir(spec, _launch(nproc=2, nnodes=2))  # its writers do
    assert not lock.holds_run_dir(RunDirSpec(None, None, False, None, False), _launch())
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv("RANK", "1")
    assert not lock.holds_run_dir(spec, _launch())  # writes nothing
    monkeypatch.setenv("RANK", "0")
    assert lock.holds_run_dir(spec, _launch())  # the writer, under a launcher of its own


def test_the_processes_lmctl_launched_use_its_lock(
    monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    """``--nproc``: the launching process holds the directory; its launched main process finds
    it named in the environment and in the record, and takes nothing."""
    for name in ("RANK", "WORLD_SIZE", lock.HELD_ENV):
        monkeypatch.delenv(name, raising=False)
    spec = _spec(tmp_path / "run")
    with lock.holding(spec, _launch(nproc=2), CONSOLE, "lmctl train clm"):
        assert os.environ[lock.HELD_ENV] == str(os.getpid())
        monkeypatch.setenv("WORLD_SIZE", "2")
        monkeypatch.setenv("RANK", "0")
        assert not lock.holds_run_dir(spec, _launch(nproc=2))
        monkeypatch.setenv(lock.HELD_ENV, "1")  # not the holder the record names
        assert lock.holds_run_dir(spec, _launch(nproc=2))
    assert lock.HELD_ENV not in os.environ
    assert not (tmp_path / "run").exists()
