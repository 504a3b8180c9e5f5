"""Resuming and the learning-rate schedule; checkpoints that hold the model alone.

A finished run extended with ``--max-steps`` goes on along the schedule of its new length
(the rate of step s is the one a run planned for that many steps has at s), or along a new
one with ``--restart-schedule``; ``save_only_model`` checkpoints still resume and extend.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmctl.config.loader import build_config
from lmctl.engine import ENGINES
from lmctl.engine.optim import SCHEDULE_START, schedule_start
from lmctl.errors import ConfigError
from lmctl.objectives.clm import ClmConfig
from lmctl.run import checkpoints
from tests.conftest import lmctl, slow_except, tiny_clm_args

LR = 1e-3


def _rates(run: Path) -> dict[int, float]:
    """The learning rate each step trained at, as logged (the latest record of a step)."""
    records = [json.loads(line) for line in (run / "metrics.jsonl").read_text().splitlines()]
    return {r["step"]: r["learning_rate"] for r in records if "learning_rate" in r}


def _train(tokenizer: Path, train: Path, run: Path, engine: str, *extra: str) -> None:
    args = tiny_clm_args(
        tokenizer, (train, None), "--engine", engine, "--learning-rate", str(LR),
        "--logging-steps", "1", "--no-eval", "-o", run, *extra, block_size=32,
    )  # fmt: skip
    proc = lmctl(*args)
    assert proc.returncode == 0, proc.stderr[-3000:]


def _resume(run: Path, *flags: str) -> str:
    proc = lmctl("resume", run, *flags)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc.stderr


@pytest.mark.e2e
@pytest.mark.parametrize("engine", slow_except(list(ENGINES), "trainer"))
def test_an_extended_run_goes_on_along_its_schedule_or_restarts_it(
    engine: str, bpe_tokenizer: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    _train(bpe_tokenizer, text_files[0], run, engine)  # 4 steps, linear decay to zero
    assert _rates(run)[4] == pytest.approx(LR * 1 / 4)
    _resume(run, "--max-steps", "6")
    # The schedule of a 6-step run from step 5 on (not the 4-step one's zero at step 5).
    rates = _rates(run)
    assert rates[5] == pytest.approx(LR * 2 / 6)
    assert rates[6] == pytest.approx(LR * 1 / 6)
    said = _resume(run, "--max-steps", "9", "--restart-schedule")
    assert "a new learning-rate schedule starts at step 6" in said
    # A new 3-step schedule from step 6: the full rate, then down to a third.
    rates = _rates(run)
    assert [rates[step] for step in (7, 8, 9)] == pytest.approx([LR, LR * 2 / 3, LR / 3])
    # Its checkpoints record where it started; the saved config does not restart it again.
    state = checkpoints.read_checkpoint_state(run / "checkpoint-9")
    assert state["stateful_callbacks"][SCHEDULE_START] == {"step": 6}
    assert schedule_start(run / "checkpoint-9", False, None) == 6
    assert "restart_schedule: false" in (run / "lmctl.yaml").read_text()


@pytest.mark.e2e
@pytest.mark.parametrize("engine", slow_except(list(ENGINES), "trainer"))
def test_a_model_only_checkpoint_keeps_no_optimizer_and_still_extends(
    engine: str, bpe_tokenizer: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    run = tmp_path / "run"
    only_model = ("--training-args", '{"save_only_model": true}', "--save-steps", "500")
    _train(bpe_tokenizer, text_files[0], run, engine, *only_model)
    # The checkpoint at the last step that --save-steps did not ask for: the model alone.
    checkpoint = run / "checkpoint-4"
    names = {path.name for path in checkpoint.iterdir()}
    assert "model.safetensors" in names and "config.json" in names
    assert not {name for name in names if name.startswith(("optimizer", "scheduler"))}
    assert not checkpoints.holds_training_state(checkpoint)
    said = _resume(run, "--max-steps", "6")
    assert "holds the model alone (save_only_model)" in said
    assert "new optimizer state" in said
    # The schedule goes on from the step the checkpoint is at.
    assert _rates(run)[5] == pytest.approx(LR * 2 / 6)
    assert (run / "checkpoint-6").is_dir()


def test_restart_schedule_needs_a_resumed_run(tmp_path: Path) -> None:
    train = tmp_path / "train.txt"
    train.write_text("a few words\n")
    values = {"model_type": "gpt2", "tokenizer_name": "gpt2", "train_file": str(train)}
    with pytest.raises(ConfigError) as caught:
        build_config(ClmConfig, cli_values={**values, "restart_schedule": True})
    assert "--restart-schedule applies only to a resumed run" in caught.value.message
    resumed = {**values, "restart_schedule": True, "resume_from_checkpoint": "auto"}
    assert build_config(ClmConfig, cli_values=resumed).restart_schedule
