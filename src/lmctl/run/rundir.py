"""The run directory contract, shared by every engine and read back by eval and resume.

lmctl.yaml            resolved config (no secrets); `--config` accepts it as is
metrics.jsonl         one JSON object per logged step or evaluation
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
config.json, model.safetensors, tokenizer files: the final model (save_pretrained), staged
                      under a hidden .tmp-model-* folder and moved into place with its manifest
                      (lmctl_model.json, files and sizes) last
lmctl_run.json        the run marker, written first: proves that lmctl created the directory
                      and lists every entry lmctl wrote into it (--overwrite-output-dir removes
                      those and nothing else)
"""

from __future__ import annotations

import dataclasses
import json
import math
import os
import re
import shutil
import sys
import time
from collections.abc import Callable, Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl import __version__, distributed, secrets
from lmctl.console import finite, json_text
from lmctl.errors import ConfigError
from lmctl.storage import atomic
from lmctl.storage.atomic import atomic_write, manifest_problem
from lmctl.storage.paths import is_remote, local_path, url_scheme

if TYPE_CHECKING:
    from lmctl.config.base import TrainConfig
    from lmctl.objectives.base import Objective

CONFIG_FILE = "lmctl.yaml"
METRICS_LOG = "metrics.jsonl"
STATE_FILE = "trainer_state.json"
FAST_PATHS_FILE = "fast_paths.json"
CHECKPOINT_PATTERN = re.compile(r"^checkpoint-(\d+)$")
MANIFEST_FILE = "lmctl_checkpoint.json"
RUN_MARKER = "lmctl_run.json"
MODEL_MANIFEST = "lmctl_model.json"
#: The final model is staged under ``.tmp-model-<owner>`` in the run directory.
MODEL_STAGING = "model"
RUN_FORMAT = "lmctl-run/1"
#: Leftovers of lmctl's own interrupted writes: staging folders and atomic_write temp files.
_LEFTOVER = re.compile(r"^\.tmp-(checkpoint-\d+|model)-[\w.-]+$|^\.(?P<file>.+)\.tmp$")


def is_lmctl_run(path: Path) -> bool:
    """Whether lmctl created ``path`` as a run directory (its run marker is there)."""
    return (path / RUN_MARKER).is_file()


def is_remote_run(config: TrainConfig) -> bool:
    """Whether the run directory is a storage URL (written locally, then uploaded)."""
    return config.output_dir is not None and url_scheme(config.output_dir) is not None


def per_machine_copies(config: TrainConfig) -> bool:
    """Whether every machine writes its own local copy of the run: a storage URL as the run
    directory of a run on several machines (see :mod:`lmctl.mirror`)."""
    return is_remote_run(config) and distributed.nodes() > 1


def commits_checkpoints(config: TrainConfig) -> bool:
    """Whether this process renames each checkpoint into place: the main process, and with
    per-machine copies the first process of every other machine (its machine's part, which
    has no trainer state of its own: it is uploaded, never resumed from by itself)."""
    if distributed.is_main_process():
        return True
    return per_machine_copies(config) and distributed.local_rank() == 0


def local_run_dir(config: TrainConfig) -> Path:
    """The folder the run is written into: --output-dir itself, or for a storage URL its
    local copy (--staging-dir, by default a folder per URL, and machine, in the cache)."""
    assert config.output_dir is not None
    if not is_remote_run(config):
        return Path(config.output_dir)
    if config.staging_dir is not None:
        return local_path(config.staging_dir)
    from lmctl.storage.locations import run_staging_dir

    return run_staging_dir(config.output_dir, distributed.node_rank(), distributed.nodes())


def check_output_dir(config: TrainConfig) -> None:
    """Refuse to write into a non-empty directory unless asked to (before any heavy work).

    --overwrite-output-dir only ever replaces an earlier lmctl run: a directory without the run
    marker (a project folder that merely holds a file called lmctl.yaml, say) is refused.
    A remote run directory's local copy must be new or empty unless the run is resumed (what
    the bucket holds is checked by :mod:`lmctl.mirror`).
    """
    path = local_run_dir(config)
    if is_remote_run(config):
        _check_staging(config, path)
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
    if not path.exists() or not any(path.iterdir()):
        return
    if config.resume_from_checkpoint is not None:
        return
    if config.overwrite_output_dir:
        if is_lmctl_run(path):
            return
        entries = sorted(child.name for child in path.iterdir())
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


