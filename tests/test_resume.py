"""``lmctl resume`` and crash safety: refusals, interrupted runs, killed runs, killed saves.

The exactness tests kill tiny CPU runs with SIGKILL at a random step, resume them, and require
the final weights to equal an uninterrupted run's, for every engine.
"""

from __future__ import annotations

import json
import os
import random
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmctl.engine import ENGINES
from lmctl.objectives.clm import ClmConfig
from lmctl.run import checkpoints, history, rundir
from lmctl.storage import atomic
from tests.conftest import corpus_lines, lmctl, slow_except

MAX_STEPS = 40
SAVE_STEPS = 10


# Synthetic run directories (no training): the checks resume makes before any heavy work ----


def _synthetic_run(
    tmp_path: Path, steps: tuple[int, ...] = (10, 20), max_steps: int = 20, finished: bool = False
) -> Path:
    run = tmp_path / "run"
    train = tmp_path / "train.txt"
    train.write_text("a few words\n" * 20)
    config = ClmConfig(
        model_type="gpt2",
        tokenizer_name=str(tmp_path),
        train_file=str(train),
        max_steps=max_steps,
        save_steps=SAVE_STEPS,
        output_dir=str(run),
    )
    run.mkdir()
    rundir.write_config(run, config)
    for step in steps:
        with checkpoints.atomic_dir(run / f"checkpoint-{step}") as staging:
            (staging / "model.safetensors").write_bytes(b"w" * 64)
            state = {"global_step": step, "max_steps": max_steps, "num_train_epochs": 3}
            (staging / history.STATE_FILE).write_text(json.dumps(state))
    if finished:
        (run / history.STATE_FILE).write_text(json.dumps({"global_step": steps[-1]}))
        history.append_metrics(run, {"event": "finished", "step": steps[-1]})
    return run


def _error(proc: subprocess.CompletedProcess[str]) -> str:
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    return proc.stderr


def test_non_run_directory(tmp_path: Path) -> None:
    err = _error(lmctl("resume", tmp_path))
    assert f"{tmp_path} is not an lmctl run directory (it has no lmctl.yaml)" in err


def test_missing_directory(tmp_path: Path) -> None:
    err = _error(lmctl("resume", tmp_path / "nope"))
    assert "no such directory" in err


def test_checkpoint_instead_of_run(tmp_path: Path) -> None:
    run = _synthetic_run(tmp_path)
    err = _error(lmctl("resume", run / "checkpoint-10"))
    assert "is a checkpoint, not a run directory" in err
    assert f"lmctl resume {run}" in err


def test_no_checkpoint(tmp_path: Path) -> None:
    run = _synthetic_run(tmp_path, steps=())
    err = _error(lmctl("resume", run))
    assert f"{run} has no complete checkpoint to resume from" in err
    assert "lmctl train clm --config" in err


def test_only_broken_checkpoints(tmp_path: Path) -> None:
    run = _synthetic_run(tmp_path, steps=(10,))
    (run / "checkpoint-10" / "model.safetensors").write_bytes(b"")
    err = _error(lmctl("resume", run))
    assert "skipping checkpoint-10: incomplete or corrupted" in err
    assert "no complete checkpoint" in err


@pytest.mark.parametrize(
    "flags,named",
    [
        (["--block-size", "64"], "--block-size"),
        (["--model", "gpt2"], "--model-name-or-path"),
        (["--train-file", "other.txt"], "--train-file"),
        (["--learning-rate", "0.1"], "--learning-rate"),
        (["--seed", "3"], "--seed"),
        (["--engine", "trainer"], "--engine"),
        (["--tokenizer-name", "x"], "--tokenizer-name"),
        (["--no-keep-linebreaks"], "--keep-linebreaks"),
        (["--output-dir", "elsewhere"], "--output-dir"),
    ],
)
def test_forbidden_override(tmp_path: Path, flags: list[str], named: str) -> None:
    run = _synthetic_run(tmp_path)
    err = _error(lmctl("resume", run, "--max-steps", "50", *flags))
    assert f"{named} is fixed by the run in {run} and can't be changed when resuming" in err
    assert "resume accepts only --max-steps" in err


