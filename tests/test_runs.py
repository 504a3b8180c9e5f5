"""``lmctl runs`` lists finished and interrupted runs; training leaves loss curves behind (a
sparkline in the summary, loss.png in the run directory)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmctl.console import Console, OutputOptions, sparkline
from lmctl.run import plots
from tests.conftest import TINY_GPT2, lmctl


def run_args(tokenizer: Path, data: tuple[Path, Path], out: Path, steps: int) -> list[str]:
    train, valid = data
    return [
        "train", "clm", *TINY_GPT2,
        "--tokenizer-name", str(tokenizer),
        "--train-file", str(train),
        "--validation-file", str(valid),
        "--max-train-samples", "200",
        "--max-eval-samples", "8",
        "--block-size", "32",
        "--per-device-train-batch-size", "4",
        "--learning-rate", "3e-3",
        "--logging-steps", "1",
        "--max-steps", str(steps),
        "--output-dir", str(out),
    ]  # fmt: skip


def kill_after_checkpoint(args: list[str], out: Path, cwd: Path) -> None:
    """Start a run and SIGKILL it once its first checkpoint is in place."""
    env = {**os.environ, "CI": "1"}
    proc = subprocess.Popen(
        [sys.executable, "-m", "lmctl", *args],
        cwd=cwd,
        env=env,
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
        start_new_session=True,
    )
    try:
        deadline = time.monotonic() + 300
        while not (out / "checkpoint-2" / "trainer_state.json").is_file():
            assert proc.poll() is None, "the run ended before its first checkpoint"
            assert time.monotonic() < deadline, "no checkpoint within 300 s"
            time.sleep(0.2)
    finally:
        os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(timeout=60)


@pytest.mark.e2e
@pytest.mark.slow
def test_runs_lists_a_finished_and_an_interrupted_run(
    bpe_tokenizer: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    runs = tmp_path / "runs"
    finished = runs / "done"
    args = run_args(bpe_tokenizer, text_files, finished, steps=6)
    proc = lmctl(*args, "--eval-strategy", "steps", "--eval-steps", "3", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    # The summary draws both loss curves.
    rows = {line.split()[0] + " " + line.split()[1]: line for line in proc.stdout.splitlines()[1:]}
    assert any(bar in rows["train loss"] for bar in "▁▂▃▄▅▆▇█"), proc.stdout
    assert "eval loss" in rows
    plot = finished / "loss.png"
    assert plot.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert plot.stat().st_size > 10_000

    interrupted = runs / "cut"
    cut_args = run_args(bpe_tokenizer, text_files, interrupted, steps=400)
    kill_after_checkpoint([*cut_args, "--save-steps", "2"], interrupted, tmp_path)

    listing = lmctl("runs", runs, cwd=tmp_path)
    assert listing.returncode == 0, listing.stderr
    lines = {line.split()[0]: line for line in listing.stdout.splitlines() if line.strip()}
    assert "finished" in lines["done"]
    assert " 6 " in lines["done"]
    assert "ppl " in lines["done"]
    assert "interrupted at step" in lines["cut"]
    assert "/400" in lines["cut"]
    assert f"lmctl resume {interrupted}" in listing.stdout

    data = json.loads(lmctl("runs", runs, "--json", cwd=tmp_path).stdout)
    by_name = {Path(run["path"]).name: run for run in data["runs"]}
    done = by_name["done"]
    results = json.loads((finished / "eval_results.json").read_text())
    assert done["status"] == "finished"
    assert done["step"] == 6
    assert done["final_eval_loss"] == pytest.approx(results["eval_loss"])
    assert done["best_eval_loss"] <= done["final_eval_loss"]
    assert done["perplexity"] == pytest.approx(results["perplexity"])
    cut = by_name["cut"]
    step = cut["step"]
    assert step >= 2 and step % 2 == 0
    assert cut["status"] == f"interrupted at step {step}"
    assert cut["max_steps"] == 400
    assert cut["resume_command"] == f"lmctl resume {interrupted}"
    assert done["resume_command"] is None

    # eval and resume keep the metrics log and loss.png current.
    before = plot.stat().st_mtime_ns
    evaluated = lmctl("eval", finished, cwd=tmp_path)
    assert evaluated.returncode == 0, evaluated.stderr
    last = json.loads((finished / "metrics.jsonl").read_text().splitlines()[-1])
    assert (last["event"], last["step"]) == ("eval", 6)
    assert plot.stat().st_mtime_ns > before
    resumed = lmctl("resume", interrupted, "--max-steps", str(step + 2), cwd=tmp_path)
    assert resumed.returncode == 0, resumed.stderr
    assert (interrupted / "loss.png").is_file()
    after = json.loads(lmctl("runs", runs, "--json", cwd=tmp_path).stdout)
    cut = {Path(run["path"]).name: run for run in after["runs"]}["cut"]
    assert (cut["status"], cut["step"], cut["resume_command"]) == ("finished", step + 2, None)


def test_runs_of_a_missing_folder_is_a_usage_error(tmp_path: Path) -> None:
    proc = lmctl("runs", tmp_path / "nowhere", cwd=tmp_path)
    assert proc.returncode == 2
    assert "no such directory" in proc.stderr


def test_runs_tell_apart_runs_from_folders_of_the_same_name(tmp_path: Path) -> None:
    runs = tmp_path / "runs"
    models = {
        "a": str(tmp_path / "minilm" / "model"),
        "b": str(tmp_path / "gpt2-small" / "model"),
        "c": "openai-community/gpt2",
    }
    for name, model in models.items():
        (runs / name).mkdir(parents=True)
        config = {"objective": "clm", "model_name_or_path": model}
        (runs / name / "lmctl.yaml").write_text(json.dumps(config))
    proc = lmctl("runs", runs, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    shown = {line.split()[0]: line.split()[2] for line in proc.stdout.splitlines()[1:4]}
    assert shown == {"a": "minilm/model", "b": "gpt2-small/model", "c": "openai-community/gpt2"}


def test_sparkline_follows_the_values() -> None:
    assert sparkline([3.0, 2.0, 1.0]) == "█▅▁"
    assert len(sparkline([float(i) for i in range(100)], width=20)) == 20
    assert sparkline([]) == ""


def test_plot_is_skipped_with_one_line_without_matplotlib(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str]
) -> None:
    (tmp_path / "metrics.jsonl").write_text(
        '{"step": 1, "loss": 2.0, "learning_rate": 0.1}\n{"step": 2, "loss": 1.5}\n'
    )
    real = plots.importlib.util.find_spec
    monkeypatch.setattr(
        plots.importlib.util,
        "find_spec",
        lambda name, *a: None if name == "matplotlib" else real(name, *a),
    )
    assert plots.write_loss_plot(tmp_path, Console(OutputOptions(no_progress=True))) is None
    assert not (tmp_path / "loss.png").exists()
    lines = capsys.readouterr().err.strip().splitlines()
    assert len(lines) == 1
    assert "pip install 'lmctl-train[plot]'" in lines[0]
