"""Upstream command lines run unchanged after ``lmctl train OBJ``.

The table holds the command lines of upstream's example tests (``test_pytorch_examples.py``,
``test_accelerate_examples.py``) for run_clm, run_mlm, run_plm, run_swag and their
no_trainer twins, and the commands of the language-modeling and multiple-choice READMEs.
Each runs in a folder where the Hub ids they name are local tiny models of the same
architecture, ``wikitext`` and ``swag`` are local datasets with the same configs and columns,
and ``tests/fixtures/`` holds small equivalents of upstream's fixture files; ``{tmp_dir}``
stands for the output directory, as in upstream's tests. Each line is run verbatim (the
no_trainer ones with ``--engine accelerate``), in process, and must write the metric that the
upstream test reads, finite, to ``all_results.json`` in its ``--output_dir``.
"""

from __future__ import annotations

import json
import math
import shlex
import shutil
from pathlib import Path
from typing import Any

import pytest

from lmctl.cli.app import main
from tests.conftest import FIXTURES, corpus_lines, swag_records, write_jsonl

# (script, the arguments after it, the metric the upstream test reads)
TESTS_CLM = (
    "--model_name_or_path distilbert/distilgpt2 --train_file ./tests/fixtures/sample_text.txt "
    "--validation_file ./tests/fixtures/sample_text.txt --do_train --do_eval --block_size 128 "
    "--per_device_train_batch_size 5 --per_device_eval_batch_size 5 --num_train_epochs 2 "
    "--output_dir {tmp_dir}"
)
TESTS_MLM = (
    "--model_name_or_path distilbert/distilroberta-base --train_file "
    "./tests/fixtures/sample_text.txt --validation_file ./tests/fixtures/sample_text.txt "
    "--output_dir {tmp_dir} --do_train --do_eval --prediction_loss_only --num_train_epochs=1"
)
TESTS_SWAG = (
    "--model_name_or_path google-bert/bert-base-uncased --train_file "
    "tests/fixtures/tests_samples/swag/sample.json --validation_file "
    "tests/fixtures/tests_samples/swag/sample.json --output_dir {tmp_dir} --max_steps=20 "
    "--warmup_steps=2 --do_train --do_eval --learning_rate=2e-4 "
    "--per_device_train_batch_size=2 --per_device_eval_batch_size=1"
)
TESTS_CLM_NO_TRAINER = (
    "--model_name_or_path distilbert/distilgpt2 --train_file ./tests/fixtures/sample_text.txt "
    "--validation_file ./tests/fixtures/sample_text.txt --block_size 128 "
    "--per_device_train_batch_size 5 --per_device_eval_batch_size 5 --num_train_epochs 2 "
    "--output_dir {tmp_dir} --checkpointing_steps epoch --with_tracking"
)
TESTS_MLM_NO_TRAINER = (
    "--model_name_or_path distilbert/distilroberta-base --train_file "
    "./tests/fixtures/sample_text.txt --validation_file ./tests/fixtures/sample_text.txt "
    "--output_dir {tmp_dir} --num_train_epochs=1 --checkpointing_steps epoch --with_tracking"
)
TESTS_SWAG_NO_TRAINER = (
    "--model_name_or_path google-bert/bert-base-uncased --train_file "
    "tests/fixtures/tests_samples/swag/sample.json --validation_file "
    "tests/fixtures/tests_samples/swag/sample.json --output_dir {tmp_dir} "
    "--max_train_steps=20 --num_warmup_steps=2 --learning_rate=2e-4 "
    "--per_device_train_batch_size=2 --per_device_eval_batch_size=1 --with_tracking"
)
WIKITEXT = "--dataset_name wikitext --dataset_config_name wikitext-2-raw-v1"
FILES = "--train_file train.txt --validation_file validation.txt"
BATCHES = "--per_device_train_batch_size 8 --per_device_eval_batch_size 8"

