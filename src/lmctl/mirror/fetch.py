"""Reading a run directory on object storage back (:mod:`lmctl.mirror.upload` writes it).

:func:`fetch_run` brings a remote run's files and its newest complete checkpoint to a local
copy (``lmctl resume URL`` on a machine that has none); :func:`sync_checkpoints` makes a
machine's copy of a run on several machines end with the store's newest complete
checkpoint, whole; :func:`find_remote_runs` and :func:`fetch_summary` fetch the few small
files that ``lmctl runs URL`` reads. A checkpoint is complete when its
``lmctl-manifest.json`` is there; every file fetched is checked against it.
"""

from __future__ import annotations

import json
import os
import time
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.errors import ConfigError, LmctlError
from lmctl.run import checkpoints, history, rundir
from lmctl.storage import atomic, locations

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from lmctl.console import Console

#: What ``lmctl runs URL`` reads of a run: small files only.
_SUMMARY_FILES = (
    rundir.CONFIG_FILE,
    history.METRICS_LOG,
    history.STATE_FILE,
    "all_results.json",
    rundir.RUN_MARKER,
)


def names_in(fs: AbstractFileSystem, root: str) -> set[str]:
    """The names of the entries of folder ``root`` in the store (none when it is missing)."""
    fs.invalidate_cache(root)
    try:
        return {name.rstrip("/").rsplit("/", 1)[-1] for name in fs.ls(root, detail=False)}
    except FileNotFoundError:
        return set()


def is_complete(fs: AbstractFileSystem, path: str) -> bool:
    fs.invalidate_cache(path)
    return bool(fs.exists(f"{path}/{locations.MANIFEST}"))


def complete_steps(fs: AbstractFileSystem, root: str, names: set[str]) -> list[int]:
    """The steps of the checkpoints among ``names`` whose manifest is in the store."""
    return [
        int(match.group(1))
        for name in names
        if (match := checkpoints.CHECKPOINT_PATTERN.match(name))
        and is_complete(fs, f"{root}/{name}")
    ]


def newest_complete(fs: AbstractFileSystem, root: str, names: set[str]) -> int | None:
    return max(complete_steps(fs, root, names), default=None)


def _manifest(fs: AbstractFileSystem, path: str) -> dict[str, Any] | None:
    try:
        with fs.open(f"{path}/{locations.MANIFEST}", "rb") as handle:
            data = json.loads(handle.read())
    except FileNotFoundError:
        return None
    return data if isinstance(data, dict) else None


@contextmanager
def _store(url: str, flag: str) -> Iterator[tuple[AbstractFileSystem, str]]:
    """The filesystem and root of the store at ``url``; a failure inside the block that is
    not lmctl's own is reported as the store's (:func:`lmctl.storage.locations.failure`)."""
    location = locations.parse_location(url, flag, destination=False)
    try:
        yield locations.open_location(location)
    except LmctlError:
        raise
    except Exception as exc:
        raise locations.failure(exc, url) from exc


def _fetch_listed(
    fs: AbstractFileSystem, root: str, items: list[dict[str, Any]], target: Path, where: str
) -> None:
    """Download the files a manifest lists (``items``) from ``root`` (``where`` in the
    user's words) into ``target``; a file missing from the store is
    :class:`lmctl.storage.locations.MissingObjects`."""
    for item in items:
        try:
            locations.download_file(
                fs, f"{root}/{item['path']}", target / item["path"], item.get("sha256"), where
            )
        except FileNotFoundError as exc:
            raise locations.MissingObjects(where, [item["path"]]) from exc


def _missing(fs: AbstractFileSystem, path: str, items: list[dict[str, Any]]) -> list[str]:
    """The files of a manifest (``items``) that the folder ``path`` in the store lacks, or
    holds with another size: one listing, no download."""
    fs.invalidate_cache(path)
    try:
        found = fs.find(path, detail=True)
    except FileNotFoundError:
        found = {}
    prefix = path.rstrip("/") + "/"
    sizes = {name[len(prefix) :]: info.get("size") for name, info in found.items()
             if name.startswith(prefix)}  # fmt: skip
    return [item["path"] for item in items if sizes.get(item["path"]) != item.get("size")]


