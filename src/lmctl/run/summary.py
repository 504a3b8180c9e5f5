"""What a run directory says about its run: loss curves, status and headline numbers.

Read by ``lmctl runs``, the end-of-training sparklines and ``loss.png``. Light: JSON and YAML
only. The curves come from ``metrics.jsonl``; a resumed (or restarted) run logged its steps
after the checkpoint again, and those later records replace the earlier ones.
"""

from __future__ import annotations

import json
import math
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from lmctl.console import format_number, sparkline
from lmctl.errors import LmctlError
from lmctl.metrics import perplexity
from lmctl.objectives import OBJECTIVES, get_objective
from lmctl.run import checkpoints, rundir
from lmctl.run.history import METRICS_LOG, STATE_FILE, load_results, read_records
from lmctl.run.resume import resume_command

Point = tuple[int, float]
#: Events after which a run continued from a checkpoint: ``lmctl resume``, and a restart by
#: the elastic agent (see lmctl.run.restarts).
CONTINUED = ("resume", "restart")


@dataclass
class Curves:
    """Train loss, eval loss and learning rate against the optimizer step."""

    train_loss: list[Point] = field(default_factory=list)
    eval_loss: list[Point] = field(default_factory=list)
    learning_rate: list[Point] = field(default_factory=list)
    #: The eval loss of each validation source (``eval_<name>_loss``), by source name.
    source_eval_loss: dict[str, list[Point]] = field(default_factory=dict)

    def empty(self) -> bool:
        return not (self.train_loss or self.eval_loss)


def source_names(run_dir: Path, field_name: str) -> list[str]:
    """The names of the run's ``train_sources`` or ``validation_sources`` (none when its
    config cannot be read)."""
    try:
        sources = rundir.read_config(run_dir).get(field_name) or []
    except LmctlError:
        return []
    return [str(source["name"]) for source in sources if isinstance(source, dict)]


def read_curves(run_dir: Path) -> Curves:
    names = source_names(run_dir, "validation_sources")
    series: dict[str, dict[int, float]] = {"loss": {}, "eval_loss": {}, "learning_rate": {}}
    series.update({f"eval_{name}_loss": {} for name in names})
    for record in read_records(run_dir):
        step = record.get("step")
        if not isinstance(step, int):
            continue
        if record.get("event") in CONTINUED:
            for points in series.values():
                for later in [s for s in points if s > step]:
                    del points[later]
            continue
        for key, points in series.items():
            value = record.get(key)
            if isinstance(value, (int, float)) and math.isfinite(value):
                points[step] = float(value)
    return Curves(
        train_loss=sorted(series["loss"].items()),
        eval_loss=sorted(series["eval_loss"].items()),
        learning_rate=sorted(series["learning_rate"].items()),
        source_eval_loss={name: sorted(series[f"eval_{name}_loss"].items()) for name in names},
    )


def sparklines(run_dir: Path) -> dict[str, str]:
    """Rows for the end-of-run summary: each loss curve as a sparkline, first -> last."""
    curves = read_curves(run_dir)
    rows = {}
    each = [(f"eval loss {name}", points) for name, points in curves.source_eval_loss.items()]
    for label, points in [
        ("train loss", curves.train_loss),
        ("eval loss", curves.eval_loss),
        *each,
    ]:
        values = [value for _, value in points]
        if len(values) >= 2:
            first, last = format_number(values[0]), format_number(values[-1])
            rows[label] = f"{sparkline(values)} {first} -> {last}"
    return rows


@dataclass
class RunSummary:
    path: str
    objective: str | None
    model: str | None
    status: str
    step: int | None
    max_steps: int | None
    best_eval_loss: float | None
    final_eval_loss: float | None
    perplexity: float | None
    accuracy: float | None
    age_seconds: float
    resume_command: str | None = None
    #: Each restart by the elastic agent: its number, the step it continued from, its cause.
    restarts: list[dict[str, Any]] = field(default_factory=list)
    #: Each training source's share of the examples trained on (a finished run's).
    train_shares: dict[str, float] = field(default_factory=dict)
    #: Each validation source's latest eval loss.
    source_eval_loss: dict[str, float] = field(default_factory=dict)

    def to_json(self) -> dict[str, Any]:
        return asdict(self)