COMMAND_LINES: list[tuple[str, str, str]] = [
    # upstream's example tests (each also as it ran before --use_cpu replaced --no_cuda)
    ("run_clm.py", TESTS_CLM + " --use_cpu", "perplexity"),
    ("run_clm.py", TESTS_CLM + " --no_cuda", "perplexity"),
    ("run_clm.py", TESTS_CLM, "perplexity"),
    (
        "run_clm.py",
        "--model_type gpt2 --tokenizer_name openai-community/gpt2 --train_file "
        "./tests/fixtures/sample_text.txt --output_dir {tmp_dir} --config_overrides "
        "n_embd=10,n_head=2 --use_cpu",
        "perplexity",
    ),
    ("run_mlm.py", TESTS_MLM + " --use_cpu", "perplexity"),
    ("run_mlm.py", TESTS_MLM, "perplexity"),
    ("run_swag.py", TESTS_SWAG, "eval_accuracy"),
    ("run_swag.py", TESTS_SWAG + " --use_cpu", "eval_accuracy"),
    ("run_clm_no_trainer.py", TESTS_CLM_NO_TRAINER, "perplexity"),
    ("run_mlm_no_trainer.py", TESTS_MLM_NO_TRAINER, "perplexity"),
    ("run_swag_no_trainer.py", TESTS_SWAG_NO_TRAINER, "eval_accuracy"),
    # examples/pytorch/language-modeling/README.md
    (
        "run_clm.py",
        f"--model_name_or_path openai-community/gpt2 {WIKITEXT} {BATCHES} --do_train "
        "--do_eval --output_dir /tmp/test-clm",
        "perplexity",
    ),
    (
        "run_clm.py",
        f"--model_name_or_path openai-community/gpt2 {FILES} {BATCHES} --do_train --do_eval "
        "--output_dir /tmp/test-clm",
        "perplexity",
    ),
    (
        "run_clm_no_trainer.py",
        f"{WIKITEXT} --model_name_or_path openai-community/gpt2 --output_dir /tmp/test-clm",
        "perplexity",
    ),
    (
        "run_clm_no_trainer.py",
        f"--model_name_or_path openai-community/gpt2 {FILES} --output_dir /tmp/test-clm",
        "perplexity",
    ),
    (
        "run_mlm.py",
        f"--model_name_or_path FacebookAI/roberta-base {WIKITEXT} {BATCHES} --do_train "
        "--do_eval --output_dir /tmp/test-mlm",
        "perplexity",
    ),
    (
        "run_mlm.py",
        f"--model_name_or_path FacebookAI/roberta-base {FILES} {BATCHES} --do_train "
        "--do_eval --output_dir /tmp/test-mlm",
        "perplexity",
    ),
    (
        "run_mlm.py",
        f"--model_name_or_path FacebookAI/roberta-base {FILES} {BATCHES} --do_train "
        "--do_eval --output_dir /tmp/test-mlm --line_by_line",
        "perplexity",
    ),
    (
        "run_mlm.py",
        f"--model_name_or_path FacebookAI/roberta-base {FILES} {BATCHES} --do_train "
        "--do_eval --output_dir /tmp/test-mlm --line_by_line --pad_to_max_length",
        "perplexity",
    ),
    (
        "run_mlm_no_trainer.py",
        f"{WIKITEXT} --model_name_or_path FacebookAI/roberta-base --output_dir /tmp/test-mlm",
        "perplexity",
    ),
    (
        "run_mlm_no_trainer.py",
        f"{WIKITEXT} --model_name_or_path FacebookAI/roberta-base --output_dir /tmp/test-mlm "
        "--low_cpu_mem_usage",
        "perplexity",
    ),
    (
        "run_plm.py",
        f"--model_name_or_path=xlnet/xlnet-base-cased {WIKITEXT} {BATCHES} --do_train "
        "--do_eval --output_dir /tmp/test-plm",
        "perplexity",
    ),
    (
        "run_plm.py",
        f"--model_name_or_path=xlnet/xlnet-base-cased {FILES} {BATCHES} --do_train "
        "--do_eval --output_dir /tmp/test-plm",
        "perplexity",
    ),
    (
        "run_plm.py",
        f"--model_name_or_path=xlnet/xlnet-base-cased {FILES} {BATCHES} --do_train "
        "--do_eval --output_dir /tmp/test-plm --max_seq_length 512 --line_by_line",
        "perplexity",
    ),
    (
        "run_clm.py",
        f"--model_name_or_path openai-community/gpt2 {WIKITEXT} {BATCHES} --do_train "
        "--do_eval --output_dir /tmp/test-clm --streaming --max_steps 4",
        "perplexity",
    ),
    (
        "run_clm.py",
        "--model_type gpt2 --tokenizer_name openai-community/gpt2 "
        f"{FILES} --do_train --do_eval --output_dir /tmp/test-clm "
        '--config_overrides="n_embd=16,n_head=2,n_layer=2,n_positions=128"',
        "perplexity",
    ),
    # examples/pytorch/multiple-choice/README.md
    (
        "run_swag.py",
        "--model_name_or_path FacebookAI/roberta-base --do_train --do_eval --learning_rate 5e-5 "
        "--num_train_epochs 3 --output_dir /tmp/swag_base --per_device_eval_batch_size=16 "
        "--per_device_train_batch_size=16 --overwrite_output_dir",
        "eval_accuracy",
    ),
    (
        "run_swag_no_trainer.py",
        "--model_name_or_path google-bert/bert-base-cased --dataset_name swag "
        "--max_seq_length 128 --per_device_train_batch_size 32 --learning_rate 2e-5 "
        "--num_train_epochs 3 --output_dir /tmp/swag/",
        "eval_accuracy",
    ),
    (
        "run_swag_no_trainer.py",
        "--model_name_or_path google-bert/bert-base-cased --dataset_name swag "
        "--max_seq_length 128 --per_device_train_batch_size 32 --learning_rate 2e-5 "
        "--num_train_epochs 3 --output_dir /tmp/swag/ --with_tracking --report_to tensorboard",
        "eval_accuracy",
    ),
    (
        "run_swag_no_trainer.py",
        "--model_name_or_path google-bert/bert-base-cased --dataset_name swag "
        "--max_seq_length 128 --per_device_train_batch_size 32 --learning_rate 2e-5 "
        "--num_train_epochs 3 --output_dir /tmp/swag/ --checkpointing_steps epoch "
        "--lr_scheduler_type cosine --seed 7",
        "eval_accuracy",
    ),
]


