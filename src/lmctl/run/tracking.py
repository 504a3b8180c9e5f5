"""Experiment trackers, as both engines use them: the trackers checked before any work, the
project each run is logged to, and the run's settings as trackers take them."""

from __future__ import annotations

import os
from contextlib import nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.errors import ConfigError

if TYPE_CHECKING:
    from lmctl.config.slices import RunSpec

#: Tracker project of both engines (mlflow experiment, trackio project, wandb project); each
#: run is named after its run directory.
TRACKING_PROJECT = "lmctl"


def check_trackers(report_to: list[str], known: set[str], available: set[str], engine: str) -> None:
    """Refuse, before any work, a tracker the engine does not know or cannot load (an engine
    would skip it silently, or fail after training)."""
    for name in report_to:
        if name == "all":
            continue
        if name not in known:
            raise ConfigError(
                f"--report-to {name}: not a tracker {engine} knows",
                "choose from " + ", ".join(sorted(known)),
            )
        if name not in available:
            raise ConfigError(
                f"--report-to {name}: its package is not installed",
                f"pip install {name.replace('_', '-')}, or drop --report-to {name}",
            )


def tracked_hyperparameters(spec: RunSpec) -> dict[str, Any]:
    """The run's settings as trackers accept them: scalars only (lists and mappings as text),
    no secret."""
    values = {"objective": spec.objective, **spec.public_values()}
    return {
        key: value if isinstance(value, (bool, int, float, str)) else str(value)
        for key, value in values.items()
        if value is not None
    }


def mlflow_run(report_to: list[str], run_dir: Path, is_main: bool) -> Any:
    """One MLflow run around training and the final evaluation: the Trainer's callback would
    end its run with training and log the final evaluation to a second, unnamed run."""
    import importlib.util

    wanted = {"mlflow", "all"} & set(report_to)
    if not wanted or not is_main or importlib.util.find_spec("mlflow") is None:
        return nullcontext()
    import mlflow

    # The experiment is named like the accelerate engine's, unless the user chose one (the
    # callback reads the same variable).
    os.environ.setdefault("MLFLOW_EXPERIMENT_NAME", TRACKING_PROJECT)
    mlflow.set_experiment(os.environ["MLFLOW_EXPERIMENT_NAME"])
    return mlflow.start_run(run_name=run_dir.name)
