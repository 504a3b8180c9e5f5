"""The prepared-data cache: tokenized and grouped splits on disk, keyed by a manifest.

A split's manifest names everything that decides its tokens: the data (each file's absolute
path, size and modification time, or a Hub dataset's fingerprint), how it was read (text
column, line breaks, held-out part), the tokenizer's content hash, the
objective's parameters (block size, line by line, maximum length, special-tokens mask, ...),
the cache format and the lmctl version. The hash of the manifest names the cache directory,
so a cache is reused only when every one of those matches; anything else is prepared again,
and lmctl says which part changed. Caches whose data files have changed since are deleted on
the way, since nothing can use them any more. Sample limits (``--max-train-samples``,
``--max-eval-samples``) are not part of the key: a split is cached whole, and a limit keeps
the first samples of it, as upstream selects them after tokenizing and grouping.

``lmctl prepare`` and ``lmctl train`` both go through :func:`prepared_splits`, so a prepared
cache is exactly what training would have built. Building holds a file lock: in a
distributed run (or two runs at once) one process prepares while the others wait on the lock
and then reuse its result. No collective operation is involved, so a long preparation
cannot trip the process-group timeout.

Layout: ``<root>/<key>/{manifest.json, data.arrow}`` where root is
``--prepared-cache-dir``, else ``prepared/`` in lmctl's cache
(:func:`lmctl.storage.paths.cache_root`).
"""

from __future__ import annotations

import hashlib
import json
import shutil
import time
from collections.abc import Callable
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl import __version__
from lmctl.data.load import tokenizer_fingerprint
from lmctl.data.sources import sources_identity
from lmctl.storage import paths
from lmctl.storage.atomic import atomic_dir
from lmctl.storage.paths import has_glob, is_remote, local_path, matching_files

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict
    from transformers import PreTrainedTokenizerBase

    from lmctl.config.slices import DataSpec
    from lmctl.console import Console

#: Bump when the on-disk layout or the meaning of a manifest field changes. Format 2: a split
#: is cached whole (sample limits are applied to the cached samples, not to the raw records).
CACHE_FORMAT = 2
MANIFEST = "manifest.json"
DATA_FILE = "data.arrow"
#: The manifest sections that make up the key, in the order changes are reported.
KEYED = ("data", "tokenizer", "params", "lmctl_version", "format")

#: A cache of the same data that differs in more settings than this is another config's.
MAX_REPORTED_CHANGES = 2

#: Builds one split into the Arrow file it is given; returns statistics for the manifest.
Builder = Callable[[str, "Dataset", Path], dict[str, Any]]


def cache_root(data: DataSpec) -> Path:
    if data.prepared_cache_dir is not None:
        return local_path(data.prepared_cache_dir)
    return paths.cache_root() / "prepared"


def file_identity(path: str) -> dict[str, Any]:
    """A data path's identity: absolute path, size and modification time of every file."""
    if is_remote(path):
        return _remote_identity(path)
    if has_glob(path):
        pattern = str(local_path(path).absolute())
        return {"path": pattern, "files": [file_identity(match) for match in matching_files(path)]}
    resolved = local_path(path).resolve()
    stat = resolved.stat()
    return {"path": str(resolved), "size": stat.st_size, "mtime_ns": stat.st_mtime_ns}


#: Fields of an fsspec ``info()`` record that change when an object's content changes.
_VERSION_FIELDS = (
    "ETag",
    "etag",
    "md5Hash",
    "md5",
    "generation",
    "mtime",
    "LastModified",
    "updated",
)


def _remote_identity(path: str) -> dict[str, Any]:
    from fsspec.core import url_to_fs

    fs, inner = url_to_fs(path)
    if has_glob(path):
        return {"path": path, "files": [_remote_identity(fs.unstrip_protocol(match))
                                        for match in sorted(fs.glob(inner))]}  # fmt: skip
    info = fs.info(inner)
    version = {key: str(info[key]) for key in _VERSION_FIELDS if info.get(key) is not None}
    return {"path": path, "size": info.get("size"), **version}


