"""What a new user meets first: results that must be trustworthy, and the messages around
them. Each test runs the command a user would type."""

from __future__ import annotations

import json
import re
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import (
    TINY_GPT2,
    assert_clean_failure,
    lmctl,
    minilm_path,
    slow_except,
    swag_records,
    write_jsonl,
)

pytestmark = pytest.mark.e2e


def warnings_of(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if " WARN " in line]


def test_eval_refuses_a_model_without_the_objective_head(
    tmp_path: Path, text_files: tuple[Path, Path]
) -> None:
    _, valid = text_files
    args = (
        "eval", minilm_path(), "--task", "mlm", "--validation-file", valid,
        "--max-eval-samples", "8", "--max-seq-length", "32",
    )  # fmt: skip
    proc = lmctl(*args, cwd=tmp_path)
    assert_clean_failure(proc, 5, "no mlm head", "cls.predictions", "--allow-random-head")
    assert "learnt by this run" not in proc.stderr
    assert proc.stdout == ""

    proc = lmctl(*args, "--allow-random-head", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert any("randomly initialised" in line for line in warnings_of(proc)), proc.stderr
    assert "eval_loss" in json.loads(proc.stdout)["metrics"]


@pytest.fixture(scope="module")
def encoder_as_clm(
    tmp_path_factory: pytest.TempPathFactory, text_files: tuple[Path, Path]
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    work = tmp_path_factory.mktemp("encoder-clm")
    train, _ = text_files
    out = work / "run"
    proc = lmctl(
        "train", "clm", "--model", minilm_path(), "--train-file", train,
        "--max-train-samples", "40", "--block-size", "32", "--per-device-train-batch-size", "2",
        "--max-steps", "1", "--save-steps", "1", "--no-eval", "-o", out, cwd=work,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_clm_trains_an_encoder_as_a_decoder_and_says_so(
    encoder_as_clm: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, proc = encoder_as_clm
    saved = json.loads((out / "config.json").read_text())
    assert saved["architectures"] == ["BertLMHeadModel"]
    assert saved["is_decoder"] is True
    assert "bert is an encoder: using it as a causal LM with is_decoder=True" in proc.stderr
    # The head that the encoder lacks is learnt by this run, and the log says so.
    assert "newly initialised (not in the checkpoint, learnt by this run): cls." in proc.stderr


def test_resume_says_the_head_comes_from_the_checkpoint(
    encoder_as_clm: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, _ = encoder_as_clm
    proc = lmctl("resume", out, "--max-steps", "2", cwd=out.parent)
    assert proc.returncode == 0, proc.stderr
    assert "learnt by this run" not in proc.stderr
    assert "are restored from checkpoint-1" in proc.stderr, proc.stderr


@pytest.mark.slow
def test_re_evaluating_a_run_is_quiet_and_matches_training(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    train, valid = text_files
    out = tmp_path / "run"
    proc = lmctl(
        "train", "clm", *TINY_GPT2, "--tokenizer-name", bpe_tokenizer, "--train-file", train,
        "--validation-file", valid, "--max-train-samples", "200", "--max-eval-samples", "40",
        "--block-size", "32", "--max-steps", "3", "-o", out, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    # The end-of-training evaluation shows its progress, as 'lmctl eval' does.
    assert re.search(r" INFO  evaluating: \d+ steps", proc.stderr), proc.stderr
    trained = json.loads((out / "all_results.json").read_text())

    proc = lmctl("eval", out, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert warnings_of(proc) == [], proc.stderr
    metrics = json.loads(proc.stdout)["metrics"]
    assert metrics["eval_loss"] == trained["eval_loss"]
    assert metrics["perplexity"] == trained["perplexity"]

    # Asking for a file that replaces one is worth a warning.
    proc = lmctl("eval", out, "--overwrite-results", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert any("replacing" in line for line in warnings_of(proc)), proc.stderr


@pytest.mark.parametrize("engine", slow_except(["trainer", "accelerate"], "trainer"))
def test_totals_after_a_resume_cover_the_whole_run(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path, engine: str
) -> None:
    train, valid = text_files
    out = tmp_path / "run"
    proc = lmctl(
        "train", "clm", *TINY_GPT2, "--tokenizer-name", bpe_tokenizer, "--train-file", train,
        "--max-train-samples", "200", "--block-size", "32", "--engine", engine,
        "--validation-file", valid, "--max-eval-samples", "20",
        "--max-steps", "4", "--save-steps", "4", "--logging-steps", "1",
        "--learning-rate", "3e-3", "-o", out, cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    proc = lmctl("resume", out, "--max-steps", "8", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert re.search(r" INFO  evaluating: \d+ steps", proc.stderr), proc.stderr

    records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    step_losses = {r["step"]: r["loss"] for r in records if "loss" in r and "step" in r}
    assert sorted(step_losses) == list(range(1, 9))
    segment_runtimes = [r["train_runtime"] for r in records if "train_loss" in r]
    assert len(segment_runtimes) == 2

    totals = json.loads((out / "train_results.json").read_text())
    assert totals["train_loss"] == pytest.approx(sum(step_losses.values()) / 8, rel=1e-3)
    # The first segment counts up to its checkpoint (what came after it is not resumed).
    first, second = segment_runtimes
    assert second + 0.5 * first < totals["train_runtime"] <= first + second + 1e-3
    card = (out / "README.md").read_text().splitlines()
    row = next(line for line in card if line.startswith("| train_loss |"))
    assert float(row.split("|")[2]) == pytest.approx(totals["train_loss"], rel=1e-3)

    # The rates are the whole run's too: rate times runtime is what the run trained on.
    steps_rate, samples_rate = totals["train_steps_per_second"], totals["train_samples_per_second"]
    assert steps_rate == pytest.approx(8 / totals["train_runtime"], rel=1e-2)
    config = yaml.safe_load((out / "lmctl.yaml").read_text())
    per_step = config["per_device_train_batch_size"] * config["gradient_accumulation_steps"]
    assert samples_rate / steps_rate == pytest.approx(per_step, rel=2e-2)
    # Large numbers read as numbers; the log shows an evaluation as the summary does.
    flos = next(line for line in card if line.startswith("| total_flos |"))
    assert re.fullmatch(r"\| total_flos \| \d\.\d{3}e\+\d\d \|", flos), flos
    eval_loss = next(line.split()[1] for line in proc.stdout.splitlines() if "eval_loss" in line)
    assert f"step 8: eval_loss {eval_loss}," in proc.stderr, proc.stdout

    # The card shows the command that started the run and the one that extended it.
    training = "\n".join(card).split("## Training\n\n```\n")[1].split("\n```")[0]
    first, command, extended, resumed = training.splitlines()
    assert first == "# trained from step 0 to step 4"
    assert command.startswith("lmctl train clm --model-type gpt2 --config-overrides ")
    assert extended == "# extended the finished run from step 4 to step 8"
    assert resumed == f"lmctl resume {out} --max-steps 8"
    assert "interrupted" not in "\n".join(card)


def test_the_text_column_is_named_with_the_ones_ignored(
    tmp_path: Path, bpe_tokenizer: Path
) -> None:
    train = write_jsonl(tmp_path / "mc_train.jsonl", swag_records(40, seed=3))
    proc = lmctl(
        "train", "clm", *TINY_GPT2, "--tokenizer-name", bpe_tokenizer, "--train-file", train,
        "--block-size", "16", "--max-steps", "1", "--no-eval", "-o", tmp_path / "run",
        cwd=tmp_path,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert (
        "train: reading the text from column 'sent1' of " + str(train) + "; ignoring sent2, "
        "ending0, ending1, ending2, ending3, label (choose another with --text-column)"
    ) in proc.stderr


def test_embedded_default_says_which_settings_it_uses(tmp_path: Path) -> None:
    proc = lmctl("train", "clm", "--max-steps", "3", "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    lines = [line for line in proc.stderr.splitlines() if "embedded default" in line]
    assert len(lines) == 1, proc.stderr
    for shown in ("--learning-rate 0.003", "--per-device-train-batch-size 16", "shakespeare"):
        assert shown in lines[0]
    # --max-steps decides the length, so the default's epochs are not among its settings.
    assert "--num-train-epochs" not in lines[0]


def test_missing_data_is_one_problem(tmp_path: Path, bpe_tokenizer: Path) -> None:
    proc = lmctl("train", "clm", *TINY_GPT2, "--tokenizer-name", bpe_tokenizer, cwd=tmp_path)
    assert_clean_failure(proc, 2, "no data: give --dataset-name or --train-file")
    assert "problems" not in proc.stderr
    assert "--do-train needs training data" not in proc.stderr


@pytest.mark.slow
def test_cache_messages_compare_only_with_the_same_data(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path, wordpiece_tokenizer: Path
) -> None:
    train, _ = text_files
    env = {"LMCTL_CACHE": str(tmp_path / "cache")}
    common = ("--train-file", train, "--max-train-samples", "100", "--no-eval")

    def prepare(*args: str | Path) -> str:
        proc = lmctl("prepare", *args, *common, cwd=tmp_path, env=env)
        assert proc.returncode == 0, proc.stderr
        return proc.stderr

    prepare("clm", "--tokenizer-name", bpe_tokenizer, "--block-size", "32")
    # Another objective and tokenizer: a fresh config, not a changed one.
    log = prepare("mlm", "--tokenizer-name", wordpiece_tokenizer, "--line-by-line",
                  "--max-seq-length", "32")  # fmt: skip
    assert "train: no prepared data for this config yet; preparing data" in log
    assert "prepared data exists but" not in log
    # Line by line, the second identical run reuses the first one's data.
    log = prepare("mlm", "--tokenizer-name", wordpiece_tokenizer, "--line-by-line",
                  "--max-seq-length", "32")  # fmt: skip
    assert "reusing prepared data" in log, log
    # The same data with one setting changed says what changed.
    log = prepare("clm", "--tokenizer-name", bpe_tokenizer, "--block-size", "64")
    assert "train: prepared data exists but block_size 32 -> 64: preparing it again" in log