def fetch_run(url: str, local: Path, console: Console, *, whole: bool = False) -> Path:
    """The local copy of the remote run at ``url`` in ``local``, with its newest complete
    checkpoint (each file checked against the checkpoint's manifest). A local copy that this
    machine already has is kept (it is at least as new as the store); only a checkpoint it
    lacks is downloaded.

    ``whole``: for a machine of a run on several machines, whose copy holds only its own part
    of each checkpoint (see :func:`sync_checkpoints`)."""
    with _store(url, "RUN_DIR") as (fs, root):
        return _fetch_run(fs, root, url.rstrip("/"), local, console, whole=whole)


def sync_checkpoints(url: str, local: Path, console: Console) -> None:
    """Before a machine of a run on several machines resumes: its copy's checkpoints end
    with the store's newest complete one, whole. Its copy holds only its own part of each
    checkpoint, and parts of checkpoints that never completed (removed here); the processes
    of the machine take turns, and the first one downloads what is missing."""
    with _store(url, "--output-dir") as (fs, root), _machine_lock(local):
        _sync_checkpoints(fs, root, url.rstrip("/"), local, console)


@contextmanager
def _machine_lock(local: Path) -> Iterator[None]:
    """One process of this machine at a time fetches into ``local``."""
    from filelock import FileLock

    local.parent.mkdir(parents=True, exist_ok=True)
    with FileLock(str(local.parent / f".{local.name}.lock")):
        yield


def _fetch_run(
    fs: AbstractFileSystem, root: str, url: str, local: Path, console: Console, *, whole: bool
) -> Path:
    names = names_in(fs, root)
    manifest = _manifest(fs, root)
    if manifest is None or rundir.CONFIG_FILE not in names:
        raise ConfigError(
            f"{url} is not a run directory that lmctl uploaded (no {rundir.CONFIG_FILE} and "
            f"{locations.MANIFEST})",
            "give the --output-dir of an 'lmctl train' run",
        )
    with _machine_lock(local):
        if not (local / rundir.CONFIG_FILE).is_file():
            console.info(f"fetching the run {url} into {local}")
            local.mkdir(parents=True, exist_ok=True)
            _fetch_run_files(fs, root, url, manifest.get("files", []), local, console=console)
        if whole:
            _sync_checkpoints(fs, root, url, local, console)
        else:
            _fetch_newest(fs, root, url, local, console, names=names)
    return local


def _fetch_run_files(
    fs: AbstractFileSystem,
    root: str,
    url: str,
    items: list[dict[str, Any]],
    local: Path,
    *,
    console: Console,
) -> None:
    """The run's own files. One missing from the store (its final model, deleted) is named
    and left out, with the rest of the final save when it is part of it: the resumed run
    saves them again. The run's config alone cannot be done without."""
    missing = set(_missing(fs, root, items))
    if rundir.CONFIG_FILE in missing:
        raise locations.MissingObjects(url, [rundir.CONFIG_FILE])
    if missing:
        urls = ", ".join(f"{url}/{path}" for path in sorted(missing))
        console.warn(
            f"{urls}: listed in {url}/{locations.MANIFEST} but not in the store; the resumed "
            "run saves its final model again when it ends"
        )
        final = _final_save(fs, root)
        if missing & final:
            missing |= final
    _fetch_listed(fs, root, [item for item in items if item["path"] not in missing], local, url)


def _final_save(fs: AbstractFileSystem, root: str) -> set[str]:
    """The files of the run's final save as its manifest in the store lists them (with it);
    without that manifest, the files that mark a final model as there."""
    try:
        with fs.open(f"{root}/{checkpoints.MODEL_MANIFEST}", "rb") as handle:
            listed = json.loads(handle.read())["files"]
        return {checkpoints.MODEL_MANIFEST, *listed}
    except (FileNotFoundError, ValueError, KeyError, TypeError):
        return {checkpoints.MODEL_MANIFEST, "config.json"}