def _check_staging(config: TrainConfig, path: Path) -> None:
    url = config.output_dir
    if config.overwrite_output_dir:
        raise ConfigError(
            f"--overwrite-output-dir does not apply to a storage URL (--output-dir {url})",
            "choose a new --output-dir prefix, or delete the old run from the store first",
        )
    if path.exists() and not path.is_dir():
        raise ConfigError(
            f"--staging-dir {path}: exists and is not a directory", "choose another --staging-dir"
        )
    if config.resume_from_checkpoint is None and path.is_dir() and any(path.iterdir()):
        raise ConfigError(
            f"--output-dir {url}: its local copy {path} holds an earlier run of that URL, "
            "which may not be fully uploaded; nothing was touched",
            f"continue it with 'lmctl resume {url}', or remove {path} (or give another "
            "--staging-dir)",
        )


def prepare_output_dir(config: TrainConfig) -> list[str]:
    """Create the run directory and its marker; with --overwrite-output-dir, remove what an
    earlier lmctl run recorded writing there. Returns the entries that were kept."""
    path = local_run_dir(config)
    kept: list[str] = []
    if config.overwrite_output_dir and config.resume_from_checkpoint is None and is_lmctl_run(path):
        kept = clear_run(path)
    path.mkdir(parents=True, exist_ok=True)
    if not is_lmctl_run(path):
        _write_marker(path, [])
    return kept


def clear_run(path: Path) -> list[str]:
    """Remove every entry the run marker lists (and lmctl's own leftovers of interrupted
    writes of those); everything else stays. Returns the names kept."""
    recorded = set(_read_marker(path)) | {RUN_MARKER}
    kept: list[str] = []
    for child in sorted(path.iterdir()):
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


def absolute_paths(data: dict[str, Any]) -> dict[str, Any]:
    """Local paths of a resolved config made absolute (URLs and Hub ids are kept)."""
    out = dict(data)
    for name in (*PATH_FIELDS, *LOCAL_PATH_FIELDS):
        value = out.get(name)
        if not isinstance(value, str) or not value or url_scheme(value) is not None:
            continue
        path = local_path(value)
        if name in LOCAL_PATH_FIELDS or path.exists():
            out[name] = os.path.abspath(path)
    return out


def write_config(path: Path, config: TrainConfig) -> None:
    """Save the resolved config. Local paths are made absolute; which checkpoint a run was
    resumed from is not part of it (``lmctl resume`` finds the newest one itself); secrets
    (see :mod:`lmctl.secrets`) are left out, and named in a comment."""
    import yaml

    from lmctl.config.loader import dump_config

    data = absolute_paths({"objective": config.objective, **dump_config(config, masked=True)})
    data["resume_from_checkpoint"] = None
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


def finished_step(path: Path) -> int | None:
    """The step at which the run last finished: its final state is beside the model and the
    ``finished`` event, written after every other file of the run, is in the metrics log (a
    run killed before that is resumed to write what is missing)."""
    try:
        step = read_checkpoint_state(path).get("global_step")
        lines = (path / METRICS_LOG).read_text(encoding="utf-8").splitlines()
    except (OSError, ValueError):
        return None
    for line in reversed(lines):
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict) and record.get("event") == "finished":
            return step if isinstance(step, int) and record.get("step") == step else None
    return None


