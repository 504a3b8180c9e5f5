"""``--engine accelerate``: parity with the trainer engine, exact resume, gradient accumulation,
trackers, multi-process launch, and the loop's building blocks."""

from __future__ import annotations

import json
import math
import os
import shutil
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lmctl.config.loader import build_config
from lmctl.errors import ConfigError
from lmctl.objectives import OBJECTIVES, get_objective
from lmctl.objectives.clm import ClmConfig
from lmctl.run import checkpoints, history
from lmctl.storage import atomic
from tests import conftest
from tests.conftest import TINY_GPT2, lmctl, sliced, slow_except, without_packages

# Files only the trainer engine writes (its pickled TrainingArguments).
TRAINER_ONLY_FILES = {"training_args.bin"}

# How each objective trains a tiny model in these tests: model flags (a constant of
# tests/conftest.py), tokenizer fixture, data fixture (a train/validation pair), extra flags.
OBJECTIVE_RUNS: dict[str, tuple[str, str, str, tuple[str, ...]]] = {
    "clm": ("TINY_GPT2", "bpe_tokenizer", "text_files", ("--block-size", "64")),
    "mlm": ("TINY_BERT", "wordpiece_tokenizer", "text_files", ("--max-seq-length", "64")),
    "plm": ("TINY_XLNET", "wordpiece_tokenizer", "text_files", ("--max-seq-length", "64")),
    "swag": ("TINY_BERT", "wordpiece_tokenizer", "swag_files", ("--max-seq-length", "32")),
}

STEPS = 60


def clm_args(
    tokenizer: Path, data: tuple[Path, Path], out: Path, *extra: str, steps: int = STEPS
) -> list[str]:
    """The tiny GPT-2 run shared by the parity, resume and accumulation checks."""
    train, valid = data
    return [
        "train",
        "clm",
        *TINY_GPT2,
        "--tokenizer-name",
        str(tokenizer),
        "--train-file",
        str(train),
        "--validation-file",
        str(valid),
        "--block-size",
        "64",
        "--learning-rate",
        "2e-3",
        "--logging-steps",
        "5",
        "--max-steps",
        str(steps),
        "--output-dir",
        str(out),
        *extra,
    ]


def records(out: Path) -> list[dict[str, Any]]:
    lines = (out / history.METRICS_LOG).read_text().splitlines()
    return [json.loads(line) for line in lines if line.strip()]


def last_training_loss(out: Path) -> tuple[int, float]:
    """The step and value of the last logged training loss."""
    last = [record for record in records(out) if "loss" in record][-1]
    return last["step"], last["loss"]


def results(out: Path) -> dict[str, Any]:
    data: dict[str, Any] = json.loads((out / "all_results.json").read_text())
    return data


