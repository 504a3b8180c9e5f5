"""Experiment trackers, as both engines use them: the trackers checked before any work, the
project each run is logged to, and the run's settings as trackers take them."""

from __future__ import annotations

import importlib.util
import os
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.errors import ConfigError, LmctlError, PermissionDenied

if TYPE_CHECKING:
    from lmctl.config.slices import RunSpec
    from lmctl.console import Console

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


#: The trackers lmctl ships an extra for, each with the setting that says where it logs.
LOCAL_TRACKERS = {
    "mlflow": "MLFLOW_TRACKING_URI",
    "tensorboard": "TENSORBOARD_LOGGING_DIR",
    "trackio": "TRACKIO_DIR",
}

#: What decides where (or whether) a tracker logs, named when it cannot start; the packages
#: whose code in a traceback identifies it.
TRACKER_SETTINGS: dict[str, tuple[str, tuple[str, ...]]] = {
    "mlflow": (
        "set MLFLOW_TRACKING_URI to a store mlflow-skinny can write (file:PATH, with "
        "MLFLOW_ALLOW_FILE_STORE=true, or http://SERVER), or unset it for the file store "
        "beside the run",
        ("mlflow",),
    ),
    "tensorboard": (
        "make the run directory's runs/ folder writable (or TENSORBOARD_LOGGING_DIR, where set)",
        ("tensorboard", "tensorboardX", "torch.utils.tensorboard"),
    ),
    "trackio": (
        "set TRACKIO_DIR to a writable folder, and unset TRACKIO_SPACE_ID and "
        "TRACKIO_SERVER_URL to log locally",
        ("trackio",),
    ),
    "wandb": ("run wandb login, or set WANDB_MODE=offline", ("wandb",)),
    "comet_ml": ("set COMET_API_KEY, or COMET_MODE=offline", ("comet_ml",)),
    "clearml": ("run clearml-init, or set the CLEARML_* credentials", ("clearml",)),
    "aim": ("set the Aim repository (AIM_REPO) to a writable folder", ("aim",)),
    "dvclive": ("run lmctl inside a DVC repository, or drop dvclive", ("dvclive",)),
    "swanlab": ("run swanlab login, or set SWANLAB_MODE=local", ("swanlab",)),
}


def _named(report_to: list[str]) -> list[str]:
    """The trackers of lmctl's extras a run logs to ("all": those installed)."""
    if "all" in report_to:
        return [name for name in LOCAL_TRACKERS if importlib.util.find_spec(name) is not None]
    return [name for name in LOCAL_TRACKERS if name in report_to]


def default_stores(
    report_to: list[str], run_dir: Path, engine: str, console: Console | None
) -> None:
    """Give each tracker of lmctl's extras a local store its extra can write when the
    environment names none, and say where each logs (``console``: the main process's).

    MLflow's own default is a sqlite database, which needs the full ``mlflow``; the
    ``mlflow-skinny`` of the extra writes a file store, kept beside the run directory so that
    runs started side by side land in one store."""
    for name in _named(report_to):
        setting = LOCAL_TRACKERS[name]
        chosen = os.environ.get(setting)
        if name == "mlflow" and not chosen:
            os.environ[setting] = (run_dir.resolve().parent / "mlruns").as_uri()
            os.environ.setdefault("MLFLOW_ALLOW_FILE_STORE", "true")
        if console is not None:
            console.info(_where(name, chosen, run_dir, engine))


def _where(name: str, chosen: str | None, run_dir: Path, engine: str) -> str:
    """One line: where ``name`` logs this run, and how to look at it."""
    setting = LOCAL_TRACKERS[name]
    if name == "mlflow":
        uri = os.environ[setting]
        return (
            f"mlflow: experiment {os.environ.get('MLFLOW_EXPERIMENT_NAME', TRACKING_PROJECT)} in "
            f"{uri} ({setting if chosen else 'by default; set ' + setting + ' to change'})"
        )
    if name == "tensorboard":
        folder = chosen if chosen and engine == "trainer" else str(run_dir / "runs")
        return f"tensorboard: events in {folder}; see them with: tensorboard --logdir {folder}"
    remote = os.environ.get("TRACKIO_SPACE_ID") or os.environ.get("TRACKIO_SERVER_URL")
    if remote:
        return f"trackio: project {TRACKING_PROJECT} on {remote}"
    from huggingface_hub.constants import HF_HOME

    folder = chosen or str(Path(HF_HOME) / "trackio")
    return (
        f"trackio: project {TRACKING_PROJECT} in {folder} "
        f"({setting if chosen else 'by default; set ' + setting + ' to change'}); "
        f"see it with: trackio show --project {TRACKING_PROJECT}"
    )


@contextmanager
def tracker_failures() -> Iterator[None]:
    """A tracker that fails (to start, mostly: a store it cannot write, missing credentials)
    is the user's setting to fix, named with the tracker, not an unexpected error."""
    try:
        yield
    except LmctlError:
        raise
    except Exception as exc:
        name = _failing_tracker(exc)
        if name is None:
            raise
        error = PermissionDenied if isinstance(exc, PermissionError) else ConfigError
        raise error(
            f"--report-to {name}: the tracker failed: {type(exc).__name__}: {str(exc).strip()}",
            TRACKER_SETTINGS[name][0] + f"; or drop --report-to {name}",
        ) from exc


def _failing_tracker(exc: BaseException) -> str | None:
    """The tracker whose code raised ``exc`` (or the error it arose from): the innermost
    frame of a tracker's package."""
    found = None
    seen: BaseException | None = exc
    while seen is not None and found is None:
        frame = seen.__traceback__
        while frame is not None:
            module = str(frame.tb_frame.f_globals.get("__name__", ""))
            for name, (_, packages) in TRACKER_SETTINGS.items():
                if any(module == p or module.startswith(p + ".") for p in packages):
                    found = name
            frame = frame.tb_next
        seen = seen.__cause__ or seen.__context__
    return found


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
    wanted = {"mlflow", "all"} & set(report_to)
    if not wanted or not is_main or importlib.util.find_spec("mlflow") is None:
        return nullcontext()
    import mlflow

    # The experiment is named like the accelerate engine's, unless the user chose one (the
    # callback reads the same variable).
    os.environ.setdefault("MLFLOW_EXPERIMENT_NAME", TRACKING_PROJECT)
    mlflow.set_experiment(os.environ["MLFLOW_EXPERIMENT_NAME"])
    return mlflow.start_run(run_name=run_dir.name)
