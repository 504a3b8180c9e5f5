"""``lmctl train clm`` end to end on tiny models (CPU, seconds each)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import pytest

from tests.conftest import TINY_GPT2, lmctl

pytestmark = pytest.mark.e2e

RUN_FILES = (
    "config.json",
    "model.safetensors",
    "tokenizer.json",
    "lmctl.yaml",
    "metrics.jsonl",
    "train_results.json",
    "eval_results.json",
    "all_results.json",
    "trainer_state.json",
    "README.md",
)


@pytest.fixture(scope="module")
def acceptance_run(
    tmp_path_factory: pytest.TempPathFactory, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> tuple[Path, subprocess.CompletedProcess[str]]:
    work = tmp_path_factory.mktemp("clm")
    out = work / "out"
    train, valid = text_files
    proc = lmctl(
        "train",
        "clm",
        *TINY_GPT2,
        "--tokenizer-name",
        bpe_tokenizer,
        "--train-file",
        train,
        "--validation-file",
        valid,
        "--max-steps",
        "30",
        "--learning-rate",
        "2e-3",
        "--output-dir",
        out,
        "--json",
        cwd=work,
    )
    assert proc.returncode == 0, proc.stderr
    return out, proc


def test_run_directory_contract(
    acceptance_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, _ = acceptance_run
    for name in RUN_FILES:
        assert (out / name).is_file(), name
    from transformers import AutoModelForCausalLM, AutoTokenizer

    model = AutoModelForCausalLM.from_pretrained(out)
    assert model.config.n_layer == 2 and model.config.n_embd == 64
    AutoTokenizer.from_pretrained(out)
    results = json.loads((out / "all_results.json").read_text())
    for key in (
        "perplexity",
        "eval_accuracy",
        "eval_loss",
        "train_loss",
        "train_samples",
        "eval_samples",
        "train_runtime",
    ):
        assert key in results, key
    assert 1 < results["perplexity"] < 400  # a 400-token vocabulary: chance is 400
    assert 0 < results["eval_accuracy"] < 1
    card = (out / "README.md").read_text()
    assert "pipeline_tag: text-generation" in card and "perplexity" in card
    steps = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
    assert [r["step"] for r in steps if "loss" in r] == [10, 20, 30]
    state = json.loads((out / "trainer_state.json").read_text())
    assert state["global_step"] == 30


def test_json_output_and_plain_logs(
    acceptance_run: tuple[Path, subprocess.CompletedProcess[str]],
) -> None:
    out, proc = acceptance_run
    payload = json.loads(proc.stdout)
    assert payload["status"] == "ok" and payload["exit_code"] == 0
    assert payload["output_dir"] == str(out)
    assert (
        payload["metrics"]["perplexity"]
        == json.loads((out / "all_results.json").read_text())["perplexity"]
    )
    for stream in (proc.stdout, proc.stderr):
        assert "\x1b" not in stream
        assert "\r" not in stream
    assert "step 30/30" in proc.stderr
    # One line says which fast paths run on this CPU: the tiled loss, the fused GELU and the
    # sparse embedding gradient, each measured faster here.
    line = next(line for line in proc.stderr.splitlines() if "fast paths (cpu, " in line)
    on = line.split("; off:", 1)[0].split(" on: ", 1)[1]
    for name in ("tiled-loss", "fused-gelu", "sparse-embedding", "fused-adamw", "allocator"):
        assert name in on, line
    assert json.loads((out / "config.json").read_text())["activation_function"] == "gelu_new"


def test_resolved_config_is_reusable(
    acceptance_run: tuple[Path, subprocess.CompletedProcess[str]], tmp_path: Path
) -> None:
    out, _ = acceptance_run
    proc = lmctl(
        "train",
        "clm",
        "--config",
        out / "lmctl.yaml",
        "--output-dir",
        tmp_path / "again",
        "--dry-run",
        "--json",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    config = json.loads(proc.stdout)["config"]
    assert (
        config["max_steps"] == 30 and config["config_overrides"] == "n_layer=2,n_embd=64,n_head=2"
    )


def test_upstream_json_args_file(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    train, valid = text_files
    args = {
        "model_type": "gpt2",
        "config_overrides": "n_layer=2,n_embd=32,n_head=2",
        "tokenizer_name": str(bpe_tokenizer),
        "train_file": str(train),
        "validation_file": str(valid),
        "per_device_train_batch_size": 4,
        "do_train": True,
        "do_eval": True,
        "max_steps": 5,
        "output_dir": str(tmp_path / "out"),
        "overwrite_output_dir": True,
        "logging_steps": 1,
        "report_to": "none",
    }
    path = tmp_path / "args.json"
    path.write_text(json.dumps(args))
    proc = lmctl("train", "clm", "--config", path, "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    results = json.loads((tmp_path / "out" / "all_results.json").read_text())
    assert "perplexity" in results
    assert "n_embd=32" in proc.stderr  # overrides show in the logged config


def test_train_tokenizer_and_block_size_clamp(
    tmp_path: Path, text_files: tuple[Path, Path]
) -> None:
    train, valid = text_files
    out = tmp_path / "out"
    proc = lmctl(
        "train",
        "clm",
        "--model-type",
        "gpt2",
        "--config-overrides",
        "n_layer=1,n_embd=32,n_head=2,n_positions=64",
        "--train-tokenizer",
        "300",
        "--train-file",
        train,
        "--validation-file",
        valid,
        "--block-size",
        "100",
        "--max-steps",
        "3",
        "--output-dir",
        out,
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    assert (
        "--block-size 100 is larger than the tokenizer's maximum length (64); using 64"
        in proc.stderr
    )
    assert "parameters" in proc.stderr
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(out)
    assert len(tokenizer) == 300
    assert AutoModelForCausalLM.from_pretrained(out).config.vocab_size == 300


@pytest.mark.slow
def test_second_identical_run_reuses_preprocessing(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    train, valid = text_files
    cache = tmp_path / "lmctl-cache"
    args = (
        "train",
        "clm",
        *TINY_GPT2,
        "--tokenizer-name",
        bpe_tokenizer,
        "--train-file",
        train,
        "--validation-file",
        valid,
        "--max-steps",
        "1",
    )
    env = {"LMCTL_CACHE": str(cache)}
    first = lmctl(*args, "--output-dir", tmp_path / "a", cwd=tmp_path, env=env)
    assert first.returncode == 0, first.stderr
    assert "reusing prepared data" not in first.stderr
    entries = sorted(p.parent.name for p in cache.rglob("manifest.json"))
    assert len(entries) == 2  # train and validation
    second = lmctl(*args, "--output-dir", tmp_path / "b", cwd=tmp_path, env=env)
    assert second.returncode == 0, second.stderr
    assert "reusing prepared data" in second.stderr
    assert sorted(p.parent.name for p in cache.rglob("manifest.json")) == entries
    third = lmctl(
        *args, "--block-size", "32", "--output-dir", tmp_path / "c", cwd=tmp_path, env=env
    )
    assert third.returncode == 0, third.stderr
    assert "reusing prepared data" not in third.stderr
    assert len(list(cache.rglob("manifest.json"))) == 4


def test_non_finite_loss_exits_4(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    train, _ = text_files
    proc = lmctl(
        "train",
        "clm",
        *TINY_GPT2,
        "--tokenizer-name",
        bpe_tokenizer,
        "--train-file",
        train,
        "--no-eval",
        "--learning-rate",
        "1e12",
        "--max-grad-norm",
        "0",
        "--max-steps",
        "40",
        "--save-steps",
        "1",
        "--output-dir",
        tmp_path / "out",
        cwd=tmp_path,
    )
    assert proc.returncode == 4, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "training stopped: loss is" in proc.stderr


def test_sigint_saves_checkpoint_and_exits_130(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    train, valid = text_files
    out = tmp_path / "out"
    env = {**os.environ, "CI": "1"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lmctl",
            "train",
            "clm",
            *TINY_GPT2,
            "--tokenizer-name",
            str(bpe_tokenizer),
            "--train-file",
            str(train),
            "--validation-file",
            str(valid),
            "--max-steps",
            "100000",
            "--logging-steps",
            "1",
            "--output-dir",
            str(out),
        ],
        cwd=tmp_path,
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    deadline = time.monotonic() + 300
    log = out / "metrics.jsonl"
    while time.monotonic() < deadline and not (log.is_file() and log.read_text().count("\n") >= 3):
        time.sleep(0.2)
    proc.send_signal(signal.SIGINT)
    _, stderr = proc.communicate(timeout=300)
    assert proc.returncode == 130, stderr
    assert "Traceback" not in stderr
    checkpoints = sorted(out.glob("checkpoint-*"))
    assert len(checkpoints) == 1
    assert (checkpoints[0] / "trainer_state.json").is_file()
    assert f"lmctl resume {out}" in stderr


def test_embedded_default_wiring(tmp_path: Path) -> None:
    proc = lmctl("train", "clm", "--max-steps", "3", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)
    assert payload["output_dir"].startswith("runs/clm-")
    assert "perplexity" in payload["metrics"]
    assert "embedded default" in proc.stderr
    # It ends with a taste of the model: one continuation, on stderr (stdout is the JSON).
    samples = [
        line for line in proc.stderr.splitlines() if " sample: Shall I compare thee → " in line
    ]
    assert len(samples) == 1, proc.stderr
    assert proc.stderr.rstrip().endswith(samples[0])


def test_a_causal_lm_and_its_saved_tokenizer_leave_segment_ids_out(
    tmp_path: Path, text_files: tuple[Path, Path], wordpiece_tokenizer: Path
) -> None:
    """A BERT tokenizer returns token_type_ids, which GPT-2 would look up in its token
    embedding; lmctl trains on token ids alone, and the run's tokenizer returns none, so
    ``model(**tokenizer(text))`` scores what ``model(input_ids)`` does."""
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    out = tmp_path / "out"
    train, valid = text_files
    proc = lmctl(
        "train", "clm", *TINY_GPT2, "--tokenizer-name", wordpiece_tokenizer,
        "--train-file", train, "--validation-file", valid, "--block-size", "32",
        "--max-steps", "2", "--save-strategy", "no", "-o", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "the run's tokenizer leaves them out" in proc.stderr
    assert "token_type_ids" in AutoTokenizer.from_pretrained(wordpiece_tokenizer)("to be")
    tokenizer = AutoTokenizer.from_pretrained(out)
    inputs = tokenizer("to be or not to be, that is the question", return_tensors="pt")
    assert sorted(inputs) == ["attention_mask", "input_ids"]
    model = AutoModelForCausalLM.from_pretrained(out).eval()
    with torch.no_grad():
        given = model(**inputs, labels=inputs["input_ids"]).loss
        alone = model(input_ids=inputs["input_ids"], labels=inputs["input_ids"]).loss
        zeros = torch.zeros_like(inputs["input_ids"])
        with_segments = model(**inputs, token_type_ids=zeros, labels=inputs["input_ids"]).loss
    assert torch.equal(given, alone)
    assert not torch.equal(with_segments, alone)  # what the tokenizer's ids would have done
