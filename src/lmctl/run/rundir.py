"""The run directory contract, shared by every engine and read back by eval and resume.

lmctl.yaml            resolved config (no secrets); `--config` accepts it as is
metrics.jsonl         one JSON object per logged step or evaluation, and the run's events:
                      its start, resumes and restarts (with their commands), its finishes
train_results.json    upstream-compatible result files (``lmctl eval`` writes
eval_results.json     eval_results.json only when absent, see lmctl.evaluation)
all_results.json
trainer_state.json    written by the engine
fast_paths.json       the fast paths of the run's last start: its setting, and each path
                      asked about, on or off and why (lmctl.fastpaths)
checkpoint-<step>/    checkpoints (the newest complete one is used to resume), each written
                      under a hidden .tmp-* name and renamed when complete, with a manifest
                      (lmctl_checkpoint.json) of its files and sizes
README.md             model card
data_files.json       the local training files as the run started on them (lmctl.run.datafiles)
config.json, model.safetensors, tokenizer files: the final model (save_pretrained), staged
                      under a hidden .tmp-model-* folder and moved into place with its manifest
                      (lmctl_model.json, files and sizes) last
lmctl_run.json        the run marker, written first: proves that lmctl created the directory
                      and lists every entry lmctl wrote into it (--overwrite-output-dir removes
                      those and nothing else)
.lmctl-lock           held by the one process that writes the run, and the record of who
.lmctl-lock.json      that is (:mod:`lmctl.run.lock`); hidden, never listed in the marker,
                      uploaded or published, and left alone by --overwrite-output-dir

This module holds where the run lives, its marker, the overwrite rules and its config; the
metrics, results and trainer state are :mod:`lmctl.run.history`, the checkpoints and the
final model :mod:`lmctl.run.checkpoints`, the model card :mod:`lmctl.run.card`.
"""

from __future__ import annotations

import json
import os
import re
import shutil
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl import __version__, distributed, secrets
from lmctl.errors import ConfigError
from lmctl.storage.atomic import atomic_write
from lmctl.storage.paths import local_path, url_scheme

if TYPE_CHECKING:
    from lmctl.config.base import TrainConfig
    from lmctl.config.slices import RunDirSpec

CONFIG_FILE = "lmctl.yaml"
RUN_MARKER = "lmctl_run.json"
RUN_FORMAT = "lmctl-run/1"
#: The run directory's lock and the record of its holder (see lmctl.run.lock).
LOCK_FILE = ".lmctl-lock"
HOLDER_FILE = ".lmctl-lock.json"
#: Leftovers of lmctl's own interrupted writes: staging folders and atomic_write temp files.
_LEFTOVER = re.compile(r"^\.tmp-(checkpoint-\d+|model)-[\w.-]+$|^\.(?P<file>.+)\.tmp$")


def is_lmctl_run(path: Path) -> bool:
    """Whether lmctl created ``path`` as a run directory (its run marker is there)."""
    return (path / RUN_MARKER).is_file()


def is_lock_entry(name: str) -> bool:
    """Whether ``name`` is the run directory's lock, its holder record or that record's
    temporary file: they belong to whichever process holds the directory now, not to a run."""
    return name in (LOCK_FILE, HOLDER_FILE, f".{HOLDER_FILE}.tmp")


def run_entries(path: Path) -> list[Path]:
    """What ``path`` holds, less the run directory's lock (an empty list for no directory)."""
    if not path.is_dir():
        return []
    return [child for child in path.iterdir() if not is_lock_entry(child.name)]


def is_remote_run(spec: RunDirSpec) -> bool:
    """Whether the run directory is a storage URL (written locally, then uploaded)."""
    return spec.output_dir is not None and url_scheme(spec.output_dir) is not None


def per_machine_copies(spec: RunDirSpec) -> bool:
    """Whether every machine writes its own local copy of the run: a storage URL as the run
    directory of a run on several machines (see :mod:`lmctl.mirror`)."""
    return is_remote_run(spec) and distributed.nodes() > 1


def commits_checkpoints(spec: RunDirSpec) -> bool:
    """Whether this process renames each checkpoint into place: the main process, and with
    per-machine copies the first process of every other machine (its machine's part, which
    has no trainer state of its own: it is uploaded, never resumed from by itself)."""
    if distributed.is_main_process():
        return True
    return per_machine_copies(spec) and distributed.local_rank() == 0


def local_run_dir(spec: RunDirSpec) -> Path:
    """The folder the run is written into: --output-dir itself, or for a storage URL its
    local copy (--staging-dir, by default a folder per URL, and machine, in the cache).
    Without --output-dir (``lmctl prepare``): the working directory."""
    if spec.output_dir is None:
        return Path(".")
    if not is_remote_run(spec):
        return Path(spec.output_dir)
    if spec.staging_dir is not None:
        return local_path(spec.staging_dir)
    from lmctl.storage.locations import run_staging_dir

    return run_staging_dir(spec.output_dir, distributed.node_rank(), distributed.nodes())


