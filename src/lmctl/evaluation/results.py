"""Where the results of ``lmctl eval`` go: a file named by ``--output``, or the run's own
``eval_results.json`` (only when it has none yet, or with ``--overwrite-results``), and the
run's metrics log and loss plot."""

from __future__ import annotations

import json
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.errors import ConfigError
from lmctl.evaluation.target import RESULTS_FILE, Target
from lmctl.run import checkpoints, history, rundir
from lmctl.run.plots import write_loss_plot
from lmctl.storage.paths import is_remote

if TYPE_CHECKING:
    from lmctl.console import Console


def results_destination(
    target: Target, output: str | None, overwrite: bool, console: Console
) -> Path | None:
    """Where results will be written (None: nowhere). Decided before any heavy work."""
    if output is not None:
        file = Path(output).expanduser()
        if file.is_dir():
            raise ConfigError(f"--output {output}: is a directory", "give a file name")
        if not file.parent.is_dir():
            raise ConfigError(
                f"--output {output}: no such directory {file.parent}", "create it first"
            )
        if file.exists():
            console.warn(f"--output {output}: replacing the existing file")
        return file
    if target.results_dir is None:
        what = "a remote model" if is_remote(target.path) else "a bare model directory"
        console.info(f"{what}: results are not saved (give --output FILE)")
        return None
    existing = target.results_dir / RESULTS_FILE
    if existing.exists() and not overwrite:
        # Re-evaluating a finished run is the common case: its results go to stdout only.
        console.info(
            f"{existing} exists: keeping it, results on stdout only (give "
            "--overwrite-results to replace it, or --output FILE)"
        )
        return None
    if existing.exists():
        console.warn(f"replacing {existing} (--overwrite-results)")
    return existing


def save(target: Target, destination: Path, metrics: dict[str, Any]) -> None:
    own = target.results_dir / RESULTS_FILE if target.results_dir is not None else None
    if target.kind == "run" and destination == own:
        # The run's own results: all_results.json gets the eval keys, its train keys stay.
        history.save_results(destination.parent, "eval", metrics)
    else:
        history.write_json(destination, metrics)


def record_in_run(target: Target, metrics: dict[str, Any], console: Console) -> None:
    """An evaluation of a run's weights on its own data joins the run's metrics log, and its
    loss.png is redrawn with it."""
    weights = Path(target.weights)
    if target.kind == "model" or not weights.is_dir():
        return
    is_checkpoint = checkpoints.CHECKPOINT_PATTERN.match(weights.name) is not None
    run_dir = weights.parent if is_checkpoint else weights
    if not (run_dir / rundir.CONFIG_FILE).is_file():
        return
    if is_checkpoint:
        step = checkpoints.checkpoint_step(weights)
    else:
        try:
            step = int(json.loads((run_dir / history.STATE_FILE).read_text())["global_step"])
        except (OSError, ValueError, KeyError, TypeError):
            return
    history.append_metrics(run_dir, {"event": "eval", "step": step, **metrics})
    write_loss_plot(run_dir, console)
