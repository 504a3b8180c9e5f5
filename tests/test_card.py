"""What a run directory tells of its run, without training: the commands of its segments on
the model card, the base model as the user named it, the whole run's rates after a resume,
numbers read the same in the log, the summary and the card, and the config as published."""

from __future__ import annotations

import json
import math
import sys
from pathlib import Path

import pytest
import yaml

from lmctl.console import Console, format_number
from lmctl.metrics import loss_metrics
from lmctl.objectives.clm import ClmConfig
from lmctl.publish.files import published_config
from lmctl.run import card, history, rundir
from lmctl.run.launch import ARGUMENTS_ENV
from lmctl.run.progress import StepReporter
from lmctl.run.signals import StopRequest
from lmctl.run.totals import RunTotals, whole_run


def _run_dir(tmp_path: Path) -> Path:
    run = tmp_path / "run"
    run.mkdir()
    return run


def _finish(run: Path, step: int) -> None:
    (run / history.STATE_FILE).write_text(json.dumps({"global_step": step}))
    history.append_metrics(run, {"event": "finished", "step": step})


def test_each_segment_of_a_run_is_shown_with_its_command_and_what_it_was(
    tmp_path: Path,
) -> None:
    run = _run_dir(tmp_path)
    history.record_segment(run, "lmctl train clm --max-steps 4 -o run", None, 0)
    history.append_metrics(run, {"step": 4, "loss": 3.0})
    _finish(run, 4)
    history.record_segment(run, "lmctl resume run --max-steps 8", "checkpoint-4", 4)
    # killed after its checkpoint at step 6, then continued
    history.record_segment(run, "lmctl resume run", "checkpoint-6", 6)
    history.append_metrics(run, {"event": "restart", "restart": 1, "step": 7, "cause": "x"})

    found = history.segments(run, final_step=8)
    assert [(s.event, s.step, s.extends, s.end) for s in found] == [
        ("start", 0, False, 4),
        ("resume", 4, True, None),
        ("resume", 6, False, None),
        ("restart", 7, False, 8),
    ]
    assert card.training_commands(found) == [
        "# trained from step 0 to step 4",
        "lmctl train clm --max-steps 4 -o run",
        "# extended the finished run from step 4; interrupted",
        "lmctl resume run --max-steps 8",
        "# continued after an interruption from step 6; interrupted",
        "lmctl resume run",
        "# restarted by the elastic agent from step 7 to step 8",
    ]


def test_a_run_of_one_start_shows_its_command_alone(tmp_path: Path) -> None:
    run = _run_dir(tmp_path)
    history.record_segment(run, "lmctl train clm", None, 0)
    assert card.training_commands(history.segments(run, final_step=3)) == ["lmctl train clm"]
    # A run whose log records no command (an older lmctl) has no segments to show.
    legacy = tmp_path / "legacy"
    legacy.mkdir()
    history.append_metrics(legacy, {"event": "resume", "step": 2, "checkpoint": "checkpoint-2"})
    assert history.segments(legacy) == []