def _objective(script: str) -> str:
    return script.removeprefix("run_").split("_")[0].removesuffix(".py")


def _lmctl_args(script: str, line: str, tmp_dir: Path) -> tuple[list[str], Path]:
    """``lmctl train OBJ`` + the line (output paths under ``tmp_dir``) and its output dir."""
    words = [
        str(tmp_dir / word.removeprefix("/tmp/")) if word.startswith("/tmp/") else word
        for word in shlex.split(line)
    ]
    words = [word.replace("{tmp_dir}", str(tmp_dir / "out")) for word in words]
    engine = ["--engine", "accelerate"] if "no_trainer" in script else []
    args = ["train", _objective(script), *words, *engine]
    index = next(i for i, w in enumerate(args) if w.startswith("--output_dir"))
    out = args[index].partition("=")[2] or args[index + 1]
    return args, Path(out)


def _save_model(path: Path, tokenizer: Path, model: Any) -> None:
    from transformers import AutoTokenizer

    AutoTokenizer.from_pretrained(tokenizer).save_pretrained(path)
    model.save_pretrained(path)


@pytest.fixture(scope="module")
def workdir(
    tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer: Path, wordpiece_tokenizer: Path
) -> Path:
    """A folder in which the Hub ids and files of the command lines are local and tiny."""
    import torch
    from transformers import (
        BertConfig,
        BertForMaskedLM,
        BertForMultipleChoice,
        GPT2Config,
        GPT2LMHeadModel,
        XLNetConfig,
        XLNetLMHeadModel,
    )

    torch.manual_seed(0)
    root = tmp_path_factory.mktemp("upstream")
    bert = {
        "vocab_size": 400,
        "hidden_size": 32,
        "num_hidden_layers": 2,
        "num_attention_heads": 2,
        "intermediate_size": 64,
        "max_position_embeddings": 128,
    }
    gpt2 = GPT2LMHeadModel(
        GPT2Config(vocab_size=400, n_positions=128, n_embd=32, n_layer=2, n_head=2)
    )
    for name in ("distilbert/distilgpt2", "openai-community/gpt2"):
        _save_model(root / name, bpe_tokenizer, gpt2)
    mlm = BertForMaskedLM(BertConfig(**bert))
    for name in ("distilbert/distilroberta-base", "FacebookAI/roberta-base"):
        _save_model(root / name, wordpiece_tokenizer, mlm)
    choice = BertForMultipleChoice(BertConfig(**bert))
    for name in ("google-bert/bert-base-uncased", "google-bert/bert-base-cased"):
        _save_model(root / name, wordpiece_tokenizer, choice)
    xlnet = XLNetLMHeadModel(
        XLNetConfig(vocab_size=400, d_model=32, n_layer=2, n_head=2, d_inner=64)
    )
    _save_model(root / "xlnet/xlnet-base-cased", wordpiece_tokenizer, xlnet)

    shutil.copytree(FIXTURES, root / "tests" / "fixtures")
    lines = corpus_lines()
    (root / "train.txt").write_text("\n".join(lines[:24]) + "\n", encoding="utf-8")
    (root / "validation.txt").write_text("\n".join(lines[24:32]) + "\n", encoding="utf-8")
    wikitext = root / "wikitext" / "wikitext-2-raw-v1"
    wikitext.mkdir(parents=True)
    for split, part in (("train", lines[100:124]), ("validation", lines[124:132])):
        (wikitext / f"{split}.txt").write_text("\n".join(part) + "\n", encoding="utf-8")
    (root / "wikitext" / "README.md").write_text(_dataset_card("wikitext-2-raw-v1", "txt"))
    swag = root / "swag" / "regular"
    swag.mkdir(parents=True)
    write_jsonl(swag / "train.jsonl", swag_records(24, seed=11))
    write_jsonl(swag / "validation.jsonl", swag_records(8, seed=12))
    (root / "swag" / "README.md").write_text(_dataset_card("regular", "jsonl"))
    return root


