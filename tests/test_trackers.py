"""Experiment trackers with local back ends, on both engines: what a run logs can be read
back from the tracker (MLflow's file store, trackio's local database). Trackers run at their
defaults: no test sets where a tracker logs (the environment's own settings are removed)."""

from __future__ import annotations

import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmctl.console import Console, OutputOptions
from lmctl.errors import ConfigError
from lmctl.run.tracking import default_stores, tracker_failures
from tests.conftest import lmctl, slow_except, tiny_clm_args

#: What users set to choose where trackers log; every test here runs without them.
TRACKER_VARIABLES = (
    "MLFLOW_TRACKING_URI",
    "MLFLOW_REGISTRY_URI",
    "MLFLOW_ALLOW_FILE_STORE",
    "MLFLOW_EXPERIMENT_NAME",
    "TENSORBOARD_LOGGING_DIR",
    "TRACKIO_DIR",
    "TRACKIO_SPACE_ID",
    "TRACKIO_SERVER_URL",
)


@pytest.fixture(autouse=True)
def no_tracker_settings(monkeypatch: pytest.MonkeyPatch) -> None:
    for name in TRACKER_VARIABLES:
        # Set first, so that the deletion is recorded and what a test sets is undone.
        monkeypatch.setenv(name, "")
        monkeypatch.delenv(name)


ENGINES = ("trainer", "accelerate")
#: The eval loss key each engine logs to a tracker.
EVAL_KEY = {"trainer": "eval_loss", "accelerate": "eval/loss"}
TRAIN_KEY = {"trainer": "loss", "accelerate": "train/loss"}


