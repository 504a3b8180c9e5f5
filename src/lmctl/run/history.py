"""What a run records as it goes: ``metrics.jsonl``, the ``*_results.json`` files and the
trainer state, each noted in the run marker (:func:`lmctl.run.rundir.record_written`).

``metrics.jsonl`` also holds the run's segments: the command that started it (a ``start``
event), each ``lmctl resume`` (a ``resume`` event, with its command and whether it extended
a finished run) and each restart by the elastic agent (a ``restart`` event), so that the
model card can tell how the run came to be."""

from __future__ import annotations

import dataclasses
import json
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmctl.console import finite, json_text
from lmctl.run.rundir import record_written
from lmctl.storage.atomic import atomic_write

METRICS_LOG = "metrics.jsonl"
STATE_FILE = "trainer_state.json"
FAST_PATHS_FILE = "fast_paths.json"


def finished_step(path: Path) -> int | None:
    """The step at which the run last finished: its final state is beside the model and the
    ``finished`` event, written after every other file of the run, is in the metrics log (a
    run killed before that is resumed to write what is missing)."""
    try:
        step = json.loads((path / STATE_FILE).read_text()).get("global_step")
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


def read_records(run_dir: Path) -> list[dict[str, Any]]:
    """The records of ``metrics.jsonl`` (a line cut short by a kill is skipped)."""
    path = run_dir / METRICS_LOG
    records: list[dict[str, Any]] = []
    try:
        lines = path.read_text(encoding="utf-8").splitlines()
    except (FileNotFoundError, UnicodeDecodeError):
        return records
    for line in lines:
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if isinstance(record, dict):
            records.append(record)
    return records


@dataclass(frozen=True)
class Segment:
    """One stretch of a run's training, from its start (or a continuation) to its end."""

    #: ``start``, ``resume`` or ``restart`` (by the elastic agent).
    event: str
    #: The step it continued from (0 for the start).
    step: int
    #: The command that started it (None for a restart: the agent runs the same command
    #: again).
    command: str | None
    #: A resume of a run that had finished (with a longer target).
    extends: bool
    #: The step at which it finished; None when it was interrupted (or is still running).
    end: int | None


def record_segment(run_dir: Path, command: str, checkpoint: str | None, step: int) -> None:
    """A ``start`` event for a run started afresh, or a ``resume`` event for one continued
    from ``checkpoint`` (at ``step``); either with the command that started it."""
    if checkpoint is None:
        append_metrics(run_dir, {"event": "start", "step": 0, "command": command})
        return
    record: dict[str, Any] = {"event": "resume", "step": step, "checkpoint": checkpoint}
    if finished_step(run_dir) == step:
        record["extends"] = True
    append_metrics(run_dir, {**record, "command": command})


def segments(run_dir: Path, final_step: int | None = None) -> list[Segment]:
    """The run's segments as ``metrics.jsonl`` records them, oldest first; ``final_step``:
    where the last one finishes, when its ``finished`` event is not written yet. Empty for a
    run whose log records no command (written by an older lmctl)."""
    found: list[Segment] = []
    for record in read_records(run_dir):
        event, step = record.get("event"), record.get("step")
        if event == "finished" and found and isinstance(step, int):
            found[-1] = dataclasses.replace(found[-1], end=step)
        elif event in ("start", "resume", "restart") and isinstance(step, int):
            command = record.get("command")
            found.append(
                Segment(
                    str(event),
                    step,
                    command if isinstance(command, str) else None,
                    bool(record.get("extends")),
                    None,
                )
            )
    if not any(segment.command for segment in found):
        return []
    if final_step is not None and found:
        found[-1] = dataclasses.replace(found[-1], end=final_step)
    return found


def append_metrics(path: Path, record: dict[str, Any]) -> None:
    """One line of ``metrics.jsonl``: strict JSON (a NaN or infinity is written as null and
    its key listed under ``non_finite``)."""
    line = json_text({"time": round(time.time(), 3), **record})
    with open(path / METRICS_LOG, "a", encoding="utf-8") as handle:
        handle.write(line + "\n")
    record_written(path, METRICS_LOG)


def save_results(path: Path, split: str, metrics: dict[str, Any]) -> None:
    """``<split>_results.json`` and the merged ``all_results.json``, as the Trainer writes them."""
    clean = {
        key: value.item() if hasattr(value, "item") else value for key, value in metrics.items()
    }
    write_json(path / f"{split}_results.json", clean)
    all_path = path / "all_results.json"
    merged = json.loads(all_path.read_text()) if all_path.is_file() else {}
    merged.update(clean)
    write_json(all_path, merged)


def load_results(path: Path) -> dict[str, Any]:
    all_path = path / "all_results.json"
    return json.loads(all_path.read_text()) if all_path.is_file() else {}


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


def write_json(path: Path, data: dict[str, Any]) -> None:
    """A results file, written atomically (upstream layout: indented, sorted keys), strict
    JSON: a NaN or infinity is written as null and its key listed under ``non_finite``."""
    atomic_write(path, json_text(data, indent=4, sort_keys=True) + "\n")
    record_written(path.parent, path.name)
