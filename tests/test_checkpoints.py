"""Checkpoint files on disk: atomic writes, completeness, rotation, leftovers of killed saves."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmctl.run import checkpoints, history
from lmctl.storage import atomic


def _checkpoint(run: Path, step: int, payload: bytes = b"weights") -> Path:
    with checkpoints.atomic_dir(run / f"checkpoint-{step}") as staging:
        (staging / "model.safetensors").write_bytes(payload)
        (staging / "sub").mkdir()
        (staging / "sub" / "shard.bin").write_bytes(b"shard")
        (staging / history.STATE_FILE).write_text(json.dumps({"global_step": step}))
    return run / f"checkpoint-{step}"


def test_atomic_dir_commits_with_manifest(tmp_path: Path) -> None:
    checkpoint = _checkpoint(tmp_path, 5)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-5"]
    manifest = json.loads((checkpoint / checkpoints.MANIFEST_FILE).read_text())
    assert manifest["files"] == {
        "model.safetensors": 7,
        "sub/shard.bin": 5,
        history.STATE_FILE: len(json.dumps({"global_step": 5})),
    }
    assert checkpoints.checkpoint_problem(checkpoint) is None


def test_atomic_dir_leaves_nothing_visible_on_failure(tmp_path: Path) -> None:
    with pytest.raises(RuntimeError), checkpoints.atomic_dir(tmp_path / "checkpoint-5") as staging:
        (staging / "model.safetensors").write_bytes(b"half")
        raise RuntimeError("disk full")
    assert list(tmp_path.iterdir()) == []


def test_atomic_dir_replaces_an_older_copy(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 5, b"old")
    checkpoint = _checkpoint(tmp_path, 5, b"new-weights")
    assert (checkpoint / "model.safetensors").read_bytes() == b"new-weights"
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-5"]


@pytest.mark.parametrize(
    "damage,expected",
    [
        (lambda c: (c / history.STATE_FILE).unlink(), "trainer_state.json is missing"),
        (lambda c: (c / history.STATE_FILE).write_text("{"), "trainer_state.json is unreadable"),
        (lambda c: (c / "model.safetensors").write_bytes(b"w"), "model.safetensors has 1 bytes"),
        (lambda c: (c / "sub" / "shard.bin").unlink(), "sub/shard.bin is missing"),
        (lambda c: (c / checkpoints.MANIFEST_FILE).write_text("[]"), "unreadable"),
    ],
)
def test_damaged_checkpoints_are_detected(tmp_path: Path, damage: object, expected: str) -> None:
    checkpoint = _checkpoint(tmp_path, 5)
    damage(checkpoint)  # type: ignore[operator]
    problem = checkpoints.checkpoint_problem(checkpoint)
    assert problem is not None and expected in problem


def test_checkpoint_without_manifest_needs_only_its_state(tmp_path: Path) -> None:
    """Checkpoints written by other tools (no manifest) count once their state parses."""
    checkpoint = tmp_path / "checkpoint-3"
    checkpoint.mkdir()
    assert checkpoints.checkpoint_problem(checkpoint) is not None
    (checkpoint / history.STATE_FILE).write_text("{}")
    assert checkpoints.checkpoint_problem(checkpoint) is None


def test_latest_checkpoint_skips_unusable_ones(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 5)
    _checkpoint(tmp_path, 10)
    broken = _checkpoint(tmp_path, 15)
    (broken / "model.safetensors").write_bytes(b"")
    half = tmp_path / "checkpoint-20"
    half.mkdir()
    (tmp_path / ".tmp-checkpoint-25-123").mkdir()
    skipped: list[tuple[Path, str]] = []
    assert checkpoints.latest_checkpoint(tmp_path, skipped) == tmp_path / "checkpoint-10"
    assert [path.name for path, _ in skipped] == ["checkpoint-20", "checkpoint-15"]


def test_discard_staging_removes_only_leftovers(tmp_path: Path) -> None:
    _checkpoint(tmp_path, 5)
    (tmp_path / ".tmp-checkpoint-10-trainer").mkdir()
    (tmp_path / ".tmp-checkpoint-10-trainer" / "model.safetensors").write_bytes(b"x")
    removed = atomic.discard_staging(tmp_path)
    assert [p.name for p in removed] == [".tmp-checkpoint-10-trainer"]
    assert sorted(p.name for p in tmp_path.iterdir()) == ["checkpoint-5"]


def test_rotation_keeps_the_newest(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20):
        _checkpoint(tmp_path, step)
    deleted = checkpoints.rotate_checkpoints(tmp_path, 2)
    assert [p.name for p in deleted] == ["checkpoint-5", "checkpoint-10"]
    assert [p.name for p in checkpoints.checkpoints(tmp_path)] == ["checkpoint-15", "checkpoint-20"]
    assert not any(p.name.startswith(".tmp-") for p in tmp_path.iterdir())


def test_rotation_keeps_the_best_and_the_newest_even_at_limit_one(tmp_path: Path) -> None:
    for step in (5, 10, 15, 20):
        _checkpoint(tmp_path, step)
    checkpoints.rotate_checkpoints(tmp_path, 1, protect=[tmp_path / "checkpoint-10"])
    assert [p.name for p in checkpoints.checkpoints(tmp_path)] == ["checkpoint-10", "checkpoint-20"]


def test_rotation_keeps_the_newest_complete_one(tmp_path: Path) -> None:
    """A newer but broken checkpoint does not make the last usable one deletable."""
    for step in (5, 10):
        _checkpoint(tmp_path, step)
    (tmp_path / "checkpoint-15").mkdir()
    checkpoints.rotate_checkpoints(tmp_path, 1)
    assert (tmp_path / "checkpoint-10").is_dir()
    assert checkpoints.latest_checkpoint(tmp_path) == tmp_path / "checkpoint-10"


def test_rotation_without_limit_keeps_everything(tmp_path: Path) -> None:
    for step in (5, 10):
        _checkpoint(tmp_path, step)
    assert checkpoints.rotate_checkpoints(tmp_path, None) == []
    assert len(checkpoints.checkpoints(tmp_path)) == 2


def test_kill_during_save_leaves_previous_checkpoint(tmp_path: Path) -> None:
    """The test hook pauses inside the save; SIGKILL there leaves only a hidden leftover."""
    _checkpoint(tmp_path, 5)
    code = (
        "import sys, json\n"
        "from pathlib import Path\n"
        "from lmctl.run import checkpoints\n"
        "run = Path(sys.argv[1])\n"
        "with checkpoints.atomic_dir(run / 'checkpoint-10') as d:\n"
        "    (d / 'model.safetensors').write_bytes(b'new')\n"
        "    (d / 'trainer_state.json').write_text('{}')\n"
    )
    env = {**os.environ, atomic.TEST_PAUSE_ENV: "checkpoint-10:60"}
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(tmp_path)],
        env=env,
        stderr=subprocess.PIPE,
        text=True,
    )
    assert proc.stderr is not None
    line = proc.stderr.readline()
    assert "pausing 60s before committing checkpoint-10" in line
    proc.kill()
    proc.wait(timeout=30)
    names = sorted(p.name for p in tmp_path.iterdir())
    assert names[0].startswith(".tmp-checkpoint-10-") and names[1:] == ["checkpoint-5"]
    assert checkpoints.latest_checkpoint(tmp_path) == tmp_path / "checkpoint-5"


def test_no_space_left_is_recognised_through_the_exception_chain(tmp_path: Path) -> None:
    import errno

    try:
        try:
            raise OSError(errno.ENOSPC, "No space left on device")
        except OSError as inner:
            raise RuntimeError("file write failed") from inner
    except RuntimeError as exc:
        assert atomic.no_space_left(exc, tmp_path)
    assert not atomic.no_space_left(RuntimeError("file write failed"), tmp_path)