def split_identity(
    data: DataSpec, split: str, dataset: Dataset, held_out: bool
) -> dict[str, Any] | None:
    """What the raw records of ``split`` are, without reading them (``held_out``: the
    validation split was cut from the training data); None when they cannot be known without
    reading them (a reader without a version), so the split is prepared again each run."""
    identity: dict[str, Any] = {"text_column": data.text_column}
    sourced = sources_identity(data, split)
    if sourced is None:
        return None
    if sourced:
        for entry in sourced["sources"]:
            if "file" in entry:
                entry["file"] = file_identity(entry["file"])
        # The mixture's draw (weights, --seed) is in the fingerprint of the mixed records.
        identity.update(sourced, fingerprint=dataset._fingerprint)
        if held_out:
            identity["held_out"] = {"part": split, "percent": data.validation_split_percentage}
        return identity
    if data.dataset_name is not None:
        identity["dataset"] = {
            "name": data.dataset_name,
            "config": data.dataset_config_name,
            "split": split,
            "fingerprint": dataset._fingerprint,
        }
        return identity
    path = data.validation_file if split == "validation" and not held_out else data.train_file
    assert path is not None
    identity["file"] = file_identity(path)
    if held_out:
        identity["held_out"] = {"part": split, "percent": data.validation_split_percentage}
    return identity


def manifest_key(manifest: dict[str, Any]) -> str:
    keyed = {section: manifest[section] for section in KEYED}
    payload = json.dumps(keyed, sort_keys=True, default=str)
    return hashlib.sha256(payload.encode()).hexdigest()[:24]


def prepared_splits(
    data: DataSpec,
    raw: DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    console: Console,
    *,
    params: dict[str, Any],
    text_options: dict[str, Any],
    build: Builder,
) -> DatasetDict:
    """Each split of ``raw`` from the cache when its manifest matches, else built and cached.

    ``params`` must name every objective setting that changes the output of ``build``.
    """
    import datasets

    root = cache_root(data)
    tokenizer_hash = tokenizer_fingerprint(tokenizer)
    # File data without a validation file has a validation split only when it was held out.
    held_out = data.validation_file is None and not data.validation_sources and "validation" in raw
    out = {}
    reused = []
    for split, dataset in raw.items():
        identity = split_identity(data, split, dataset, held_out)
        if identity is None:
            out[split] = _build_uncached(split, dataset, build)
            continue
        manifest = {
            "data": {**identity, "read_options": text_options},
            "tokenizer": tokenizer_hash,
            "params": params,
            "lmctl_version": __version__,
            "format": CACHE_FORMAT,
        }
        directory = root / manifest_key(manifest)
        loaded = None if data.overwrite_cache else _load(directory, manifest)
        if loaded is None:
            loaded = _build_locked(
                directory,
                split,
                dataset=dataset,
                manifest=manifest,
                build=build,
                console=console,
                overwrite=data.overwrite_cache,
            )
        else:
            reused.append(f"{split} {len(loaded)} rows")
        out[split] = loaded
    if reused:
        console.info(f"reusing prepared data from {root}: {', '.join(reused)}")
    return datasets.DatasetDict(out)


