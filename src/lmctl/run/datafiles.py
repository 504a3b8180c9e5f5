"""The training files a run started on, and whether a resumed run still reads the same ones.

A resumed run skips the batches it had already seen by position: when a training file changed
in between, the positions mean other examples, so the continued run does not see the examples
the uninterrupted run would have. The identity (path, size, modification time) of each local
training file is recorded in the run directory when the run starts; a resume compares it with
the files as they are now and warns, or with --strict-resume refuses. Files on the Hub or in a
store are not recorded (their versions are the prepared-data cache's business).
"""

from __future__ import annotations

import json
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.data.prepared import file_identity
from lmctl.errors import ConfigError
from lmctl.run import history
from lmctl.storage.paths import is_remote

if TYPE_CHECKING:
    from lmctl.config.slices import DataSpec
    from lmctl.console import Console

#: In the run directory: the training files as they were when the run started.
DATA_FILES = "data_files.json"


def local_train_files(data: DataSpec) -> dict[str, dict[str, Any]]:
    """Each local training file (a pattern's matches too) by its path: size and mtime."""
    if data.train_file is None or is_remote(data.train_file):
        return {}
    identity = file_identity(data.train_file)
    return {item["path"]: item for item in identity.get("files", [identity])}


def record_train_files(run_dir: Path, data: DataSpec) -> None:
    """At the run's start (or the first resume of a run that has no record yet): what the
    training files are, kept for every later resume to compare with."""
    if (run_dir / DATA_FILES).is_file():
        return
    files = local_train_files(data)
    if files:
        history.write_json(run_dir / DATA_FILES, {"train_file": list(files.values())})


def check_train_files(
    checkpoint: Path, data: DataSpec, *, strict: bool, console: Console | None
) -> None:
    """Before a resume from ``checkpoint``: warn (``console``: the main process's) about each
    training file that changed since its run started, or with ``strict`` refuse (exit 2)."""
    record = checkpoint.parent / DATA_FILES
    if not record.is_file():
        return
    try:
        started = json.loads(record.read_text(encoding="utf-8"))["train_file"]
    except (OSError, ValueError, KeyError):
        return  # an unreadable record says nothing about the data
    now = local_train_files(data)
    changes = [
        f"{path} ({change})"
        for path, change in changed_files({item["path"]: item for item in started}, now).items()
    ]
    if not changes:
        return
    what = f"training file{'s' if len(changes) > 1 else ''} changed since the run started: "
    consequence = (
        "the continued run skips the batches already seen by position, so it does not see "
        "the examples the uninterrupted run would have"
    )
    if strict:
        raise ConfigError(
            f"--strict-resume: {what}{'; '.join(changes)}; {consequence}",
            "restore the files as they were, resume without --strict-resume to go on with the "
            "new data, or start a new run",
        )
    if console is not None:
        console.warn(f"{what}{'; '.join(changes)}; {consequence} (--strict-resume refuses)")


def changed_files(
    started: dict[str, dict[str, Any]], now: dict[str, dict[str, Any]]
) -> dict[str, str]:
    """Each path whose file is not what it was, with what changed."""
    changes: dict[str, str] = {}
    for path, before in started.items():
        after = now.get(path)
        if after is None:
            changes[path] = "gone"
        elif after.get("size") != before.get("size"):
            changes[path] = f"size {before.get('size')} -> {after.get('size')} bytes"
        elif after.get("mtime_ns") != before.get("mtime_ns"):
            stamp = datetime.fromtimestamp(after["mtime_ns"] / 1e9).isoformat(timespec="seconds")
            changes[path] = f"modified at {stamp}"
    for path in now.keys() - started.keys():
        changes[path] = "new"
    return changes
