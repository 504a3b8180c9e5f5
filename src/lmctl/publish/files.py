"""What is pushed: the final model, tokenizer, config, results and the model card of a run
directory (the card is regenerated first from the run's config and ``all_results.json``), or
every file of a model directory. ``checkpoint-*`` folders only on request (whole, so that
they can be resumed). Of a checkpoint pushed on its own, only the model files: its training
state (optimizer, scheduler, RNG states, trainer state) only with ``include_optimizer``. A
model whose files do not match the manifest of its save is refused, and a
``training_args.bin`` holding a secret is never uploaded. A run's ``lmctl.yaml`` is published
without the local paths of the machine that trained (see :func:`published_config`).
"""

from __future__ import annotations

import os
import re
import tempfile
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmctl import secrets
from lmctl.errors import ConfigError, ModelError
from lmctl.run import checkpoints, history, rundir
from lmctl.run.resume import how_to_finish
from lmctl.storage import locations
from lmctl.storage.atomic import manifest_problem
from lmctl.storage.paths import url_scheme

#: A checkpoint's training state: what resuming needs, not what loading the model needs.
TRAINING_STATE = re.compile(
    r"^(optimizer|scheduler|scaler)(_\d+)?\.(pt|bin|safetensors)$|^rng_state(_\d+)?\.pth$"
    r"|^random_states_\d+\.pkl$|^custom_checkpoint_\d+\.pkl$|^sampler(_\d+)?\.bin$"
    r"|^dl_state_dict(_\d+)?\.bin$|^trainer_state\.json$|^stream_position(-\d+)?\.json$"
    r"|^training_args\.bin$|^latest$|^zero_to_fp32\.py$|^"
    + re.escape(checkpoints.MANIFEST_FILE)
    + "$"
)
#: Folders of training state inside a checkpoint (DeepSpeed's ZeRO state, FSDP's optimizer).
TRAINING_STATE_DIRS = re.compile(r"^(global_step\d+|optimizer_\d+)$")
#: Pickles that may hold settings, checked for secrets before they are uploaded.
PICKLED_SETTINGS = ("training_args.bin",)
#: Folders of the machine that trained (its caches and its copy of a remote run), no part of
#: how the run was made: published as unset.
MACHINE_FOLDERS = ("cache_dir", "staging_dir", "prepared_cache_dir")


@dataclass(frozen=True)
class LocalFile:
    rel: str
    path: Path
    size: int


@dataclass
class Selection:
    """What a push uploads, and what it leaves behind and why."""

    files: list[LocalFile]
    training_state: list[str]
    withheld: dict[str, str]


def is_run_dir(path: Path) -> bool:
    return (path / rundir.CONFIG_FILE).is_file()


def is_checkpoint(path: Path) -> bool:
    return bool(checkpoints.CHECKPOINT_PATTERN.match(path.name)) and (
        (path / checkpoints.MANIFEST_FILE).is_file() or (path / history.STATE_FILE).is_file()
    )