def tiny_run(
    engine: str,
    tracker: str,
    tokenizer: Path,
    data: tuple[Path, Path],
    out: Path,
    *,
    env: dict[str, str],
    track: tuple[str, ...] | None = None,
) -> tuple[dict[str, float], str]:
    """Train with ``--report-to tracker`` (or the flags ``track``); the eval results and the
    log."""
    args = tiny_clm_args(
        tokenizer,
        data,
        "--max-train-samples",
        "64",
        "--max-eval-samples",
        "8",
        "--per-device-train-batch-size",
        "4",
        block_size=32,
        steps=4,
    )
    proc = lmctl(
        *args,
        "--logging-steps",
        "1",
        "--save-strategy",
        "no",
        "--engine",
        engine,
        *(track or ("--report-to", tracker)),
        "--output-dir",
        out,
        cwd=out.parent,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    results: dict[str, float] = json.loads((out / "eval_results.json").read_text())
    return results, proc.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("engine", slow_except(ENGINES, "trainer"))
def test_mlflow_file_store(
    engine: str,
    bpe_tokenizer: Path,
    text_files: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("mlflow")
    from mlflow.tracking import MlflowClient

    # No MLflow variable: the run logs to a file store beside its run directory.
    out = tmp_path / f"mlflow-{engine}"
    uri = (tmp_path / "mlruns").as_uri()
    results, log = tiny_run(engine, "mlflow", bpe_tokenizer, text_files, out, env={})
    assert f"mlflow: experiment lmctl in {uri} (by default; set MLFLOW_TRACKING_URI" in log
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")  # to read the file store back
    client = MlflowClient(tracking_uri=uri)
    experiment = client.get_experiment_by_name("lmctl")
    assert experiment is not None
    runs = client.search_runs(
        [experiment.experiment_id], filter_string=f"tags.mlflow.runName = '{out.name}'"
    )
    assert len(runs) == 1
    run_id = runs[0].info.run_id
    train_loss = client.get_metric_history(run_id, TRAIN_KEY[engine])
    assert [m.step for m in train_loss] == [1, 2, 3, 4]
    eval_loss = client.get_metric_history(run_id, EVAL_KEY[engine])
    assert eval_loss[-1].value == pytest.approx(results["eval_loss"], rel=1e-5)


READ_TRACKIO = """
import json, sys
from trackio.sqlite_storage import SQLiteStorage
print(json.dumps(SQLiteStorage.get_logs(sys.argv[1], sys.argv[2]), default=str))
"""


@pytest.mark.e2e
@pytest.mark.parametrize("engine", slow_except(ENGINES, "trainer"))
def test_trackio_local(
    engine: str, bpe_tokenizer: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    pytest.importorskip("trackio")
    # trackio's default store: HF_HOME/trackio (HF_HOME is the test session's); offline, so
    # that it never looks for a Space.
    env = {"HF_HUB_OFFLINE": "1"}
    out = tmp_path / f"trackio-{engine}"
    results, log = tiny_run(engine, "trackio", bpe_tokenizer, text_files, out, env=env)
    store = Path(os.environ["HF_HOME"]) / "trackio"
    assert f"trackio: project lmctl in {store} (by default; set TRACKIO_DIR" in log
    proc = subprocess.run(
        [sys.executable, "-c", READ_TRACKIO, "lmctl", out.name],
        capture_output=True,
        text=True,
        env={**os.environ, **env},
        check=True,
    )
    logs = json.loads(proc.stdout.strip().splitlines()[-1])
    train = [row for row in logs if "train/loss" in row]
    assert len(train) == 4
    evals = [row[key] for row in logs for key in ("eval/loss", "eval_loss") if key in row]
    assert evals and evals[-1] == pytest.approx(results["eval_loss"], rel=1e-5)


@pytest.mark.e2e
@pytest.mark.faults
def test_with_tracking_at_defaults(
    bpe_tokenizer: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    """Upstream's no_trainer spelling logs to every installed tracker, none of them set up:
    each says where it logs, and the run succeeds."""
    out = tmp_path / "tracked"
    env = {"HF_HUB_OFFLINE": "1", "HF_HOME": str(tmp_path / "hf")}
    results, log = tiny_run(
        "accelerate", "all", bpe_tokenizer, text_files, out, env=env, track=("--with_tracking",)
    )
    assert results["eval_loss"] > 0
    installed = [n for n in ("mlflow", "tensorboard", "trackio") if importlib.util.find_spec(n)]
    for name in installed:
        assert f"INFO  {name}: " in log
    if "tensorboard" in installed:
        assert list((out / "runs").rglob("events.out.tfevents.*"))
    if "mlflow" in installed:
        assert (tmp_path / "mlruns").is_dir()


def test_default_mlflow_store_beside_the_run(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unit: no MLFLOW_TRACKING_URI becomes a file store beside the run directory (what
    mlflow-skinny can write), said in one line; a chosen store is kept."""
    run_dir = tmp_path / "runs" / "a"
    console = Console(OutputOptions(no_progress=True))
    default_stores(["mlflow"], run_dir, "trainer", console)
    uri = (tmp_path / "runs" / "mlruns").as_uri()
    assert os.environ["MLFLOW_TRACKING_URI"] == uri
    assert os.environ["MLFLOW_ALLOW_FILE_STORE"] == "true"
    lines = capsys.readouterr().err.splitlines()
    assert len(lines) == 1 and f"mlflow: experiment lmctl in {uri}" in lines[0]

    monkeypatch.setenv("MLFLOW_TRACKING_URI", "http://tracking.example:5000")
    default_stores(["tensorboard", "mlflow"], run_dir, "trainer", None)
    assert os.environ["MLFLOW_TRACKING_URI"] == "http://tracking.example:5000"


def test_tracker_that_cannot_start_is_a_config_error() -> None:
    """Unit: an error raised in a tracker's code names the tracker and its setting (exit 2),
    an error from elsewhere is left alone."""
    pytest.importorskip("mlflow")
    import mlflow

    with pytest.raises(ConfigError) as caught, tracker_failures():
        mlflow.set_tracking_uri("nowhere://store")
        mlflow.set_experiment("lmctl")
    assert caught.value.message.startswith("--report-to mlflow: the tracker failed")
    assert caught.value.hint is not None and "MLFLOW_TRACKING_URI" in caught.value.hint
    mlflow.set_tracking_uri(None)
    with pytest.raises(KeyError), tracker_failures():
        raise KeyError("not a tracker")