def test_config_file_is_refused(tmp_path: Path) -> None:
    run = _synthetic_run(tmp_path)
    err = _error(lmctl("resume", run, "--config", "x.yaml"))
    assert "--config can't be given to resume" in err


def test_resumes_on_the_number_of_processes_the_checkpoint_was_saved_by(tmp_path: Path) -> None:
    run = _synthetic_run(tmp_path, steps=(10,))
    for rank in (0, 1):
        (run / "checkpoint-10" / f"rng_state_{rank}.pth").write_bytes(b"")
    plan = lmctl("resume", run, "--max-steps", "30", "--dry-run", "--json")
    assert plan.returncode == 0, plan.stderr
    assert json.loads(plan.stdout)["config"]["nproc"] == 2
    assert "checkpoint-10 was saved by 2 processes: resuming on --nproc 2" in plan.stderr
    err = _error(lmctl("resume", run, "--max-steps", "30", "--nproc", "3"))
    # A checkpoint that does not record its global batch cannot continue on another number.
    assert "--nproc 3: " in err and "was saved by 2 process(es)" in err
    assert "does not record its global batch" in err and "leave --nproc out" in err
    assert "running: " not in err


def test_skips_corrupted_newest_checkpoint(tmp_path: Path) -> None:
    run = _synthetic_run(tmp_path, steps=(10, 20), max_steps=30)
    (run / "checkpoint-20" / "model.safetensors").write_bytes(b"w" * 10)
    (run / ".tmp-checkpoint-30-trainer").mkdir()
    proc = lmctl("resume", run, "--dry-run", "--json", "--save-steps", "5")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["checkpoint"] == str(run / "checkpoint-10")
    assert result["step"] == 10
    assert result["config"]["save_steps"] == 5
    assert result["config"]["resume_from_checkpoint"] == str(run / "checkpoint-10")
    assert "skipping checkpoint-20: incomplete or corrupted (model.safetensors has 10 bytes" in (
        proc.stderr
    )
    assert "removed .tmp-checkpoint-30-trainer" in proc.stderr
    assert not (run / ".tmp-checkpoint-30-trainer").exists()