def select_files(
    path: Path,
    *,
    include_checkpoints: bool,
    include_optimizer: bool,
    require_model: bool = True,
    leave_out: tuple[str, ...] = (),
    machine_part: bool = False,
) -> Selection:
    """The files to publish, with the training state left out of checkpoints (unless
    ``include_optimizer``) and pickled settings that hold a secret withheld.

    ``require_model=False`` takes a run that has no final model yet (a run directory being
    uploaded while it trains); the top-level entries named in ``leave_out`` are skipped.
    ``machine_part``: ``path`` is one machine's part of a checkpoint, which has no trainer
    state of its own (see lmctl.mirror); its files are checked against its manifest only.
    """
    if not path.is_dir():
        raise ConfigError(f"{path}: no such directory", "give a run directory or a model directory")
    if require_model and not (path / "config.json").is_file():
        if is_run_dir(path):
            finish = how_to_finish(path)
            if checkpoints.latest_checkpoint(path) is not None:
                finish += ", or push one of its checkpoint-* folders"
            raise ConfigError(f"{path}: the run has no final model (no config.json)", finish)
        raise ConfigError(
            f"{path}: not a run directory ({rundir.CONFIG_FILE}) or a model directory "
            "(config.json)",
            "give the --output-dir of a run or a folder written by save_pretrained",
        )
    _check_complete(path, machine_part=machine_part)
    selection = Selection([], [], {})
    checked: set[str] = set()
    # A checkpoint pushed on its own is a model; --include-checkpoints keeps a run's
    # checkpoints whole (they are there to be resumed).
    model_only = is_checkpoint(path) and not include_optimizer
    for file in sorted(path.rglob("*")):
        rel = file.relative_to(path)
        if any(part.startswith(".") for part in rel.parts) or not file.is_file():
            continue
        if rel.as_posix() == locations.MANIFEST or rel.parts[0] in leave_out:
            continue
        in_checkpoint = (
            bool(checkpoints.CHECKPOINT_PATTERN.match(rel.parts[0])) and len(rel.parts) > 1
        )
        if in_checkpoint and not include_checkpoints:
            continue
        if in_checkpoint and rel.parts[0] not in checked:
            checked.add(rel.parts[0])
            _check_complete(path / rel.parts[0])
        if model_only and _is_state(rel.parts):
            selection.training_state.append(rel.as_posix())
            continue
        if rel.name in PICKLED_SETTINGS and (found := secrets.pickled_secret(file)) is not None:
            selection.withheld[rel.as_posix()] = found
            continue
        selection.files.append(LocalFile(rel.as_posix(), file, file.stat().st_size))
    return selection


def _is_state(parts: tuple[str, ...]) -> bool:
    return bool(TRAINING_STATE.match(parts[-1])) or bool(
        len(parts) > 1 and TRAINING_STATE_DIRS.match(parts[0])
    )


def _check_complete(path: Path, *, machine_part: bool = False) -> None:
    """Refuse a model or checkpoint whose files do not match the manifest of its save."""
    if machine_part:
        problem = manifest_problem(path, checkpoints.MANIFEST_FILE)
    elif is_checkpoint(path):
        problem = checkpoints.checkpoint_problem(path)
    else:
        problem = checkpoints.model_problem(path)
    if problem is not None:
        raise ModelError(
            f"{path}: the model is incomplete or corrupted ({problem}); nothing was pushed",
            "train it again, or push one of its complete checkpoints",
        )


def human_size(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


@contextmanager
def for_publication(files: list[LocalFile]) -> Iterator[list[LocalFile]]:
    """``files`` as they are published: a run's ``lmctl.yaml`` replaced by its copy without
    local paths (:func:`published_config`), kept in a temporary folder while in use."""
    with tempfile.TemporaryDirectory(prefix="lmctl-publish-") as folder:
        published: list[LocalFile] = []
        for item in files:
            if item.rel != rundir.CONFIG_FILE:
                published.append(item)
                continue
            copy = Path(folder) / item.rel
            copy.write_text(published_config(item.path.read_text(encoding="utf-8")), "utf-8")
            published.append(LocalFile(item.rel, copy, copy.stat().st_size))
        yield published


def published_config(text: str) -> str:
    """A run's ``lmctl.yaml`` as others may read it: every absolute local path (the run
    keeps them absolute so that resume works from anywhere) reduced to its last name, and
    the machine's own folders (:data:`MACHINE_FOLDERS`) unset; URLs, Hub ids and relative
    paths stay as they are."""
    import yaml

    header = [line for line in text.splitlines() if line.startswith("#")]
    data = yaml.safe_load(text) or {}
    if not isinstance(data, dict):
        return text
    for name in MACHINE_FOLDERS:
        if data.get(name) is not None:
            data[name] = None
    header.append("# local paths reduced to their names: give your own files and folders")
    return "\n".join(header) + "\n" + yaml.safe_dump(_reduced(data), sort_keys=False)


def _reduced(value: Any) -> Any:
    if isinstance(value, dict):
        return {key: _reduced(item) for key, item in value.items()}
    if isinstance(value, list):
        return [_reduced(item) for item in value]
    if isinstance(value, str) and url_scheme(value) is None and os.path.isabs(value):
        return Path(value).name
    return value
