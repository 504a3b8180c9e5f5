"""Checkpoints and the final model in a run directory: finding and checking them, committing
them whole (staged under a hidden name, a manifest of their files), rotating old ones, and
deciding which one a run resumes from."""

from __future__ import annotations

import json
import re
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.run.history import STATE_FILE
from lmctl.run.rundir import is_lmctl_run, record_written
from lmctl.storage import atomic
from lmctl.storage.atomic import manifest_problem
from lmctl.storage.paths import local_path

if TYPE_CHECKING:
    from lmctl.config.slices import RunDirSpec
    from lmctl.console import Console

CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
MANIFEST_FILE = "lmctl_checkpoint.json"
MODEL_MANIFEST = "lmctl_model.json"
#: The final model is staged under ``.tmp-model-<owner>`` in the run directory.
MODEL_STAGING = "model"


@contextmanager
def atomic_dir(final: Path, owner: str | None = None) -> Iterator[Path]:
    """:func:`lmctl.storage.atomic.atomic_dir`, with a manifest when ``final`` is a checkpoint."""
    with atomic.atomic_dir(final, owner, _manifest_for(final)) as staging:
        yield staging
    record_written(final.parent, final.name)


#: Called with each checkpoint this process commits, before older ones are rotated away (a
#: remote run directory uploads it; see :mod:`lmctl.mirror`).
checkpoint_listeners: list[Callable[[Path], None]] = []


def commit_dir(staging: Path, final: Path) -> None:
    """:func:`lmctl.storage.atomic.commit_dir`, with a manifest when ``final`` is a checkpoint."""
    atomic.commit_dir(staging, final, _manifest_for(final))
    record_written(final.parent, final.name)
    if CHECKPOINT_PATTERN.match(final.name):
        for listener in checkpoint_listeners:
            listener(final)


def model_staging(run_dir: Path, owner: str) -> Path:
    """The folder the final model is written into before :func:`commit_model`; processes
    that save one model together must agree on ``owner``."""
    return atomic.staging_dir(run_dir / MODEL_STAGING, owner)


def begin_model(run_dir: Path, owner: str) -> Path:
    return atomic.begin_staging(run_dir / MODEL_STAGING, owner)


def commit_model(staging: Path, run_dir: Path) -> None:
    """Move a staged final model into the run directory, its manifest last (see
    :func:`lmctl.storage.atomic.commit_files`)."""
    # A library's own model card (peft writes one) is replaced by lmctl's after the save.
    (staging / "README.md").unlink(missing_ok=True)
    names = atomic.commit_files(staging, run_dir, MODEL_MANIFEST, name=MODEL_STAGING)
    record_written(run_dir, *names)


def model_problem(path: Path) -> str | None:
    """Why the model in ``path`` (a run or model directory) cannot be trusted, or None.

    Its files must match the manifest of the final save. A run directory lmctl created needs
    the manifest itself: without it the final save did not finish.
    """
    if not (path / MODEL_MANIFEST).is_file():
        if is_lmctl_run(path) and (path / "config.json").is_file():
            return f"{MODEL_MANIFEST} is missing (the final save did not finish)"
        return None
    return manifest_problem(path, MODEL_MANIFEST)


def save_tokenizer(tokenizer: Any, run_dir: Path) -> None:
    """The tokenizer alone in the run directory (a run that only evaluates)."""
    written = tokenizer.save_pretrained(str(run_dir))
    record_written(run_dir, *(Path(name).name for name in written or ()))


def _manifest_for(final: Path) -> str | None:
    return MANIFEST_FILE if CHECKPOINT_PATTERN.match(final.name) else None


def checkpoints(path: Path) -> list[Path]:
    """Checkpoint directories, oldest first."""
    if not path.is_dir():
        return []
    found = [
        (int(match.group(1)), child)
        for child in path.iterdir()
        if child.is_dir() and (match := CHECKPOINT_PATTERN.match(child.name))
    ]
    return [child for _, child in sorted(found)]


def checkpoint_step(path: Path) -> int:
    match = CHECKPOINT_PATTERN.match(path.name)
    if match is None:
        raise ValueError(f"{path} is not a checkpoint directory")
    return int(match.group(1))