def test_finished_run_needs_a_longer_target(tmp_path: Path) -> None:
    run = _synthetic_run(tmp_path, steps=(10, 20), max_steps=20, finished=True)
    err = _error(lmctl("resume", run))
    assert "nothing to resume: the run finished at step 20 of 20" in err
    assert "--max-steps N (more than 20)" in err
    err = _error(lmctl("resume", run, "--max-steps", "15"))
    assert "--max-steps 15: the run is already at step 20" in err
    err = _error(lmctl("resume", run, "--num-train-epochs", "9"))
    assert "--num-train-epochs has no effect: the run is bounded by --max-steps 20" in err
    proc = lmctl("resume", run, "--max-steps", "30", "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["config"]["max_steps"] == 30


def test_interrupted_at_the_last_step_can_finish(tmp_path: Path) -> None:
    """A checkpoint at the last step without the final model: resume finalizes the run."""
    run = _synthetic_run(tmp_path, steps=(10, 20), max_steps=20, finished=False)
    proc = lmctl("resume", run, "--dry-run", "--json")
    assert proc.returncode == 0, proc.stderr


# Real runs ----------------------------------------------------------------------------------------


@pytest.fixture(scope="module")
def small_train_file(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """About 17 steps per epoch, so a 40-step run crosses epoch boundaries."""
    path = tmp_path_factory.mktemp("resume-data") / "train.txt"
    path.write_text("\n".join(corpus_lines()[:80]) + "\n", encoding="utf-8")
    return path


def _train_args(train_file: Path, engine: str, out: Path) -> list[str]:
    return [
        "train",
        "clm",
        "--engine",
        engine,
        "--model-type",
        "gpt2",
        "--config-overrides",
        "n_layer=2,n_embd=32,n_head=2,n_positions=64",
        "--train-tokenizer",
        "300",
        "--train-file",
        str(train_file),
        "--no-eval",
        "--block-size",
        "32",
        "--per-device-train-batch-size",
        "4",
        "--learning-rate",
        "1e-3",
        "--max-steps",
        str(MAX_STEPS),
        "--save-steps",
        str(SAVE_STEPS),
        "--logging-steps",
        "1",
        "-o",
        str(out),
    ]


def _start(args: list[str], **env: str) -> subprocess.Popen[str]:
    full_env = {**os.environ, "CI": "1", **env}
    full_env.pop("LMCTL_DEBUG", None)
    return subprocess.Popen(
        [sys.executable, "-m", "lmctl", *args],
        env=full_env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )


def _logged_step(run: Path) -> int:
    """The newest step logged since the run (re)started."""
    log = run / history.METRICS_LOG
    if not log.is_file():
        return 0
    step = 0
    for line in log.read_text().splitlines():
        try:
            record = json.loads(line)
        except ValueError:
            continue
        if record.get("event") == "resume":
            step = 0
        elif "loss" in record:
            step = max(step, int(record["step"]))
    return step


def _run_until(args: list[str], run: Path, step: int, sig: int) -> subprocess.CompletedProcess[str]:
    """Start a run and send ``sig`` once it has logged ``step``."""
    proc = _start(args)
    deadline = time.monotonic() + 300
    while proc.poll() is None and time.monotonic() < deadline:
        if _logged_step(run) >= step:
            proc.send_signal(sig)
            break
        time.sleep(0.005)
    _, err = proc.communicate(timeout=300)
    return subprocess.CompletedProcess(args, proc.returncode, "", err)


def _max_weight_diff(a: Path, b: Path) -> float:
    from safetensors.torch import load_file

    left = load_file(str(a / "model.safetensors"))
    right = load_file(str(b / "model.safetensors"))
    assert left.keys() == right.keys()
    return max(float((left[key] - right[key]).abs().max()) for key in left)


@pytest.fixture(
    scope="module",
    # The accelerate engine's interrupt and resume run in the default tier in
    # test_engine_accelerate.py; here it runs with the slow tier.
    params=slow_except(ENGINES, "trainer"),
)
def reference(
    request: pytest.FixtureRequest, small_train_file: Path, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path]:
    """An uninterrupted run, per engine."""
    engine = request.param
    out = tmp_path_factory.mktemp(f"reference-{engine}") / "run"
    proc = lmctl(*_train_args(small_train_file, engine, out))
    assert proc.returncode == 0, proc.stderr
    return engine, out


def _resume(run: Path) -> subprocess.CompletedProcess[str]:
    proc = lmctl("resume", run)
    assert proc.returncode == 0, proc.stderr
    return proc


def _interrupt(engine: str, train_file: Path, out: Path, sig: int) -> Path:
    """Interrupt a run with ``sig``: exit 130, a checkpoint, and the exact resume command."""
    proc = _run_until(_train_args(train_file, engine, out), out, 13, sig)
    assert proc.returncode == 130, proc.stderr
    assert f"interrupted by {signal.Signals(sig).name}" in proc.stderr
    assert f"continue with: lmctl resume {out}" in proc.stderr
    assert "Traceback" not in proc.stderr
    latest = checkpoints.latest_checkpoint(out)
    assert latest is not None and checkpoints.checkpoint_step(latest) >= 13, proc.stderr
    assert not (out / "model.safetensors").exists()
    return latest


@pytest.mark.e2e
def test_killed_before_the_final_save_finishes_with_the_run_totals(
    reference: tuple[str, Path], small_train_file: Path, tmp_path: Path
) -> None:
    """Killed after its last checkpoint, before the final model is committed: resume trains
    no step and writes the final model and the whole run's training results, the same as the
    uninterrupted run's."""
    engine, ref = reference
    out = tmp_path / "run"
    pause = {atomic.TEST_PAUSE_ENV: f"{checkpoints.MODEL_STAGING}:300"}
    proc = _start(_train_args(small_train_file, engine, out), **pause)
    assert proc.stderr is not None
    for line in proc.stderr:
        if f"before committing {checkpoints.MODEL_STAGING}" in line:
            break
    proc.kill()
    proc.communicate(timeout=60)
    assert (out / f"checkpoint-{MAX_STEPS}").is_dir()
    assert not (out / "train_results.json").exists()
    resumed = _resume(out)
    assert "the checkpoint was already at the last step" in resumed.stderr
    got = json.loads((out / "train_results.json").read_text())
    want = json.loads((ref / "train_results.json").read_text())
    assert got["train_loss"] == pytest.approx(want["train_loss"], rel=1e-6)
    assert got["train_samples"] == want["train_samples"]
    assert json.loads((out / "all_results.json").read_text())["train_loss"] == got["train_loss"]
    assert _max_weight_diff(ref, out) == 0.0


def test_a_second_sigterm_still_saves_a_second_ctrl_c_aborts() -> None:
    """A pre-emption reaches a process from the cluster and from its launcher: the second
    SIGTERM leaves the stop as it was; Ctrl-C twice aborts at once."""
    from lmctl.run.signals import StopRequest

    stop = StopRequest()
    stop._handle(signal.SIGTERM, None)
    stop._handle(signal.SIGTERM, None)
    assert stop.signal_name == "SIGTERM"
    with pytest.raises(KeyboardInterrupt):
        stop._handle(signal.SIGINT, None)


@pytest.mark.e2e
def test_sigterm_saves_checkpoint(
    reference: tuple[str, Path], small_train_file: Path, tmp_path: Path
) -> None:
    _interrupt(reference[0], small_train_file, tmp_path / "run", signal.SIGTERM)


@pytest.mark.e2e
def test_interrupt_saves_checkpoint_and_resume_finishes(
    reference: tuple[str, Path], small_train_file: Path, tmp_path: Path
) -> None:
    engine, ref = reference
    out = tmp_path / "run"
    latest = _interrupt(engine, small_train_file, out, signal.SIGINT)

    # intervals may change on resume without changing what is learned
    resumed = lmctl("resume", out, "--save-steps", "7", "--logging-steps", "2")
    assert resumed.returncode == 0, resumed.stderr
    assert f"resuming {out} from {latest.name}" in resumed.stderr
    assert _max_weight_diff(ref, out) < 1e-5
    start = checkpoints.checkpoint_step(latest)
    saved = {checkpoints.checkpoint_step(p) for p in checkpoints.checkpoints(out)}
    assert {s for s in saved if s > start} == {*range(7 * (start // 7 + 1), MAX_STEPS, 7), 40}
    assert _logged_step(out) == MAX_STEPS
    card = (out / "README.md").read_text()
    assert "# trained from step 0; interrupted\nlmctl train clm " in card
    assert (
        f"# continued after an interruption from step {start} to step {MAX_STEPS}\n"
        f"lmctl resume {out} --save-steps 7 --logging-steps 2\n"
    ) in card
    events = [json.loads(line) for line in (out / history.METRICS_LOG).read_text().splitlines()]
    assert {"event": "resume", "step": checkpoints.checkpoint_step(latest)}.items() <= events[
        [e.get("event") for e in events].index("resume")
    ].items()
    logged = [e["step"] for e in events[[e.get("event") for e in events].index("resume") :]]
    assert [step for step in logged[1:] if step < MAX_STEPS] == list(
        range(2 * (start // 2 + 1), MAX_STEPS, 2)
    )
    assert "train_loss" in json.loads((out / "all_results.json").read_text())

    # a finished run can be extended
    extended = lmctl("resume", out, "--max-steps", str(MAX_STEPS + 4), "--json")
    assert extended.returncode == 0, extended.stderr
    assert json.loads(extended.stdout)["global_step"] == MAX_STEPS + 4
    assert checkpoints.latest_checkpoint(out) == out / f"checkpoint-{MAX_STEPS + 4}"
    assert f"max_steps: {MAX_STEPS + 4}" in (out / rundir.CONFIG_FILE).read_text()
    extended_card = (out / "README.md").read_text()
    assert (
        f"# extended the finished run from step {MAX_STEPS} to step {MAX_STEPS + 4}\n"
        f"lmctl resume {out} --max-steps {MAX_STEPS + 4} --json\n"
    ) in extended_card


@pytest.mark.e2e
@pytest.mark.slow
def test_sigkill_then_resume_is_exact(
    reference: tuple[str, Path], small_train_file: Path, tmp_path: Path
) -> None:
    """Killed at a random step after the first checkpoint, resumed (twice in a row in the
    second trial): the final weights equal the uninterrupted run's."""
    engine, ref = reference
    seed = int(os.environ.get("LMCTL_TEST_SEED", time.time_ns() % 10**6))
    rng = random.Random(seed)
    for trial, kills in enumerate((1, 2)):
        out = tmp_path / f"trial-{trial}"
        args = _train_args(small_train_file, engine, out)
        kill_steps = sorted(rng.sample(range(SAVE_STEPS + 1, MAX_STEPS - 8), kills))
        for number, step in enumerate(kill_steps):
            command = args if number == 0 else ["resume", str(out)]
            proc = _run_until(command, out, step, signal.SIGKILL)
            assert proc.returncode == -signal.SIGKILL, (seed, step, proc.stderr)
            assert checkpoints.latest_checkpoint(out) is not None, (seed, step)
        _resume(out)
        diff = _max_weight_diff(ref, out)
        assert diff < 1e-5, f"seed {seed}, killed at {kill_steps}: max abs diff {diff}"


@pytest.mark.e2e
@pytest.mark.slow
def test_sigkill_during_checkpoint_save(
    reference: tuple[str, Path], small_train_file: Path, tmp_path: Path
) -> None:
    engine, ref = reference
    out = tmp_path / "run"
    paused = f"checkpoint-{2 * SAVE_STEPS}"
    proc = _start(
        _train_args(small_train_file, engine, out), **{atomic.TEST_PAUSE_ENV: f"{paused}:120"}
    )
    assert proc.stderr is not None
    for line in proc.stderr:
        if f"before committing {paused}" in line:
            proc.kill()
            break
    proc.wait(timeout=60)
    assert proc.returncode == -signal.SIGKILL
    assert not (out / paused).exists()
    assert any(p.name.startswith(f".tmp-{paused}") for p in out.iterdir())
    assert checkpoints.latest_checkpoint(out) == out / f"checkpoint-{SAVE_STEPS}"

    resumed = _resume(out)
    assert f"removed .tmp-{paused}" in resumed.stderr
    assert _max_weight_diff(ref, out) < 1e-5
    assert not any(p.name.startswith(".tmp-") for p in out.iterdir())


@pytest.mark.e2e
def test_save_total_limit_keeps_newest_and_best(
    small_train_file: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    """With --save-total-limit 1 and load_best_model_at_end, the Trainer alone would delete
    the newest checkpoint at the end of the run; lmctl keeps it, and the best one."""
    out = tmp_path / "run"
    config = tmp_path / "best.yaml"
    # "best" = highest eval loss, so that the best checkpoint is an early one
    config.write_text(
        "training_args:\n  load_best_model_at_end: true\n  metric_for_best_model: eval_loss\n"
        "  greater_is_better: true\n"
    )
    args = _train_args(small_train_file, "trainer", out)
    args[args.index("--no-eval")] = "--do-eval"
    args[args.index("--max-steps") + 1] = "20"
    args[args.index("--save-steps") + 1] = "5"
    args[args.index("--learning-rate") + 1] = "3e-2"
    proc = lmctl(
        *args,
        "--config",
        config,
        "--validation-file",
        text_files[1],
        "--max-eval-samples",
        "40",
        "--eval-strategy",
        "steps",
        "--eval-steps",
        "5",
        "--save-total-limit",
        "1",
    )
    assert proc.returncode == 0, proc.stderr
    state = json.loads((out / history.STATE_FILE).read_text())
    best = Path(state["best_model_checkpoint"]).name
    kept = [p.name for p in checkpoints.checkpoints(out)]
    assert best != "checkpoint-20", state["log_history"]
    assert kept == [best, "checkpoint-20"]