def _fetch_newest(
    fs: AbstractFileSystem, root: str, url: str, local: Path, console: Console, *, names: set[str]
) -> None:
    """The store's newest checkpoint that is complete (its manifest and every file it lists),
    unless the local copy has one as new. One whose files are gone is named and passed over."""
    have = checkpoints.latest_checkpoint(local)
    for step in sorted(complete_steps(fs, root, names), reverse=True):
        if have is not None and checkpoints.checkpoint_step(have) >= step:
            return
        name = f"checkpoint-{step}"
        listed = (_manifest(fs, f"{root}/{name}") or {}).get("files", [])
        try:
            missing = _missing(fs, f"{root}/{name}", listed)
            if missing:
                raise locations.MissingObjects(f"{url}/{name}", missing)
            started = time.monotonic()
            with atomic.atomic_dir(local / name, owner="fetch") as staging:
                _fetch_listed(fs, f"{root}/{name}", listed, staging, f"{url}/{name}")
        except locations.MissingObjects as exc:
            console.warn(f"{exc.message}; {name} is not complete, an older checkpoint is used")
            continue
        rundir.record_written(local, name)
        console.info(f"fetched {name} from {url} in {time.monotonic() - started:.1f} s")
        return


def _sync_checkpoints(
    fs: AbstractFileSystem, root: str, url: str, local: Path, console: Console
) -> None:
    newest = newest_complete(fs, root, names_in(fs, root))
    atomic.discard_staging(local)
    for checkpoint in checkpoints.checkpoints(local):
        if newest is None or checkpoints.checkpoint_step(checkpoint) > newest:
            atomic.remove_dir(checkpoint)
    if newest is None:
        return
    name = f"checkpoint-{newest}"
    listed = (_manifest(fs, f"{root}/{name}") or {}).get("files", [])
    missing = [item for item in listed if not _holds(local / name / item["path"], item)]
    if not missing:
        return
    started = time.monotonic()
    _fetch_listed(fs, f"{root}/{name}", missing, local / name, url)
    rundir.record_written(local, name)
    console.info(
        f"fetched {len(missing)} of the {len(listed)} files of {name} from {url} in "
        f"{time.monotonic() - started:.1f} s"
    )


def _holds(file: Path, item: dict[str, Any]) -> bool:
    """Whether ``file`` is the one a manifest lists."""
    return (
        file.is_file()
        and file.stat().st_size == item.get("size")
        and locations.file_digests(file).sha256 == item.get("sha256")
    )


def find_remote_runs(url: str) -> list[str]:
    """The runs at ``url``: the run itself, or the runs one level below it."""
    with _store(url, "DIR") as (fs, root):
        names = names_in(fs, root)
        if rundir.CONFIG_FILE in names:
            return [url.rstrip("/")]
        return sorted(
            f"{url.rstrip('/')}/{name}"
            for name in names
            if not name.startswith(".") and fs.exists(f"{root}/{name}/{rundir.CONFIG_FILE}")
        )


def fetch_summary(url: str, target: Path) -> Path:
    """The files of the remote run at ``url`` that a summary reads, into ``target``: the
    run's small files and each complete checkpoint's trainer state."""
    with _store(url, "DIR") as (fs, root):
        names = names_in(fs, root)
        for name in _SUMMARY_FILES:
            if name in names:
                _fetch_dated(fs, f"{root}/{name}", target / name)
        for name in names:
            path = f"{root}/{name}"
            if checkpoints.CHECKPOINT_PATTERN.match(name) and is_complete(fs, path):
                _fetch_dated(fs, f"{path}/{history.STATE_FILE}", target / name / history.STATE_FILE)
    return target


def _fetch_dated(fs: AbstractFileSystem, remote: str, local: Path) -> None:
    """One file, with the store's modification time (a run's age is read from it)."""
    local.parent.mkdir(parents=True, exist_ok=True)
    fs.get_file(remote, str(local))
    with suppress(Exception):
        modified = fs.modified(remote)
        os.utime(local, (modified.timestamp(), modified.timestamp()))