def _dataset_card(config: str, ext: str) -> str:
    """A local dataset folder's card declaring the named config, as the Hub's datasets do."""
    return (
        "---\nconfigs:\n"
        f"- config_name: {config}\n  data_files:\n"
        f"  - split: train\n    path: {config}/train.{ext}\n"
        f"  - split: validation\n    path: {config}/validation.{ext}\n"
        "---\n"
    )


def run_lmctl(args: list[str]) -> int:
    """``lmctl ARGS`` in this process; its exit code."""
    try:
        main(args)
    except SystemExit as exit_:
        return int(exit_.code or 0)
    return 0


@pytest.mark.e2e
@pytest.mark.parametrize(
    "script,line,metric",
    COMMAND_LINES,
    ids=[f"{i:02d}-{script}" for i, (script, _, _) in enumerate(COMMAND_LINES)],
)
def test_upstream_command_line_runs_unchanged(
    workdir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    script: str,
    line: str,
    metric: str,
) -> None:
    monkeypatch.chdir(workdir)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    monkeypatch.setenv("CI", "1")
    # --with_tracking without --report_to logs to every installed tracker; mlflow's default
    # store is a database in the current directory, which needs mlflow's server extras.
    monkeypatch.setenv("MLFLOW_TRACKING_URI", (tmp_path / "mlruns").as_uri())
    monkeypatch.setenv("MLFLOW_ALLOW_FILE_STORE", "true")
    args, out = _lmctl_args(script, line, tmp_path)
    assert run_lmctl(args) == 0, args
    results = json.loads((out / "all_results.json").read_text())
    assert math.isfinite(results[metric]), results


def test_the_table_covers_every_script() -> None:
    scripts = {script for script, _, _ in COMMAND_LINES}
    assert len(COMMAND_LINES) >= 30
    assert scripts >= {
        "run_clm.py",
        "run_mlm.py",
        "run_plm.py",
        "run_swag.py",
        "run_clm_no_trainer.py",
        "run_mlm_no_trainer.py",
        "run_swag_no_trainer.py",
    }


# The upstream test's command line through lmctl, and upstream's recipe (benchmarks/upstream.py)
# with the same settings, on the same local model and data.
SAMPLE = "./tests/fixtures/sample_text.txt"
PARITY = [
    (
        "run_clm.py",
        TESTS_CLM,
        ["clm", "--block-size", "128", "--batch-size", "5", "--epochs", "2"],
        (SAMPLE, SAMPLE),
    ),
    (
        "run_mlm.py",
        f"--model_name_or_path FacebookAI/roberta-base {FILES} {BATCHES} --do_train "
        "--do_eval --output_dir /tmp/test-mlm --line_by_line",
        ["mlm", "--line-by-line", "--max-seq-length", "128", "--epochs", "3"],
        ("train.txt", "validation.txt"),
    ),
]


@pytest.mark.slow
@pytest.mark.parametrize("script,line,recipe,data", PARITY, ids=[p[0] for p in PARITY])
def test_upstream_command_line_gives_upstreams_eval_loss(
    workdir: Path,
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
    *,
    script: str,
    line: str,
    recipe: list[str],
    data: tuple[str, str],
) -> None:
    import subprocess
    import sys

    monkeypatch.chdir(workdir)
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")
    args, out = _lmctl_args(script, line, tmp_path)
    assert run_lmctl(args) == 0, args
    ours = json.loads((out / "all_results.json").read_text())["eval_loss"]
    model = args[args.index("--model_name_or_path") + 1]
    results = tmp_path / "upstream.json"
    script_path = Path(__file__).resolve().parent.parent / "benchmarks" / "upstream.py"
    command = [sys.executable, str(script_path), *recipe[:1], "--model", model]
    command += ["--train-file", data[0], "--validation-file", data[1], *recipe[1:]]
    command += ["--output-dir", str(tmp_path / "upstream"), "--out", str(results)]
    subprocess.run(command, check=True, capture_output=True, timeout=600)
    theirs = json.loads(results.read_text())["eval_loss"]
    assert ours == pytest.approx(theirs, rel=0.03), (ours, theirs)
