"""Restarts by torchrun's elastic agent (--max-restarts), without starting one: what the
processes note, which one is taken for a restart, the cause a restart names, where a
restarted process continues from, and how `lmctl runs` shows each restart. The restarts
themselves run in tests/distributed/test_machines.py."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from lmctl.config.loader import build_config
from lmctl.config.slices import RunDirSpec, take
from lmctl.objectives.clm import ClmConfig
from lmctl.run import history, restarts, rundir
from tests.conftest import lmctl


@pytest.fixture
def agent(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> dict[str, str]:
    """This process as a rank that torchrun's elastic agent started (restarts allowed)."""
    values = {
        "RANK": "0",
        "WORLD_SIZE": "2",
        "TORCHELASTIC_MAX_RESTARTS": "1",
        "TORCHELASTIC_RESTART_COUNT": "0",
        "TORCHELASTIC_RUN_ID": "test",
        "LMCTL_CACHE": str(tmp_path / "cache"),
    }
    for name, value in values.items():
        monkeypatch.setenv(name, value)
    return values


def _gone() -> int:
    """The id of a process that has ended."""
    proc = subprocess.Popen([sys.executable, "-c", "pass"])
    proc.wait()
    return proc.pid


def _note(folder: Path, **note: Any) -> None:
    folder.mkdir(parents=True, exist_ok=True)
    (folder / f"{note['pid']}.json").write_text(json.dumps(note))


def _notes_folder() -> Path:
    """Where the processes of this run note their start and end on this machine."""
    return restarts._folder()


def test_nothing_is_noted_without_an_agent_that_restarts(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("LMCTL_CACHE", str(tmp_path / "cache"))
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.delenv("TORCHELASTIC_MAX_RESTARTS", raising=False)
    restarts.note_start()
    restarts.note_end(0, None)
    assert not (tmp_path / "cache").exists()
    assert not restarts.restarted()


def test_a_killed_process_is_named_as_the_cause(agent: dict[str, str]) -> None:
    folder = _notes_folder()
    parent = os.getppid()
    dead = _gone()
    _note(folder, rank=1, pid=dead, agent=parent, started=1.0)  # no end: killed
    _note(folder, rank=0, pid=_gone(), agent=parent, started=1.0, ended=3.0, exit_code=1,
          message="unexpected error: RuntimeError: Connection reset by peer")  # fmt: skip
    restarts.note_start()
    assert restarts.restarted()  # its agent started a process of this run that has ended
    assert restarts.previous_cause() == (
        f"rank 1 (pid {dead}) was killed: ended without an exit of its own (SIGKILL, or the "
        "out-of-memory killer)"
    )


def test_the_first_failure_is_the_cause_when_none_was_killed(agent: dict[str, str]) -> None:
    folder = _notes_folder()
    parent = os.getppid()
    _note(folder, rank=1, pid=_gone(), agent=parent, ended=5.0, exit_code=1, message="later")
    _note(folder, rank=0, pid=_gone(), agent=parent, ended=4.0, exit_code=130,
          message="interrupted by SIGTERM; checkpoint saved at step 3")  # fmt: skip
    assert restarts.previous_cause() == (
        "rank 0 exited with code 130: interrupted by SIGTERM; checkpoint saved at step 3"
    )


def test_a_new_run_of_the_same_command_is_no_restart(agent: dict[str, str]) -> None:
    """Notes of an earlier run (its agent gone) are dropped; processes of this attempt that
    are still running (the other ranks) do not make it a restart."""
    folder = _notes_folder()
    earlier = _gone()
    _note(folder, rank=0, pid=_gone(), agent=earlier, started=1.0)
    _note(folder, rank=1, pid=os.getppid(), agent=os.getppid(), started=2.0)  # running
    restarts.note_start()
    assert not restarts.restarted()
    assert sorted(p.stem for p in folder.iterdir()) == sorted([str(os.getppid()), str(os.getpid())])
    restarts.note_end(2, "error: bad flag")
    own = json.loads((folder / f"{os.getpid()}.json").read_text())
    assert own["exit_code"] == 2 and own["message"] == "error: bad flag"
    restarts.note_end(0, None)  # a process that succeeded leaves no note
    assert not (folder / f"{os.getpid()}.json").exists()


def test_a_restart_counted_by_the_agent(
    agent: dict[str, str], monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    restarts.note_start()
    assert restarts.restarted()
    assert restarts.previous_cause() == (
        "a process on another machine ended (that machine's log names it)"
    )


def test_a_restarted_process_continues_from_the_newest_checkpoint(
    agent: dict[str, str], monkeypatch: pytest.MonkeyPatch, tmp_path: Path
) -> None:
    train = tmp_path / "t.txt"
    train.write_text("hello\n")
    out = tmp_path / "run"
    base = {"model_type": "gpt2", "tokenizer_name": "x", "train_file": str(train)}
    config = build_config(ClmConfig, cli_values={**base, "output_dir": str(out)})
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "1")
    restarts.note_start()
    assert (
        restarts.continue_after_restart(take(RunDirSpec, config)).resume_from_checkpoint == "auto"
    )
    given = tmp_path / "other" / "checkpoint-3"
    given.mkdir(parents=True)
    resumed = config.model_copy(update={"resume_from_checkpoint": str(given)})
    # the checkpoint given to the first attempt, until the run has one of its own
    assert restarts.continue_after_restart(take(RunDirSpec, resumed)).resume_from_checkpoint == str(
        given
    )
    (out / "checkpoint-5").mkdir(parents=True)
    (out / "checkpoint-5" / history.STATE_FILE).write_text("{}")
    assert (
        restarts.continue_after_restart(take(RunDirSpec, resumed)).resume_from_checkpoint == "auto"
    )
    monkeypatch.setenv("TORCHELASTIC_RESTART_COUNT", "0")
    _notes_folder().rename(tmp_path / "notes")  # a first start, with no notes before it
    restarts.note_start()
    assert restarts.continue_after_restart(spec := take(RunDirSpec, config)) is spec


def test_runs_shows_each_restart(tmp_path: Path) -> None:
    """Each restart with its step and cause, under the table and in the JSON; the loss
    curve after a restart replaces the steps logged before it."""
    run = tmp_path / "run"
    run.mkdir()
    (run / rundir.CONFIG_FILE).write_text("objective: clm\nmodel_type: gpt2\n")
    lines = [
        {"step": 4, "loss": 3.0},
        {"step": 6, "loss": 2.9},
        {"event": "restart", "restart": 1, "step": 5, "checkpoint": "checkpoint-5",
         "cause": "rank 1 (pid 42) was killed"},
        {"step": 6, "loss": 2.5},
    ]  # fmt: skip
    (run / history.METRICS_LOG).write_text("".join(json.dumps(line) + "\n" for line in lines))
    from lmctl.run.summary import read_curves

    assert read_curves(run).train_loss == [(4, 3.0), (6, 2.5)]
    listed = lmctl("runs", tmp_path, "--json")
    assert listed.returncode == 0, listed.stderr
    (summary,) = json.loads(listed.stdout)["runs"]
    assert summary["restarts"] == [{"restart": 1, "step": 5, "cause": "rank 1 (pid 42) was killed"}]
    table = lmctl("runs", tmp_path).stdout
    assert "restarts:\n  run: restart 1 from step 5 after rank 1 (pid 42) was killed" in table