def check_location(spec: RunDirSpec) -> None:
    """Refuse a run directory that cannot be one (a file, or below a file; a storage URL with
    --overwrite-output-dir), before its lock is taken inside it. Writes nothing."""
    path = local_run_dir(spec)
    if is_remote_run(spec):
        if spec.overwrite_output_dir:
            raise ConfigError(
                f"--overwrite-output-dir does not apply to a storage URL "
                f"(--output-dir {spec.output_dir})",
                "choose a new --output-dir prefix, or delete the old run from the store first",
            )
        if path.exists() and not path.is_dir():
            raise ConfigError(
                f"--staging-dir {path}: exists and is not a directory",
                "choose another --staging-dir",
            )
        return
    if path.exists() and not path.is_dir():
        raise ConfigError(
            f"--output-dir {path}: exists and is not a directory", "choose another --output-dir"
        )
    for parent in path.parents:
        if parent.exists():
            if not parent.is_dir():
                raise ConfigError(
                    f"--output-dir {path}: {parent} is a file, not a directory",
                    "choose an --output-dir whose parent folders are directories",
                )
            break


def check_output_dir(spec: RunDirSpec) -> None:
    """Refuse to write into a non-empty directory unless asked to (before any heavy work).

    --overwrite-output-dir only ever replaces an earlier lmctl run: a directory without the run
    marker (a project folder that merely holds a file called lmctl.yaml, say) is refused.
    A remote run directory's local copy must be new or empty unless the run is resumed (what
    the bucket holds is checked by :mod:`lmctl.mirror`). The run directory's own lock is not
    content: the process that checks holds it.
    """
    check_location(spec)
    path = local_run_dir(spec)
    if is_remote_run(spec):
        _check_staging(spec, path)
        return
    if not run_entries(path):
        return
    if spec.resume_from_checkpoint is not None:
        return
    if spec.overwrite_output_dir:
        if is_lmctl_run(path):
            return
        entries = sorted(child.name for child in run_entries(path))
        shown = ", ".join(entries[:8]) + (
            f" and {len(entries) - 8} more" if len(entries) > 8 else ""
        )
        raise ConfigError(
            f"--output-dir {path} is not a run directory that lmctl created (no {RUN_MARKER}); "
            f"--overwrite-output-dir would put a run among {shown}, so nothing was touched",
            "choose a new or empty --output-dir (--overwrite-output-dir only replaces an "
            "earlier lmctl run)",
        )
    raise ConfigError(
        f"--output-dir {path} is not empty",
        f"choose a new --output-dir, continue it with 'lmctl resume {path}', "
        "or pass --overwrite-output-dir",
    )


def _check_staging(spec: RunDirSpec, path: Path) -> None:
    url = spec.output_dir
    if spec.resume_from_checkpoint is None and run_entries(path):
        raise ConfigError(
            f"--output-dir {url}: its local copy {path} holds an earlier run of that URL, "
            "which may not be fully uploaded; nothing was touched",
            f"continue it with 'lmctl resume {url}', or remove {path} (or give another "
            "--staging-dir)",
        )


def prepare_output_dir(spec: RunDirSpec) -> list[str]:
    """Create the run directory and its marker; with --overwrite-output-dir, remove what an
    earlier lmctl run recorded writing there. Returns the entries that were kept."""
    path = local_run_dir(spec)
    kept: list[str] = []
    if spec.overwrite_output_dir and spec.resume_from_checkpoint is None and is_lmctl_run(path):
        kept = clear_run(path)
    path.mkdir(parents=True, exist_ok=True)
    if not is_lmctl_run(path):
        _write_marker(path, [])
    return kept


def clear_run(path: Path) -> list[str]:
    """Remove every entry the run marker lists (and lmctl's own leftovers of interrupted
    writes of those); everything else stays, the lock of the process that clears included.
    Returns the names kept."""
    recorded = set(_read_marker(path)) | {RUN_MARKER}
    kept: list[str] = []
    for child in sorted(run_entries(path)):
        leftover = _LEFTOVER.match(child.name)
        owned = child.name in recorded or (
            leftover is not None
            and (leftover.group("file") is None or leftover["file"] in recorded)
        )
        if not owned:
            kept.append(child.name)
        elif child.is_dir() and not child.is_symlink():
            shutil.rmtree(child)
        else:
            child.unlink()
    _known.pop(str(path.resolve()), None)
    return kept


_known: dict[str, set[str]] = {}


def _read_marker(path: Path) -> list[str]:
    try:
        data = json.loads((path / RUN_MARKER).read_text(encoding="utf-8"))
        files = data["files"]
    except (OSError, ValueError, KeyError, TypeError):
        return []
    return [str(name) for name in files] if isinstance(files, list) else []