def read_manifest(directory: Path) -> dict[str, Any] | None:
    try:
        data = json.loads((directory / MANIFEST).read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def _load(directory: Path, manifest: dict[str, Any]) -> Dataset | None:
    """The cached split, if ``directory`` holds one whose manifest matches in every keyed part."""
    from datasets import Dataset

    stored = read_manifest(directory)
    if stored is None or any(stored.get(part) != manifest[part] for part in KEYED):
        return None
    return Dataset.from_file(str(directory / DATA_FILE))


def _build_locked(
    directory: Path,
    split: str,
    *,
    dataset: Dataset,
    manifest: dict[str, Any],
    build: Builder,
    console: Console,
    overwrite: bool,
) -> Dataset:
    from filelock import FileLock, Timeout

    root = directory.parent
    root.mkdir(parents=True, exist_ok=True)
    lock = FileLock(str(root / f"{directory.name}.lock"))
    try:
        lock.acquire(timeout=0)
    except Timeout:
        console.info(f"{split}: another process is preparing the same data; waiting for it")
        lock.acquire()
    try:
        if not overwrite or _built_by_other_process(directory):
            loaded = _load(directory, manifest)
            if loaded is not None:
                console.info(f"{split}: reusing prepared data from {directory}")
                return loaded
        _explain_rebuild(root, split, manifest, console)
        started = time.monotonic()
        with atomic_dir(directory) as staging:
            stats = build(split, dataset, staging / DATA_FILE)
            stats["seconds"] = round(time.monotonic() - started, 3)
            record = {
                **manifest,
                "key": directory.name,
                "split": split,
                "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
                "created_unix": time.time(),
                "stats": stats,
            }
            (staging / MANIFEST).write_text(json.dumps(record, indent=2) + "\n", encoding="utf-8")
        console.info(f"{split}: prepared data cached in {directory}")
    finally:
        lock.release()
    loaded = _load(directory, manifest)
    assert loaded is not None
    return loaded


def _build_uncached(split: str, dataset: Dataset, build: Builder) -> Dataset:
    """A split whose records cannot be keyed, prepared into a folder of this process only."""
    from datasets import Dataset

    from lmctl.data.sources import run_folder

    path = Path(run_folder()) / DATA_FILE
    build(split, dataset, path)
    return Dataset.from_file(str(path))


def _built_by_other_process(directory: Path) -> bool:
    """With --overwrite-cache, a cache that another process of this run (another rank) built
    after this process started is fresh: building it again would repeat the same work."""
    stored = read_manifest(directory)
    return stored is not None and float(stored.get("created_unix", 0)) >= _process_started()


def _process_started() -> float:
    import psutil

    return float(psutil.Process().create_time())


def _explain_rebuild(root: Path, split: str, manifest: dict[str, Any], console: Console) -> None:
    """Say why no cache matched when one exists for the same data; drop caches of data files
    that have changed since (no run can match them again)."""
    data = manifest["data"]
    same_source = []
    for candidate in sorted(root.glob(f"*/{MANIFEST}")):
        stored = read_manifest(candidate.parent)
        if stored is None or stored.get("split") != split:
            continue
        stored_data = stored.get("data", {})
        if _source_name(stored_data) != _source_name(data):
            continue
        if _stale_file(stored_data):
            shutil.rmtree(candidate.parent, ignore_errors=True)
            console.info(f"removed prepared data for a file that has changed: {candidate.parent}")
        same_source.append(stored)
    # Only the same data prepared with a setting or two changed (or the same file, changed
    # since) is worth comparing with; anything further away is simply another config.
    candidates = [describe_changes(stored, manifest) for stored in same_source]
    closest = min(candidates, key=len, default=None)
    if closest is None or len(closest) > MAX_REPORTED_CHANGES:
        console.info(f"{split}: no prepared data for this config yet; preparing data")
        return
    console.info(f"{split}: prepared data exists but {'; '.join(closest)}: preparing it again")


def _source_name(data: dict[str, Any]) -> Any:
    if "file" in data:
        return data["file"].get("path"), data.get("held_out", {}).get("part")
    return data.get("dataset", {}).get("name"), data.get("dataset", {}).get("split")


def _stale_file(data: dict[str, Any]) -> bool:
    file = data.get("file")
    if not file or ("size" not in file and "files" not in file):
        return False
    try:
        return file_identity(file["path"]) != file
    except OSError:
        return True


def describe_changes(old: dict[str, Any], new: dict[str, Any]) -> list[str]:
    """What differs between two manifests, in words."""
    changes = []
    old_data, new_data = old.get("data", {}), new["data"]
    if old_data.get("file") != new_data.get("file") or old_data.get("dataset") != new_data.get(
        "dataset"
    ):
        changes.append("the data changed")
    for name in ("held_out", "text_column", "read_options"):
        if old_data.get(name) != new_data.get(name):
            changes.append(f"{name.replace('_', ' ')} {old_data.get(name)} -> {new_data.get(name)}")
    if old.get("tokenizer") != new["tokenizer"]:
        changes.append("the tokenizer changed")
    old_params, new_params = old.get("params", {}), new["params"]
    for name in sorted(set(old_params) | set(new_params)):
        if old_params.get(name) != new_params.get(name):
            changes.append(f"{name} {old_params.get(name)} -> {new_params.get(name)}")
    if old.get("lmctl_version") != new["lmctl_version"]:
        changes.append(f"lmctl {old.get('lmctl_version')} -> {new['lmctl_version']}")
    if old.get("format") != new["format"]:
        changes.append("the cache format changed")
    return changes or ["its manifest differs"]


def describe(dataset: Dataset) -> dict[str, Any]:
    """The manifest of a split loaded from the cache (for ``lmctl prepare``'s report)."""
    filename = dataset.cache_files[0]["filename"]
    directory = Path(filename).parent
    stored = read_manifest(directory) or {}
    return {
        "path": str(directory),
        "key": stored.get("key"),
        "rows": len(dataset),
        **stored.get("stats", {}),
    }