def run_until(
    args: list[str],
    ready: Callable[[], bool],
    sig: signal.Signals,
    cwd: Path,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    """Start ``lmctl`` and send ``sig`` as soon as ``ready()`` holds."""
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmctl", *args],
        cwd=cwd,
        env={**os.environ, "CI": "1", **(env or {})},
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if ready():
            proc.send_signal(sig)
            break
        time.sleep(0.002)
    stdout, stderr = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def logged_step(out: Path) -> int:
    """The highest step in the metrics log so far (0 before the first record)."""
    steps = [0]
    log = out / history.METRICS_LOG
    if log.is_file():
        for line in log.read_text().splitlines():
            try:
                steps.append(json.loads(line).get("step", 0))
            except ValueError:  # a line being written
                continue
    return max(steps)


@pytest.fixture(scope="module")
def uninterrupted(
    tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer: Path, text_files: tuple[Path, Path]
) -> Path:
    """60 steps of the tiny GPT-2 with a checkpoint every 10 steps, never stopped."""
    work = tmp_path_factory.mktemp("accelerate")
    out = work / "full"
    args = clm_args(bpe_tokenizer, text_files, out, "--checkpointing-steps", "10")
    proc = lmctl(*args, "--engine", "accelerate", cwd=work)
    assert proc.returncode == 0, proc.stderr
    return out


# End to end ------------------------------------------------------------------------------------
def test_every_objective_has_a_tiny_run() -> None:
    assert set(OBJECTIVES) <= set(OBJECTIVE_RUNS)


@pytest.mark.e2e
@pytest.mark.parametrize("objective", slow_except(sorted(OBJECTIVE_RUNS), "clm"))
def test_same_run_directory_and_keys_as_the_trainer_engine(
    objective: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    model_flags, tokenizer_fixture, data_fixture, extra = OBJECTIVE_RUNS[objective]
    tokenizer = request.getfixturevalue(tokenizer_fixture)
    train, valid = request.getfixturevalue(data_fixture)
    outs = {}
    for engine in ("trainer", "accelerate"):
        outs[engine] = out = tmp_path / engine
        proc = lmctl(
            "train", objective, *getattr(conftest, model_flags), "--tokenizer-name", tokenizer,
            "--train-file", train, "--validation-file", valid, *extra, "--max-steps", "4",
            "--logging-steps", "2", "--engine", engine, "--output-dir", out, cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
    trainer, accelerate = outs["trainer"], outs["accelerate"]

    def names(folder: Path) -> set[str]:
        return {path.name for path in folder.iterdir()} - TRAINER_ONLY_FILES

    assert names(accelerate) == names(trainer)
    assert "checkpoint-4" in names(accelerate)
    assert checkpoints.is_complete_checkpoint(accelerate / "checkpoint-4")
    assert set(results(accelerate)) == set(results(trainer))
    for split in ("train", "eval"):
        ours = json.loads((accelerate / f"{split}_results.json").read_text())
        theirs = json.loads((trainer / f"{split}_results.json").read_text())
        assert set(ours) == set(theirs), split

    def log_keys(out: Path) -> list[set[str]]:
        return [set(record) for record in records(out)]

    assert log_keys(accelerate) == log_keys(trainer)
    state = json.loads((accelerate / history.STATE_FILE).read_text())
    assert state["global_step"] == 4 and state["log_history"]
    auto_class = get_objective(objective).auto_model_class()
    auto_class.from_pretrained(accelerate)
    auto_class.from_pretrained(accelerate / "checkpoint-4")  # a checkpoint is a model directory
    assert "`accelerate` engine" in (accelerate / "README.md").read_text()


@pytest.mark.e2e
@pytest.mark.parametrize("objective", slow_except(["mlm", "plm", "swag"], "mlm"))  # clm: crash test
def test_resume_is_exact_with_random_collators(
    objective: str, request: pytest.FixtureRequest, tmp_path: Path
) -> None:
    """Masking and permutation collators draw the same masks after a resume."""
    model_flags, tokenizer_fixture, data_fixture, extra = OBJECTIVE_RUNS[objective]
    tokenizer = request.getfixturevalue(tokenizer_fixture)
    train, valid = request.getfixturevalue(data_fixture)

    def train_run(out: Path, *more: str) -> None:
        proc = lmctl(
            "train", objective, *getattr(conftest, model_flags), "--tokenizer-name", tokenizer,
            "--train-file", train, "--validation-file", valid, *extra, "--max-steps", "16",
            "--checkpointing-steps", "6", "--logging-steps", "4", "--learning-rate", "2e-3",
            "--engine", "accelerate", "--output-dir", out, *more, cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr

    full = tmp_path / "full"
    train_run(full)
    crashed = tmp_path / "crashed"  # what a run that died after step 6 leaves behind
    shutil.copytree(full / "checkpoint-6", crashed / "checkpoint-6")
    train_run(crashed, "--resume-from-checkpoint", "auto")
    assert last_training_loss(crashed) == pytest.approx(last_training_loss(full), abs=1e-4)
    assert results(crashed)["eval_loss"] == pytest.approx(results(full)["eval_loss"], abs=1e-4)


@pytest.mark.slow
@pytest.mark.e2e
def test_engines_agree_on_the_final_eval_loss(
    uninterrupted: Path, bpe_tokenizer: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "trainer"
    args = clm_args(bpe_tokenizer, text_files, out, "--checkpointing-steps", "10")
    proc = lmctl(*args, "--engine", "trainer", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    ours, theirs = results(uninterrupted)["eval_loss"], results(out)["eval_loss"]
    difference = abs(ours - theirs) / theirs
    print(f"final eval loss: accelerate {ours:.4f}, trainer {theirs:.4f} ({difference:.2%})")
    assert difference < 0.05
    # Same schedule and data position at every logged step.
    for key in ("learning_rate", "epoch"):
        assert [r[key] for r in records(uninterrupted) if "loss" in r] == pytest.approx(
            [r[key] for r in records(out) if "loss" in r]
        ), key
    assert sorted(path.name for path in uninterrupted.glob("checkpoint-*")) == sorted(
        path.name for path in out.glob("checkpoint-*")
    )

    # A checkpoint of the other engine is refused with a clear message.
    args = clm_args(bpe_tokenizer, text_files, tmp_path / "mixed", steps=70)
    args += ["--engine", "accelerate", "--resume-from-checkpoint", str(out / "checkpoint-60")]
    mixed = lmctl(*args, cwd=tmp_path)
    assert mixed.returncode == 2, mixed.stderr
    assert "not a checkpoint of the accelerate engine" in mixed.stderr
    assert "Traceback" not in mixed.stderr


@pytest.mark.slow
@pytest.mark.e2e
def test_resume_after_a_crash_matches_the_uninterrupted_run(
    uninterrupted: Path, bpe_tokenizer: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "crashed"
    args = [*clm_args(bpe_tokenizer, text_files, out, "--checkpointing-steps", "10")]
    args += ["--engine", "accelerate"]
    # Killed in the middle of saving checkpoint-30 (held there by the test hook), after step 25.
    staging = atomic.staging_dir(out / "checkpoint-30", owner="accelerate")
    killed = run_until(
        args,
        (staging / history.STATE_FILE).is_file,
        signal.SIGKILL,
        tmp_path,
        env={atomic.TEST_PAUSE_ENV: "checkpoint-30:120"},
    )
    assert killed.returncode == -signal.SIGKILL, killed.stderr
    assert staging.is_dir() and not (out / "checkpoint-30").exists()
    latest = checkpoints.latest_checkpoint(out)
    assert latest is not None and latest.name == "checkpoint-20"

    resumed = lmctl(*args, "--resume-from-checkpoint", "auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming from {latest}" in resumed.stderr
    state = json.loads((out / history.STATE_FILE).read_text())
    assert state["global_step"] == STEPS
    step, loss = last_training_loss(out)
    full_step, full_loss = last_training_loss(uninterrupted)
    print(f"final training loss: resumed {loss!r}, uninterrupted {full_loss!r}")
    assert step == full_step == STEPS
    assert loss == pytest.approx(full_loss, abs=1e-4)
    assert results(out)["eval_loss"] == pytest.approx(results(uninterrupted)["eval_loss"], abs=1e-4)


@pytest.mark.slow
@pytest.mark.e2e
def test_sigint_checkpoints_then_resume_continues_exactly(
    uninterrupted: Path, bpe_tokenizer: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    out = tmp_path / "stopped"
    args = [*clm_args(bpe_tokenizer, text_files, out, "--checkpointing-steps", "10")]
    args += ["--engine", "accelerate"]
    stopped = run_until(args, lambda: logged_step(out) >= 15, signal.SIGINT, tmp_path)
    assert stopped.returncode == 130, stopped.stderr
    assert "Traceback" not in stopped.stderr
    assert f"lmctl resume {out}" in stopped.stderr
    latest = checkpoints.latest_checkpoint(out)
    assert latest is not None
    step = int(latest.name.split("-")[1])
    assert 15 <= step < STEPS
    assert f"checkpoint saved at step {step}" in stopped.stderr
    state = json.loads((latest / history.STATE_FILE).read_text())
    assert state["global_step"] == step
    assert (latest / "optimizer.bin").is_file() and (latest / "random_states_0.pkl").is_file()

    resumed = lmctl(*args, "--resume-from-checkpoint", "auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert last_training_loss(out) == pytest.approx(last_training_loss(uninterrupted), abs=1e-4)


@pytest.mark.e2e
def test_gradient_accumulation_matches_a_larger_batch(
    uninterrupted: Path, bpe_tokenizer: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    """4 accumulated batches of 2 against the uninterrupted run's batch of 8."""
    out = tmp_path / "accumulated"
    args = clm_args(bpe_tokenizer, text_files, out, "--per-device-train-batch-size", "2")
    args += ["--gradient-accumulation-steps", "4", "--engine", "accelerate"]
    proc = lmctl(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    _, accumulated = last_training_loss(out)
    _, large_batch = last_training_loss(uninterrupted)
    difference = abs(accumulated - large_batch) / large_batch
    print(
        f"final training loss: 4 x 2 {accumulated:.4f}, 8 x 1 {large_batch:.4f} ({difference:.3%})"
    )
    assert difference < 0.02
    assert results(out)["eval_loss"] == pytest.approx(results(uninterrupted)["eval_loss"], rel=0.02)
    assert results(out)["num_input_tokens_seen"] == results(uninterrupted)["num_input_tokens_seen"]


@pytest.mark.e2e
def test_tensorboard_events_in_the_run_directory(
    bpe_tokenizer: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    out = tmp_path / "tracked"
    args = clm_args(bpe_tokenizer, text_files, out, "--report-to", "tensorboard", steps=6)
    proc = lmctl(*args, "--engine", "accelerate", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    events = [path for path in out.rglob("events.out.tfevents.*") if path.stat().st_size > 0]
    assert events
    tags: set[str] = set()
    for path in events:
        accumulator = EventAccumulator(str(path))
        accumulator.Reload()
        tags.update(accumulator.Tags()["scalars"])
    assert {"train/loss", "train/learning_rate", "eval/loss"} <= tags


@pytest.mark.e2e
def test_missing_tracker_package_is_a_config_error(
    bpe_tokenizer: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    args = clm_args(bpe_tokenizer, text_files, tmp_path / "out", "--report-to", "mlflow", steps=2)
    hidden = without_packages(tmp_path, "mlflow")
    proc = lmctl(*args, "--engine", "accelerate", cwd=tmp_path, env=hidden)
    assert proc.returncode == 2, proc.stderr
    assert "--report-to mlflow: its package is not installed" in proc.stderr


@pytest.mark.e2e
@pytest.mark.slow
def test_streaming_resumes_exactly_across_passes(
    bpe_tokenizer: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    """--streaming: the data position in a checkpoint is a pass over the stream and a batch
    count; a resume continues the stream exactly, also into the next pass."""
    full = tmp_path / "full"
    args = clm_args(bpe_tokenizer, text_files, full, "--streaming", steps=70)
    args += ["--checkpointing-steps", "30", "--engine", "accelerate"]
    proc = lmctl(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert results(full)["eval_samples"] > 0
    state = json.loads((full / "checkpoint-60" / history.STATE_FILE).read_text())
    assert state["stateful_callbacks"]["AccelerateDataPosition"] == {"epoch": 0, "batches_done": 60}
    epochs = [record["epoch"] for record in records(full) if "epoch" in record]
    assert epochs[-1] >= 1  # the run went on into a second pass

    crashed = tmp_path / "crashed"  # what a run that died after step 60 leaves behind
    shutil.copytree(full / "checkpoint-60", crashed / "checkpoint-60")
    args[args.index(str(full))] = str(crashed)
    resumed = lmctl(*args, "--resume-from-checkpoint", "auto", cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert last_training_loss(crashed) == pytest.approx(last_training_loss(full), abs=1e-4)


@pytest.mark.distributed
def test_two_processes_on_cpu_train_together_and_resume(
    bpe_tokenizer: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    """``torchrun --nproc_per_node 2 -m lmctl``: one run, one set of files, exact resume."""

    def launch(out: Path, *extra: str) -> subprocess.CompletedProcess[str]:
        args = clm_args(bpe_tokenizer, text_files, out, "--checkpointing-steps", "10", steps=20)
        command = [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2"]
        proc = subprocess.Popen(
            [*command, "-m", "lmctl", *args, "--engine", "accelerate", *extra],
            cwd=tmp_path,
            env={**os.environ, "CI": "1", "OMP_NUM_THREADS": "1"},
            stdout=subprocess.PIPE,
            stderr=subprocess.PIPE,
            text=True,
            start_new_session=True,
        )
        try:
            stdout, stderr = proc.communicate(timeout=300)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)  # the launcher and every process it started
            stdout, stderr = proc.communicate()
            pytest.fail(f"the two processes did not finish:\n{stderr[-3000:]}")
        return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)

    full = launch(tmp_path / "full")
    assert full.returncode == 0, full.stderr
    assert full.stderr.count("accelerate: 2 process(es)") == 1
    assert full.stdout.count("lmctl train clm:") == 1
    checkpoint = tmp_path / "full" / "checkpoint-20"
    assert {"random_states_0.pkl", "random_states_1.pkl"} <= {p.name for p in checkpoint.iterdir()}
    assert results(tmp_path / "full")["eval_samples"] > 0

    resumed_dir = tmp_path / "resumed"  # as if the run had died after step 10
    shutil.copytree(tmp_path / "full" / "checkpoint-10", resumed_dir / "checkpoint-10")
    resumed = launch(resumed_dir, "--resume-from-checkpoint", "auto")
    assert resumed.returncode == 0, resumed.stderr
    assert last_training_loss(resumed_dir) == pytest.approx(
        last_training_loss(tmp_path / "full"), abs=1e-4
    )


# Building blocks ---------------------------------------------------------------------------
def _tiny_models() -> list[Any]:
    from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel

    return [
        GPT2LMHeadModel(GPT2Config(n_layer=1, n_embd=16, n_head=2, vocab_size=50)),
        BertForMaskedLM(
            BertConfig(
                hidden_size=16,
                num_hidden_layers=1,
                num_attention_heads=2,
                intermediate_size=32,
                vocab_size=50,
            )
        ),
    ]


@pytest.mark.parametrize("index", [0, 1])
def test_no_weight_decay_on_biases_and_layernorm_weights(index: int) -> None:
    from transformers import Trainer

    from lmctl.engine.optim import parameter_groups

    model = _tiny_models()[index]
    decay, no_decay = parameter_groups(model, 0.1)
    assert (decay["weight_decay"], no_decay["weight_decay"]) == (0.1, 0.0)
    names = {id(p): name for name, p in model.named_parameters()}
    decayed = {names[id(p)] for p in decay["params"]}
    rule = set(Trainer.get_decay_parameter_names(None, model))  # type: ignore[arg-type]
    assert decayed == rule & set(names.values())  # tied weights appear once
    skipped = {names[id(p)] for p in no_decay["params"]}
    assert skipped and all("bias" in n or "ln" in n or "LayerNorm" in n for n in skipped)
    assert len(decayed) + len(skipped) == len(list(model.parameters()))


def _config(tmp_path: Path, **values: Any) -> ClmConfig:
    train = tmp_path / "t.txt"
    train.write_text("hello\n")
    base = {"model_type": "gpt2", "tokenizer_name": "x", "train_file": str(train)}
    return build_config(ClmConfig, cli_values={**base, **values})


def test_every_scheduler_type_runs(tmp_path: Path) -> None:
    import typing

    import torch

    from lmctl.config.values import SCHEDULER_KWARGS, LrScheduler
    from lmctl.engine.optim import make_scheduler

    kwargs = {"min_lr_rate": 0.1, "num_decay_steps": 3}
    for name in typing.get_args(LrScheduler):
        extra: dict[str, Any] = {"eval_strategy": "epoch"}
        if name in SCHEDULER_KWARGS:
            needed = SCHEDULER_KWARGS[name][-1]
            extra["training_args"] = {"lr_scheduler_kwargs": {needed: kwargs[needed]}}
        config = _config(tmp_path, lr_scheduler_type=name, warmup_steps=2, **extra)
        optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1e-3)
        scheduler = make_scheduler(
            sliced(config).optimizer, config.training_args, optimizer, max_steps=10
        )
        for _ in range(10):
            optimizer.step()
            if name == "reduce_lr_on_plateau":
                scheduler.step(1.0)
            else:
                scheduler.step()
        lr = optimizer.param_groups[0]["lr"]
        assert math.isfinite(lr) and 0 <= lr <= 1e-3, name


def test_warmup_ratio_counts_steps_of_the_run(tmp_path: Path) -> None:
    import torch

    from lmctl.engine.optim import make_scheduler

    config = _config(tmp_path, warmup_ratio=0.25, lr_scheduler_type="constant_with_warmup")
    optimizer = torch.optim.AdamW([torch.nn.Parameter(torch.zeros(1))], lr=1.0)
    scheduler = make_scheduler(
        sliced(config).optimizer, config.training_args, optimizer, max_steps=8
    )
    seen = []
    for _ in range(4):
        seen.append(optimizer.param_groups[0]["lr"])
        optimizer.step()
        scheduler.step()
    assert seen == [0.0, 0.5, 1.0, 1.0]


@pytest.mark.parametrize(
    "values,batches,expected",
    [
        # (max_steps, epochs, logging_steps, save_steps)
        ({"num_train_epochs": 2}, 10, (20, 2, 10, 500)),
        ({"num_train_epochs": 2, "gradient_accumulation_steps": 4}, 10, (6, 2, 10, 500)),
        ({"num_train_epochs": 0.5}, 10, (5, 1, 10, 500)),
        ({"max_steps": 25, "num_train_epochs": 1}, 10, (25, 3, 10, 500)),
        ({"max_steps": 20, "logging_steps": 0.1, "save_steps": 0.5}, 10, (20, 2, 2, 10)),
        ({"max_steps": 7}, None, (7, 2**62, 10, 500)),
    ],
)
def test_plan(
    tmp_path: Path, values: dict[str, Any], batches: int | None, expected: tuple[int, ...]
) -> None:
    from lmctl.engine.optim import make_plan

    plan = make_plan(sliced(_config(tmp_path, **values)).loop, batches)
    assert (plan.max_steps, plan.epochs, plan.logging_steps, plan.save_steps) == expected


def test_plan_needs_max_steps_without_a_length(tmp_path: Path) -> None:
    from lmctl.engine.optim import make_plan

    with pytest.raises(ConfigError, match="--max-steps"):
        make_plan(sliced(_config(tmp_path)).loop, None)


def test_position_after_an_epoch_is_the_next_epoch(tmp_path: Path) -> None:
    from lmctl.engine.optim import make_plan

    plan = make_plan(sliced(_config(tmp_path, max_steps=30)).loop, 10)
    assert plan.position_after(0, 4) == (0, 4)
    assert plan.position_after(1, 10) == (2, 0)
    assert plan.epoch_progress(1, 5) == 1.5


@pytest.mark.parametrize(
    "value,strategy,steps",
    [("10", "steps", 10), (25, "steps", 25), ("epoch", "epoch", 500), ("no", "no", 500)],
)
def test_checkpointing_steps_sets_the_save_strategy(
    tmp_path: Path, value: object, strategy: str, steps: int
) -> None:
    config = _config(tmp_path, checkpointing_steps=value)
    assert (config.save_strategy, config.save_steps) == (strategy, steps)
    assert config.checkpointing_steps is None  # said once, as save_strategy/save_steps


def test_checkpointing_steps_rejects_other_values(tmp_path: Path) -> None:
    with pytest.raises(ConfigError, match="--checkpointing-steps often"):
        _config(tmp_path, checkpointing_steps="often")


def test_no_trainer_args_file(tmp_path: Path) -> None:
    train = tmp_path / "t.txt"
    train.write_text("hello\n")
    args = {
        "model_type": "gpt2",
        "tokenizer_name": "x",
        "train_file": str(train),
        "checkpointing_steps": "epoch",
        "with_tracking": True,
        "max_train_steps": 100,
        "num_warmup_steps": 10,
        "engine": "accelerate",
    }
    path = tmp_path / "args.json"
    path.write_text(json.dumps(args))
    config = build_config(ClmConfig, cli_values={}, config_file=str(path))
    assert config.save_strategy == "epoch"
    assert config.report_to == ["all"]  # --with-tracking without --report-to: every tracker
    assert (config.max_steps, config.warmup_steps) == (100, 10)


@pytest.mark.parametrize(
    "values,needle",
    [
        ({"engine": "accelerate", "training_args": {"optim": "sgd"}}, "not used by --engine"),
        ({"lr_scheduler_type": "reduce_lr_on_plateau"}, "needs evaluations during training"),
        ({"lr_scheduler_type": "cosine_with_min_lr"}, "lr_scheduler_kwargs.min_lr"),
        ({"lr_scheduler_type": "warmup_stable_decay"}, "num_decay_steps"),
    ],
)
def test_schedule_and_engine_rules(tmp_path: Path, values: dict[str, Any], needle: str) -> None:
    with pytest.raises(ConfigError, match=needle):
        _config(tmp_path, **values)
