"""The help path is fast: it never imports the heavy libraries."""

from __future__ import annotations

import json
import subprocess
import sys

import pytest

HEAVY = ("torch", "transformers", "datasets", "accelerate", "evaluate")

PROBE = """
import json, sys
from lmctl.cli.app import app
try:
    app(args=sys.argv[1:], prog_name="lmctl")
except SystemExit:
    pass
heavy = sorted(m for m in sys.modules if m.split(".")[0] in {heavy})
sys.stderr.write("\\nHEAVY=" + json.dumps(heavy) + "\\n")
"""


def _heavy_modules(*args: str) -> tuple[list[str], str]:
    code = PROBE.replace("{heavy}", repr(set(HEAVY)))
    proc = subprocess.run(
        [sys.executable, "-c", code, *args], capture_output=True, text=True, check=False
    )
    marker = proc.stderr.rsplit("HEAVY=", 1)
    assert len(marker) == 2, proc.stderr
    return json.loads(marker[1]), proc.stdout + proc.stderr


@pytest.mark.parametrize(
    "args",
    [
        ("--help",),
        ("train", "--help"),
        ("train", "clm", "--help"),
        ("train", "clm", "--learning-rate", "-1", "--train-file", "x.txt"),
        ("train", "clm", "--model-type", "gpt2", "--train-tokenizer", "100", "--dry-run"),
        ("push", "--help"),
        ("push", ".", "--to", "s3:/bucket"),
        ("eval", "--help"),
        ("resume", "--help"),
        ("eval", "no/such/run"),
        ("predict", "--help"),
        ("predict", "no/such/run", "--prompt", "x"),
        ("predict", "no/such/run"),
        ("resume", "no/such/run"),
        ("resume", "no/such/run", "--block-size", "64"),
        ("train", "clm", "--model-type", "gpt2", "--tokenizer", "t", "--streaming"),
        ("train", "clm", "--lerning_rate", "1"),
        ("train", "clm", "--model_type", "gpt2", "--torch_empty_cache_steps", "x"),
        ("train", "clm", "--model_type", "gpt2", "--use_cpu", "--optim", "sgd", "--dry-run"),
        ("prepare", "--help"),
        ("prepare", "clm", "--help"),
        ("prepare", "clm", "--tokenizer", "t", "--train-file", "missing.txt"),
        ("config", "--help"),
        ("config", "show", "clm", "--help"),
        ("config", "show", "clm", "--model-type", "gpt2", "--train-tokenizer", "100"),
        ("config", "validate", "missing.yaml"),
        ("config", "schema", "clm"),
        ("runs", "--help"),
        ("runs", "no/such/folder"),
        ("env", "--help"),
    ],
)
def test_no_heavy_import(args: tuple[str, ...]) -> None:
    heavy, output = _heavy_modules(*args)
    assert heavy == [], f"{args} imported {heavy}"
    assert output.strip()


def test_help_lists_every_upstream_clm_option() -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "lmctl", "train", "clm", "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={"COLUMNS": "250", "PATH": "", "TERM": "dumb"},
    )
    for flag in (
        "--model-name-or-path",
        "--model ",
        "--tokenizer-name",
        "--tokenizer ",
        "--train-file",
        "--validation-file",
        "--dataset-name",
        "--dataset-config-name",
        "--block-size",
        "--validation-split-percentage",
        "--keep-linebreaks",
        "--no-keep-linebreaks",
        "--config-overrides",
        "--model-type",
        "--max-train-samples",
        "--max-eval-samples",
        "--preprocessing-num-workers",
        "--overwrite-cache",
        "--dtype",
        "--trust-remote-code",
        "--output-dir",
        "--per-device-train-batch-size",
        "--per-device-eval-batch-size",
        "--learning-rate",
        "--weight-decay",
        "--num-train-epochs",
        "--max-steps",
        "--gradient-accumulation-steps",
        "--lr-scheduler-type",
        "--warmup-steps",
        "--warmup-ratio",
        "--seed",
        "--bf16",
        "--fp16",
        "--logging-steps",
        "--eval-steps",
        "--eval-strategy",
        "--save-steps",
        "--save-total-limit",
        "--report-to",
        "--do-train",
        "--no-train",
        "--do-eval",
        "--no-eval",
        "--config ",
        "--json",
        "--quiet",
        "--no-progress",
        "--dry-run",
        "--train-tokenizer",
    ):
        assert flag in proc.stdout, flag