def append_metrics(path: Path, record: dict[str, Any]) -> None:
    """One line of ``metrics.jsonl``: strict JSON (a NaN or infinity is written as null and
    its key listed under ``non_finite``)."""
    line = json_text({"time": round(time.time(), 3), **record})
    with open(path / METRICS_LOG, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
    record_written(path, METRICS_LOG)


def save_results(path: Path, split: str, metrics: dict[str, Any]) -> None:
    """``<split>_results.json`` and the merged ``all_results.json``, as the Trainer writes them."""
    clean = {key: _json_value(value) for key, value in metrics.items()}
    write_json(path / f"{split}_results.json", clean)
    all_path = path / "all_results.json"
    merged = json.loads(all_path.read_text()) if all_path.is_file() else {}
    merged.update(clean)
    write_json(all_path, merged)


def load_results(path: Path) -> dict[str, Any]:
    all_path = path / "all_results.json"
    return json.loads(all_path.read_text()) if all_path.is_file() else {}


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


def write_state(state: Any, folder: Path) -> None:
    """``trainer_state.json`` as ``TrainerState.save_to_json`` writes it, but strict JSON
    (a NaN or infinity in the log history becomes null)."""
    clean, _ = finite(dataclasses.asdict(state))
    text = json.dumps(clean, indent=2, sort_keys=True, allow_nan=False, default=str) + "\n"
    atomic_write(folder / STATE_FILE, text)
    record_written(folder, STATE_FILE)


def record_trackers(run_dir: Path, existed: bool) -> None:
    """The trackers' log folder (``runs/``), when this run created it."""
    if not existed and (run_dir / "runs").is_dir():
        record_written(run_dir, "runs")


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


def resume_checkpoint(config: TrainConfig) -> Path | None:
    """The local checkpoint a run resumes from (``auto``: the newest complete one), if any."""
    checkpoint = config.resume_from_checkpoint
    if checkpoint is None or is_remote(checkpoint):
        return None
    if checkpoint == "auto":
        return latest_checkpoint(local_run_dir(config) if config.output_dir else Path("."))
    return local_path(checkpoint)


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


def command_line() -> str:
    args = ["lmctl", *sys.argv[1:]]
    return secrets.mask_text(" ".join(_shell_quote(arg) for arg in _redact(args)))


def _redact(args: list[str]) -> list[str]:
    out: list[str] = []
    hide_next = False
    for arg in args:
        if hide_next:
            out.append("***")
            hide_next = False
        elif arg in ("--token", "--hub-token"):
            out.append(arg)
            hide_next = True
        elif arg.startswith(("--token=", "--hub-token=")):
            out.append(arg.split("=", 1)[0] + "=***")
        else:
            out.append(arg)
    return out


def _shell_quote(arg: str) -> str:
    import shlex

    return shlex.quote(arg)


def write_model_card(
    path: Path,
    *,
    config: TrainConfig,
    objective: Objective,
    results: dict[str, Any],
    engine: str,
    resumed: bool = False,
    command: str | None = None,
    versions: dict[str, str] | None = None,
) -> None:
    """Write the model card.

    ``command`` and ``versions`` describe the training run; they default to this process's
    command line and libraries (a card regenerated later keeps the original ones).
    """
    import yaml

    base_model = published_model_name(config.model_name_or_path)
    datasets = [config.dataset_name] if config.dataset_name else []
    metadata: dict[str, Any] = {
        # An adapter run publishes a peft adapter (with its merged weights in merged/).
        "library_name": "peft" if config.peft else "transformers",
        "pipeline_tag": objective.task_tag,
        "tags": ["lmctl", *objective.model_card_tags()],
    }
    if base_model:
        metadata["base_model"] = base_model
    if datasets:
        metadata["datasets"] = datasets
    lines = ["---", yaml.safe_dump(metadata, sort_keys=False).strip(), "---", ""]
    title = path.name or "model"
    lines.append(f"# {title}")
    lines.append("")
    origin = (
        f"fine-tuned from `{base_model}`"
        if base_model
        else (
            f"trained from scratch (`{config.model_type or config.config_name}`"
            + (f", overrides `{config.config_overrides}`" if config.config_overrides else "")
            + ")"
        )
    )
    data = config.dataset_name or ", ".join(
        f"`{Path(p).name}`" for p in (config.train_file, config.validation_file) if p
    )
    lines.append(
        f"A {objective.summary.lower()} model {origin} on {data or 'the given data'} "
        f"with [lmctl](https://pypi.org/project/lmctl/) {__version__} (`{engine}` engine)."
    )
    if config.peft:
        lines.append("")
        lines.append(
            f"This repository holds a LoRA adapter (r {config.lora_r}, alpha {config.lora_alpha}):"
            f" load it with `peft.PeftModel.from_pretrained(base_model, ...)`"
            + (
                "; `merged/` holds the adapter merged into full weights."
                if config.merge_adapter
                else "."
            )
        )
    if resumed:
        lines.append("")
        lines.append("Training was interrupted and resumed from a checkpoint with `lmctl resume`.")
    if results:
        lines += ["", "## Results", "", "| metric | value |", "| --- | --- |"]
        for key, value in results.items():
            lines.append(f"| {key} | {_card_value(value)} |")
    lines += [
        "",
        "## Training",
        "",
        "```",
        command or command_line(),
        "```",
        "",
        f"The full resolved configuration is in `{CONFIG_FILE}`; per-step metrics are in "
        f"`{METRICS_LOG}`.",
        "",
        "| hyperparameter | value |",
        "| --- | --- |",
    ]
    for key, value in deciding_settings(config).items():
        lines.append(f"| {key} | {value} |")
    lines += ["", "## Framework versions", ""]
    shown = versions or framework_versions()
    lines += [f"- {name} {version}" for name, version in shown.items()]
    atomic_write(path / "README.md", "\n".join(lines) + "\n")
    record_written(path, "README.md")


_HUB_ID = re.compile(r"^[A-Za-z0-9][\w.-]*(/[\w.-]+)?$")


def published_model_name(name: str | None) -> str | None:
    """How a model card names the base model: its Hub id when it came from the Hub (or when
    the local copy's config records one as ``_name_or_path``), otherwise only the folder's
    name, so that no local path is published."""
    if not name:
        return None
    if name.startswith("hf://"):
        return name.removeprefix("hf://")
    if is_remote(name):
        return name.rstrip("/").rsplit("/", 1)[-1] or None
    path = local_path(name)
    if not path.exists():
        return name if _HUB_ID.match(name) else path.name
    try:
        recorded = json.loads((path / "config.json").read_text(encoding="utf-8"))
        origin = recorded.get("_name_or_path") if isinstance(recorded, dict) else None
    except (OSError, ValueError):
        origin = None
    if isinstance(origin, str) and _HUB_ID.match(origin) and not local_path(origin).exists():
        return origin
    return path.resolve().name


def deciding_settings(config: TrainConfig) -> dict[str, Any]:
    """The hyperparameters that decided the run: the length is either the epochs or
    --max-steps (which overrides them), the warmup either a ratio or steps."""
    settings: dict[str, Any] = {
        "learning_rate": config.learning_rate,
        "per_device_train_batch_size": config.per_device_train_batch_size,
        "gradient_accumulation_steps": config.gradient_accumulation_steps,
    }
    if config.max_steps:
        settings["max_steps"] = config.max_steps
    else:
        settings["num_train_epochs"] = config.num_train_epochs
    settings["lr_scheduler_type"] = config.lr_scheduler_type
    if config.warmup_ratio is not None:
        settings["warmup_ratio"] = config.warmup_ratio
    elif config.warmup_steps:
        settings["warmup_steps"] = config.warmup_steps
    settings["weight_decay"] = config.weight_decay
    settings["seed"] = config.seed
    return settings


def framework_versions() -> dict[str, str]:
    from importlib.metadata import PackageNotFoundError, version

    out = {"lmctl": __version__}
    for name in ("transformers", "torch", "datasets", "accelerate", "tokenizers"):
        try:
            out[name] = version(name)
        except PackageNotFoundError:
            continue
    return out


def _card_value(value: Any) -> str:
    if isinstance(value, float):
        return f"{value:.4f}" if math.isfinite(value) else str(value)
    return str(value)


def _json_value(value: Any) -> Any:
    if hasattr(value, "item"):
        value = value.item()
    return value


def write_json(path: Path, data: dict[str, Any]) -> None:
    """A results file, written atomically (upstream layout: indented, sorted keys), strict
    JSON: a NaN or infinity is written as null and its key listed under ``non_finite``."""
    atomic_write(path, json_text(data, indent=4, sort_keys=True) + "\n")
    record_written(path.parent, path.name)