def checkpoint_problem(path: Path) -> str | None:
    """Why a checkpoint cannot be used, or None when it is complete.

    Complete means: its trainer state (written last) parses and, when it has a manifest,
    every listed file is there with its recorded size.
    """
    try:
        json.loads((path / STATE_FILE).read_text())
    except FileNotFoundError:
        return f"{STATE_FILE} is missing (the save did not finish)"
    except (OSError, ValueError):
        return f"{STATE_FILE} is unreadable"
    return manifest_problem(path, MANIFEST_FILE)


def is_complete_checkpoint(path: Path) -> bool:
    return checkpoint_problem(path) is None


def latest_checkpoint(path: Path, skipped: list[tuple[Path, str]] | None = None) -> Path | None:
    """The newest complete checkpoint; newer unusable ones are appended to ``skipped``."""
    for candidate in reversed(checkpoints(path)):
        problem = checkpoint_problem(candidate)
        if problem is None:
            return candidate
        if skipped is not None:
            skipped.append((candidate, problem))
    return None


def newest_checkpoint(run_dir: Path, console: Console) -> Path | None:
    """The newest complete checkpoint, with a warning for each newer one that is unusable."""
    skipped: list[tuple[Path, str]] = []
    checkpoint = latest_checkpoint(run_dir, skipped)
    for path, problem in skipped:
        console.warn(f"skipping {path.name}: incomplete or corrupted ({problem})")
    return checkpoint


def resume_checkpoint(
    spec: RunDirSpec, run_dir: Path, console: Console | None = None
) -> Path | None:
    """The checkpoint a run resumes from: the one named by --resume-from-checkpoint, or for
    ``auto`` the newest complete one in its local run directory ``run_dir``. With
    ``console``, unusable checkpoints are warned about and the choice is said."""
    named = spec.resume_from_checkpoint
    if named is None:
        return None
    if named != "auto":
        return local_path(named)
    if console is None:
        return latest_checkpoint(run_dir)
    checkpoint = newest_checkpoint(run_dir, console)
    if checkpoint is None:
        console.info(f"no checkpoint in {run_dir} yet: starting from step 0")
    else:
        console.info(f"resuming from {checkpoint}")
    return checkpoint


#: Per-process RNG state files that both engines write into a checkpoint: the Trainer
#: ``rng_state.pth`` (one process) or ``rng_state_<rank>.pth``; Accelerate
#: ``random_states_<rank>.pkl``.
RNG_STATE_FILE = re.compile(r"^(?:rng_state(?:_(\d+))?\.pth|random_states_(\d+)\.pkl)$")


def checkpoint_world_size(path: Path) -> int | None:
    """How many processes wrote ``path``: one RNG state file each (None if it has none)."""
    ranks = set()
    for file in path.iterdir():
        match = RNG_STATE_FILE.match(file.name)
        if match:
            ranks.add(int(match.group(1) or match.group(2) or 0))
    return len(ranks) or None


def holds_training_state(path: Path) -> bool:
    """Whether a checkpoint holds what continues training exactly (the optimizer, the
    schedule, every process's random state), not the model alone (``save_only_model``):
    every process writes its random state into a full one."""
    return checkpoint_world_size(path) is not None


def read_checkpoint_state(path: Path) -> dict[str, Any]:
    state: dict[str, Any] = json.loads((path / STATE_FILE).read_text())
    return state


def rotate_checkpoints(
    path: Path, limit: int | None, protect: list[Path] | None = None
) -> list[Path]:
    """Delete the oldest checkpoints beyond ``limit``.

    Never deletes the newest complete checkpoint (the one a resume needs) nor any in
    ``protect`` (the best one with --load-best-model-at-end); the limit stretches instead.
    """
    if not limit:
        return []
    found = checkpoints(path)
    newest = latest_checkpoint(path)
    kept = {p.resolve() for p in (protect or []) if p.exists()}
    if newest is not None:
        kept.add(newest.resolve())
    removable = [c for c in found if c.resolve() not in kept]
    excess = len(found) - max(limit, len(kept))
    deleted = removable[: max(excess, 0)]
    for checkpoint in deleted:
        atomic.remove_dir(checkpoint)
    return deleted


def load_weights(model: Any, folder: Path) -> None:
    """The weights ``Accelerator.save_model`` wrote (one file, or shards and their index),
    copied into the model's own parameters, which the optimizer holds."""
    from safetensors.torch import load_file

    index = folder / "model.safetensors.index.json"
    names = ["model.safetensors"]
    if index.is_file():
        names = sorted(set(json.loads(index.read_text())["weight_map"].values()))
    for name in names:
        model.load_state_dict(load_file(str(folder / name)), strict=False)
