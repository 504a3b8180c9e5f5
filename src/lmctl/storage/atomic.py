"""Directories and files that appear complete or not at all: written under a hidden staging
name, flushed to disk, then renamed into place."""

from __future__ import annotations

import errno
import json
import os
import shutil
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path

STAGING_PREFIX = ".tmp-"
TEST_PAUSE_ENV = "LMCTL_TEST_PAUSE_IN_SAVE"


@contextmanager
def atomic_dir(
    final: Path, owner: str | None = None, manifest: str | None = None
) -> Iterator[Path]:
    """Write a directory under a temporary name in the same folder, then rename it into place.

    Readers (resume, eval, another process) see either no directory or a complete one; a crash
    midway leaves only a hidden ``.tmp-*`` folder that :func:`checkpoints` ignores and
    :func:`discard_staging` removes. ``owner`` names the staging folder (default: this
    process id); processes that write one directory together must agree on it. With
    ``manifest``, a file of that name listing every file and its size is written last.
    """
    staging = begin_staging(final, owner)
    try:
        yield staging
        commit_dir(staging, final, manifest)
    except BaseException:
        shutil.rmtree(staging, ignore_errors=True)
        raise


def staging_dir(final: Path, owner: str | None = None) -> Path:
    """The hidden temporary name under which ``final`` is written before it is committed."""
    tag = owner if owner is not None else str(os.getpid())
    return final.parent / f"{STAGING_PREFIX}{final.name}-{tag}"


def begin_staging(final: Path, owner: str | None = None) -> Path:
    """An empty staging folder for ``final`` (a leftover from a crashed writer is cleared)."""
    staging = staging_dir(final, owner)
    if staging.exists():
        shutil.rmtree(staging)
    staging.mkdir(parents=True)
    return staging


def commit_dir(staging: Path, final: Path, manifest: str | None = None) -> None:
    """Flush ``staging`` to disk and rename it to ``final`` (replacing an older copy).

    With ``manifest``, a list of the files and their sizes is written last under that name,
    so that a later truncation or partial copy is detected by :func:`manifest_problem`.
    """
    _test_pause(final.name)
    if manifest is not None:
        _write_manifest(staging, manifest)
    _fsync_tree(staging)
    if final.exists():
        remove_dir(final)
    os.replace(staging, final)
    _fsync_dir(final.parent)


def _write_manifest(staging: Path, manifest: str) -> dict[str, int]:
    files = {
        file.relative_to(staging).as_posix(): file.stat().st_size
        for file in sorted(staging.rglob("*"))
        if file.is_file() and file.name != manifest
    }
    (staging / manifest).write_text(json.dumps({"files": files}, indent=1) + "\n")
    return files


def commit_files(staging: Path, folder: Path, manifest: str, *, name: str) -> list[str]:
    """Move the files of ``staging`` into ``folder``, which holds other things too (so it
    cannot be renamed as a whole), with ``manifest`` as the commit point.

    The manifest (every file and its size) is written into staging and flushed; the old one in
    ``folder`` is removed, the files are moved in (those of the old manifest that the new one
    lacks are deleted), and the manifest is moved in last. A reader that finds the manifest
    and the files it lists finds a complete set; a crash before the old manifest is removed
    leaves the old set whole, and one after it leaves no manifest, which says "incomplete".
    ``name`` selects the save for the test pause. Returns the top-level names written.
    """
    _test_pause(name)
    files = _write_manifest(staging, manifest)
    _fsync_tree(staging)
    previous = _listed(folder / manifest)
    if (folder / manifest).exists():
        (folder / manifest).unlink()
        _fsync_dir(folder)
    for rel in files:
        target = folder / rel
        target.parent.mkdir(parents=True, exist_ok=True)
        os.replace(staging / rel, target)
    for rel in previous:
        if rel not in files and (folder / rel).is_file():
            (folder / rel).unlink()
    os.replace(staging / manifest, folder / manifest)
    _fsync_dir(folder)
    shutil.rmtree(staging, ignore_errors=True)
    return sorted({rel.split("/", 1)[0] for rel in files} | {manifest})


def _listed(listing: Path) -> dict[str, int]:
    try:
        files = json.loads(listing.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return {}
    return files if isinstance(files, dict) else {}


def manifest_problem(path: Path, manifest: str) -> str | None:
    """Why the files of ``path`` do not match its manifest, or None when they do (or when it
    has no manifest)."""
    listing = path / manifest
    if not listing.is_file():
        return None
    try:
        files = json.loads(listing.read_text())["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return f"{manifest} is unreadable"
    for name, size in files.items():
        file = path / name
        if not file.is_file():
            return f"{name} is missing"
        if file.stat().st_size != size:
            return f"{name} has {file.stat().st_size} bytes instead of {size}"
    return None


def _test_pause(save: str) -> None:
    """Test hook: ``LMCTL_TEST_PAUSE_IN_SAVE=SECONDS`` (every save) or ``NAME:SECONDS`` (only
    the save called NAME: a checkpoint's directory name, or ``model`` for the final model)
    sleeps after the content is written and before the rename, so that a test can kill the
    process in the middle of a save."""
    value = os.environ.get(TEST_PAUSE_ENV, "").strip()
    if not value:
        return
    name, _, seconds = value.rpartition(":")
    if name and name != save:
        return
    sys.stderr.write(f"{TEST_PAUSE_ENV}: pausing {seconds}s before committing {save}\n")
    sys.stderr.flush()
    time.sleep(float(seconds))


def remove_dir(path: Path) -> None:
    """Delete a directory so that it disappears at once: rename it away, then remove it."""
    doomed = staging_dir(path, "deleted")
    if doomed.exists():
        shutil.rmtree(doomed)
    os.replace(path, doomed)
    shutil.rmtree(doomed, ignore_errors=True)


def _fsync_tree(root: Path) -> None:
    for file in root.rglob("*"):
        if file.is_file():
            with open(file, "rb") as handle:
                os.fsync(handle.fileno())
    _fsync_dir(root)


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)


def discard_staging(path: Path) -> list[Path]:
    """Remove half-written directories left in ``path`` by a save that was killed."""
    if not path.is_dir():
        return []
    found = sorted(
        child
        for child in path.iterdir()
        if child.is_dir() and child.name.startswith(STAGING_PREFIX)
    )
    for child in found:
        shutil.rmtree(child, ignore_errors=True)
    return found


def atomic_write(path: Path, content: str | bytes) -> None:
    tmp = path.with_name(f".{path.name}.tmp")
    data = content.encode("utf-8") if isinstance(content, str) else content
    with open(tmp, "wb") as handle:
        handle.write(data)
        handle.flush()
        os.fsync(handle.fileno())
    os.replace(tmp, path)


#: Free space below which a failed write is taken for a full disk (libraries such as torch
#: report a short write without its errno).
NEARLY_FULL_BYTES = 1 << 20


def no_space_left(exc: BaseException, path: Path) -> bool:
    """Whether ``exc`` (or an exception it came from) failed because the file system holding
    ``path`` is full."""
    current: BaseException | None = exc
    seen: set[int] = set()
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        if isinstance(current, OSError) and current.errno in (errno.ENOSPC, errno.EDQUOT):
            return True
        if "No space left on device" in str(current):
            return True
        current = current.__cause__ or current.__context__
    try:
        return shutil.disk_usage(path).free < NEARLY_FULL_BYTES
    except OSError:
        return False
