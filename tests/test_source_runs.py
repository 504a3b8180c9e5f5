"""A run with named sources in ``lmctl runs``, the end-of-run sparklines and ``loss.png``: the
share of each training source trained on and each validation source's eval loss."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lmctl.console import Console, OutputOptions
from lmctl.run import plots
from lmctl.run.summary import read_curves, sparklines, summarize
from tests.conftest import lmctl

RECORDS = [
    {"step": 2, "loss": 3.0, "learning_rate": 0.1},
    {"step": 2, "eval_loss": 2.9, "eval_web_loss": 2.8},
    {"step": 2, "eval_code_loss": 3.1},
    {"step": 3, "loss": 2.9, "eval_web_loss": 9.9},  # replaced by the resumed run's step 3
    {"event": "resume", "step": 2},
    {"step": 3, "loss": 2.5},
    {"step": 4, "loss": 2.0, "eval_loss": 2.4, "eval_web_loss": 2.2, "eval_code_loss": 2.6},
]


@pytest.fixture
def run(tmp_path: Path) -> Path:
    folder = tmp_path / "runs" / "mixture"
    folder.mkdir(parents=True)
    config = {
        "objective": "clm",
        "model_type": "gpt2",
        "train_sources": [
            {"name": "web", "file": "web.txt", "weight": 0.7},
            {"name": "code", "file": "code.txt", "weight": 0.3},
        ],
        "validation_sources": [
            {"name": "web", "file": "web-valid.txt"},
            {"name": "code", "file": "code-valid.txt"},
        ],
    }
    (folder / "lmctl.yaml").write_text(json.dumps(config))
    (folder / "metrics.jsonl").write_text("".join(json.dumps(r) + "\n" for r in RECORDS))
    results = {"eval_loss": 2.4, "train_web_share": 0.6932, "train_code_share": 0.3068}
    (folder / "all_results.json").write_text(json.dumps(results))
    (folder / "trainer_state.json").write_text(json.dumps({"global_step": 4, "max_steps": 4}))
    return folder


def test_curves_and_summary_of_each_source(run: Path) -> None:
    curves = read_curves(run)
    assert curves.source_eval_loss == {"web": [(2, 2.8), (4, 2.2)], "code": [(2, 3.1), (4, 2.6)]}
    assert "eval loss web" in sparklines(run) and "eval loss code" in sparklines(run)
    summary = summarize(run)
    assert summary.train_shares == {"web": 0.6932, "code": 0.3068}
    assert summary.source_eval_loss == {"web": 2.2, "code": 2.6}


def test_runs_shows_the_sources(run: Path) -> None:
    proc = lmctl("runs", run.parent)
    assert proc.returncode == 0, proc.stderr
    assert "mixture: trained on web 69.3%, code 30.7%; eval loss web 2.2, code 2.6" in proc.stdout
    proc = lmctl("runs", run.parent, "--json")
    (shown,) = json.loads(proc.stdout)["runs"]
    assert shown["train_shares"] == {"web": 0.6932, "code": 0.3068}
    assert shown["source_eval_loss"] == {"web": 2.2, "code": 2.6}


def test_the_loss_plot_draws_each_source(run: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    pytest.importorskip("matplotlib")
    from matplotlib.axes import Axes

    labels: list[str] = []
    legend = Axes.legend

    def recorded(self: Axes, *args: Any, **kwargs: Any) -> Any:
        labels.extend(self.get_legend_handles_labels()[1])
        return legend(self, *args, **kwargs)

    monkeypatch.setattr(Axes, "legend", recorded)
    path = plots.write_loss_plot(run, Console(OutputOptions(no_progress=True)))
    assert path is not None and path.read_bytes().startswith(b"\x89PNG")
    assert labels == ["train loss", "eval loss", "eval loss web", "eval loss code"]
