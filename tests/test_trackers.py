"""Experiment trackers with local back ends, on both engines: what a run logs can be read
back from the tracker (MLflow's file store, trackio's local database)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import lmctl, tiny_clm_args

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
) -> dict[str, float]:
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
        "--report-to",
        tracker,
        "--output-dir",
        out,
        cwd=out.parent,
        env=env,
    )
    assert proc.returncode == 0, proc.stderr
    results: dict[str, float] = json.loads((out / "eval_results.json").read_text())
    return results


@pytest.mark.e2e
@pytest.mark.parametrize("engine", ENGINES)
def test_mlflow_file_store(
    engine: str,
    bpe_tokenizer: Path,
    text_files: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    pytest.importorskip("mlflow")
    # mlflow 3 keeps its file store behind this switch (sqlite:// needs the full mlflow).
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    from mlflow.tracking import MlflowClient

    store = tmp_path / "mlruns"
    uri = store.as_uri()
    out = tmp_path / f"mlflow-{engine}"
    results = tiny_run(
        engine,
        "mlflow",
        bpe_tokenizer,
        text_files,
        out,
        env={"MLFLOW_TRACKING_URI": uri, "MLFLOW_ALLOW_FILE_STORE": "true"},
    )
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
@pytest.mark.parametrize("engine", ENGINES)
def test_trackio_local(
    engine: str, bpe_tokenizer: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    pytest.importorskip("trackio")
    env = {"TRACKIO_DIR": str(tmp_path / "trackio"), "HF_HUB_OFFLINE": "1"}
    out = tmp_path / f"trackio-{engine}"
    results = tiny_run(engine, "trackio", bpe_tokenizer, text_files, out, env=env)
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