def find_runs(root: Path) -> list[Path]:
    """Run directories (with an ``lmctl.yaml``): ``root`` itself, or the folders in it."""
    if (root / rundir.CONFIG_FILE).is_file():
        return [root]
    if not root.is_dir():
        return []
    found = [child for child in root.iterdir() if (child / rundir.CONFIG_FILE).is_file()]
    return sorted(found, key=lambda path: path.name)


def _read_json(path: Path) -> dict[str, Any]:
    try:
        data = json.loads(path.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return {}
    return data if isinstance(data, dict) else {}


def _model_name(config: dict[str, Any]) -> str | None:
    """The model a run started from: a Hub id or URL as given, a local folder by its parent
    and its name (runs from ``a/model`` and ``b/model`` differ, and no long path is shown)."""
    name = config.get("model_name_or_path")
    if isinstance(name, str):
        path = Path(name)
        if not path.is_absolute():
            return name
        return "/".join(part for part in (path.parent.name, path.name) if part)
    kind = config.get("model_type") or config.get("config_name")
    return f"{kind} (from scratch)" if kind else None


def summarize(run_dir: Path, now: float | None = None) -> RunSummary:
    try:
        config = rundir.read_config(run_dir)
    except LmctlError:
        config = {}
    objective = config.get("objective") if config.get("objective") in OBJECTIVES else None
    state = _read_json(run_dir / STATE_FILE)
    checkpoint = checkpoints.latest_checkpoint(run_dir)
    checkpoint_step = checkpoints.checkpoint_step(checkpoint) if checkpoint else None
    records = read_records(run_dir)
    failed = next((r for r in reversed(records) if r.get("event") in ("failed", *CONTINUED)), None)
    results = load_results(run_dir)
    finished_step = state.get("global_step")
    step: int | None
    if (
        results
        and isinstance(finished_step, int)
        and (checkpoint_step is None or finished_step >= checkpoint_step)
    ):
        status, step, max_steps = "finished", finished_step, state.get("max_steps")
    elif failed is not None and failed.get("event") == "failed":
        status, step, max_steps = f"failed at step {failed.get('step')}", failed.get("step"), None
    elif checkpoint is not None:
        saved = _read_json(checkpoint / STATE_FILE)
        status, step = f"interrupted at step {checkpoint_step}", checkpoint_step
        max_steps = saved.get("max_steps")
    else:
        status, step, max_steps = "failed", None, None
    curves = read_curves(run_dir)
    evals = [value for _, value in curves.eval_loss]
    final = results.get("eval_loss") if status == "finished" else None
    if not isinstance(final, (int, float)):
        final = evals[-1] if evals else None
    ppl = results.get("perplexity") if status == "finished" else None
    accuracy = results.get("eval_accuracy") if status == "finished" else None
    if accuracy is None:
        last_eval = next((r for r in reversed(records) if "eval_accuracy" in r), None)
        accuracy = last_eval.get("eval_accuracy") if last_eval else None
    reports_perplexity = objective is not None and get_objective(objective).reports_perplexity
    if ppl is None and final is not None and reports_perplexity:
        ppl = perplexity(final)
    times = [
        path.stat().st_mtime
        for path in (run_dir / METRICS_LOG, run_dir / rundir.CONFIG_FILE)
        if path.exists()
    ]
    age = (now if now is not None else time.time()) - max(times, default=0.0)
    interrupted = status.startswith("interrupted")
    return RunSummary(
        path=str(run_dir),
        objective=objective,
        model=_model_name(config),
        status=status,
        step=step,
        max_steps=max_steps if isinstance(max_steps, int) and max_steps > 0 else None,
        best_eval_loss=min(evals) if evals else final,
        final_eval_loss=final,
        perplexity=ppl,
        accuracy=accuracy,
        age_seconds=round(age, 1),
        resume_command=resume_command(run_dir) if interrupted else None,
        restarts=[
            {
                key: record[key]
                for key in ("restart", "step", "cause", "processes", "processes_before")
                if key in record
            }
            for record in records
            if record.get("event") == "restart"
        ],
        train_shares={
            name: results[f"train_{name}_share"]
            for name in source_names(run_dir, "train_sources")
            if isinstance(results.get(f"train_{name}_share"), (int, float))
        },
        source_eval_loss={
            name: points[-1][1] for name, points in curves.source_eval_loss.items() if points
        },
    )


def format_age(seconds: float) -> str:
    for unit, size in (("d", 86400), ("h", 3600), ("m", 60)):
        if seconds >= size:
            return f"{int(seconds // size)}{unit}"
    return f"{int(seconds)}s"