def test_the_command_is_named_lmctl_as_the_user_gave_it(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(sys, "argv", ["/home/me/.venv/bin/lmctl", "train", "clm", "--token", "t"])
    monkeypatch.delenv("RANK", raising=False)
    assert card.command_line() == "lmctl train clm --token '***'"
    # A process the launcher started for --nproc: the command the user gave, --nproc too.
    monkeypatch.setattr(sys, "argv", ["/home/me/.venv/lib/lmctl/__main__.py", "train", "clm"])
    monkeypatch.setenv("RANK", "0")
    monkeypatch.setenv("WORLD_SIZE", "2")
    monkeypatch.setenv(ARGUMENTS_ENV, "train clm --nproc 2")
    assert card.command_line() == "lmctl train clm --nproc 2"


def test_the_base_model_is_named_as_the_user_named_it(tmp_path: Path) -> None:
    local = tmp_path / "all-MiniLM-L6-v2"
    local.mkdir()
    # The copy's config remembers another model it was once loaded from.
    (local / "config.json").write_text(
        json.dumps({"_name_or_path": "nreimers/MiniLM-L6-H384-uncased"})
    )
    assert card.published_model_name(str(local)) == "all-MiniLM-L6-v2"
    assert card.published_model_name(str(tmp_path / "gone" / "model")) == "model"
    assert card.published_model_name("openai-community/gpt2") == "openai-community/gpt2"
    assert card.published_model_name("hf://org/model") == "org/model"
    assert card.published_model_name("s3://bucket/models/base/") == "base"
    assert card.published_model_name(None) is None


def test_the_rates_of_a_resumed_run_cover_the_whole_run() -> None:
    session = {
        "train_loss": 2.0,
        "train_runtime": 10.0,
        "train_samples_per_second": 8.0,
        "train_steps_per_second": 0.5,
    }
    before = RunTotals(steps=5, loss_sum=15.0, runtime=30.0)
    metrics = whole_run(session, before, global_step=10)
    assert metrics["train_runtime"] == 40.0
    assert metrics["train_loss"] == pytest.approx(2.5)
    assert metrics["train_steps_per_second"] == pytest.approx(10 / 40)
    # 16 samples per step (8/s over 10 s for 5 steps), 10 steps in 40 s
    assert metrics["train_samples_per_second"] == pytest.approx(16 * 10 / 40)
    # A checkpoint that recorded no totals: every figure is named as the segment's.
    unknown = whole_run(session, None, global_step=10)
    assert set(unknown) == {f"{key}_last_segment" for key in session}


def test_card_numbers_are_readable() -> None:
    assert card._card_value(854355129984.0) == "8.544e+11"
    assert card._card_value(5.45871) == "5.4587"
    assert card._card_value(0.0) == "0.0000"
    assert card._card_value(48) == "48"
    assert card._card_value(math.nan) == "nan"


def test_the_log_rounds_an_evaluation_as_the_summary_does(tmp_path: Path) -> None:
    class Lines(Console):
        def __init__(self) -> None:
            super().__init__()
            self.lines: list[str] = []

        def info(self, message: str) -> None:
            self.lines.append(message)

    console = Lines()
    reporter = StepReporter(console, _run_dir(tmp_path), StopRequest(), is_main=True)
    loss = 5.458712345
    reporter.log(20, 1.0, {"eval_loss": loss, "eval_accuracy": 0.0329724})
    summary = format_number(loss_metrics(loss, with_perplexity=True)["eval_loss"])
    assert summary == "5.4587"
    assert console.lines == [f"step 20: eval_loss {summary}, eval_accuracy 0.033"]


def test_the_published_config_has_no_local_paths(tmp_path: Path) -> None:
    train = tmp_path / "data" / "train.txt"
    train.parent.mkdir()
    train.write_text("some words\n")
    run = _run_dir(tmp_path)
    config = ClmConfig(
        model_type="gpt2",
        tokenizer_name="openai-community/gpt2",
        train_file=str(train),
        validation_file="s3://bucket/valid.txt",
        cache_dir=str(tmp_path / "cache"),
        output_dir=str(run),
    )
    rundir.write_config(run, config)
    saved = (run / rundir.CONFIG_FILE).read_text()
    assert str(train) in saved

    published = published_config(saved)
    assert str(tmp_path) not in published
    assert published.startswith("# lmctl ")
    data = yaml.safe_load(published)
    assert data["train_file"] == "train.txt"
    assert data["output_dir"] == "run"
    assert data["cache_dir"] is None
    assert data["validation_file"] == "s3://bucket/valid.txt"
    assert data["tokenizer_name"] == "openai-community/gpt2"
    assert {key: value for key, value in data.items() if key not in PUBLISHED_DIFFERENT} == {
        key: value for key, value in yaml.safe_load(saved).items() if key not in PUBLISHED_DIFFERENT
    }


PUBLISHED_DIFFERENT = ("train_file", "output_dir", "cache_dir")