def _write_marker(path: Path, files: list[str]) -> None:
    marker = {"format": RUN_FORMAT, "lmctl_version": __version__, "files": sorted(set(files))}
    atomic_write(path / RUN_MARKER, json.dumps(marker, indent=1) + "\n")
    _known[str(path.resolve())] = set(marker["files"])


def record_written(path: Path, *names: str) -> None:
    """Note in the run marker that lmctl wrote these entries of run directory ``path``
    (nothing happens outside a run directory that lmctl created)."""
    key = str(path.resolve())
    known = _known.get(key)
    if known is not None and known.issuperset(names):
        return
    if not is_lmctl_run(path):
        return
    files = set(_read_marker(path)) | set(names)
    _write_marker(path, sorted(files))


# Config fields that may name local files or directories; lmctl.yaml stores them absolute so
# that resume and eval work from any working directory. Those that may also be a Hub id are
# made absolute only when they exist; the others always (an output directory that does not
# exist yet included).
PATH_FIELDS = (
    "model_name_or_path",
    "config_name",
    "tokenizer_name",
    "dataset_name",
)
LOCAL_PATH_FIELDS = (
    "output_dir",
    "staging_dir",
    "cache_dir",
    "prepared_cache_dir",
    "train_file",
    "validation_file",
)


#: The same in each entry of ``train_sources`` and ``validation_sources``.
SOURCE_PATH_FIELDS = (("dataset",), ("file",))


def absolute_paths(
    data: dict[str, Any], fields: tuple[tuple[str, ...], tuple[str, ...]] | None = None
) -> dict[str, Any]:
    """Local paths of a resolved config (or of one named source, by ``fields``) made absolute
    (URLs and Hub ids are kept)."""
    maybe, local = fields or (PATH_FIELDS, LOCAL_PATH_FIELDS)
    out = dict(data)
    for name in (*maybe, *local):
        value = out.get(name)
        if not isinstance(value, str) or not value or url_scheme(value) is not None:
            continue
        path = local_path(value)
        if name in local or path.exists():
            out[name] = os.path.abspath(path)
    for name in ("train_sources", "validation_sources"):
        if fields is None and isinstance(out.get(name), list):
            out[name] = [absolute_paths(source, SOURCE_PATH_FIELDS) for source in out[name]]
    return out


def write_config(path: Path, config: TrainConfig) -> None:
    """Save the resolved config. Local paths are made absolute; which checkpoint a run was
    resumed from, and whether that resume restarted the schedule, is not part of it (``lmctl
    resume`` finds the newest checkpoint itself); secrets (see :mod:`lmctl.secrets`) are left
    out, and named in a comment."""
    import yaml

    from lmctl.config.loader import dump_config

    data = absolute_paths({"objective": config.objective, **dump_config(config, masked=True)})
    # What one resume does: a later one starts from the newest checkpoint, and the schedule
    # a resume restarted goes on from the step recorded in its checkpoints.
    data["resume_from_checkpoint"] = None
    data["restart_schedule"] = False
    omitted = secrets.secret_keys(data)
    data = secrets.redact(data, drop=True)
    header = (
        f"# lmctl {__version__} resolved config; rerun it with:\n"
        f"#   lmctl train {config.objective} --config {CONFIG_FILE}\n"
    )
    if omitted:
        header += (
            f"# secrets not written: {', '.join(omitted)} (give them again from the "
            "environment, e.g. HF_TOKEN)\n"
        )
    atomic_write(path / CONFIG_FILE, header + yaml.safe_dump(data, sort_keys=False))
    record_written(path, CONFIG_FILE)


def restart_command(objective: str, run_dir: Path) -> str:
    """The command that starts a run again from its saved config. It writes into that same
    run only when lmctl created it (--overwrite-output-dir would be refused elsewhere), never
    into the directory the config was first written for."""
    import shlex

    config = shlex.quote(str(run_dir / CONFIG_FILE))
    if is_lmctl_run(run_dir):
        target = f"--output-dir {shlex.quote(str(run_dir))} --overwrite-output-dir"
    else:
        target = "--output-dir NEW_DIR"
    return f"lmctl train {objective} --config {config} {target}"


def run_dir_of_config(config_file: str) -> Path | None:
    """The run directory a config file belongs to: the folder of a run's own lmctl.yaml."""
    file = local_path(config_file)
    if file.name != CONFIG_FILE or not file.is_file():
        return None
    folder = file.resolve().parent
    return folder if is_lmctl_run(folder) else None


def read_config(path: Path) -> dict[str, Any]:
    from lmctl.config.loader import read_config_file

    return read_config_file(str(path / CONFIG_FILE))
