"""At its defaults, lmctl learns what the upstream recipe learns: the same saved model, data,
steps and hyper-parameters through `benchmarks/upstream.py` (the example scripts' recipe with
the Trainer's defaults) and through `lmctl train` end with eval losses within 2%, for every
objective."""

from __future__ import annotations

import json
import os
import random
import subprocess
import sys
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import corpus_lines, lmctl, swag_records, write_jsonl

ROOT = Path(__file__).resolve().parent.parent
UPSTREAM = ROOT / "benchmarks" / "upstream.py"
STEPS = 40

pytestmark = pytest.mark.slow


def numbered_lines(count: int, seed: int, low: int, high: int) -> list[str]:
    """Distinct lines of ``low`` to ``high`` words from the shipped corpus."""
    words = " ".join(corpus_lines()).split()
    rng = random.Random(seed)
    lines = []
    for number in range(count):
        size = rng.randint(low, high)
        start = rng.randrange(len(words) - size)
        lines.append(f"{number} " + " ".join(words[start : start + size]))
    return lines


def save_model(objective: str, tokenizer_path: Path, where: Path) -> Path:
    """A 2 x 64 model of the objective with random weights (seed 0), saved with its tokenizer."""
    import torch
    import transformers
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(tokenizer_path)
    vocab = len(tokenizer)
    torch.manual_seed(0)
    model: Any
    if objective == "clm":
        model = transformers.GPT2LMHeadModel(
            transformers.GPT2Config(
                vocab_size=vocab, n_embd=64, n_layer=2, n_head=2, n_positions=128
            )
        )
    elif objective == "plm":
        model = transformers.XLNetLMHeadModel(
            transformers.XLNetConfig(
                vocab_size=vocab, d_model=64, n_layer=2, n_head=2, d_inner=256,
                pad_token_id=tokenizer.pad_token_id,
            )
        )  # fmt: skip
    else:
        bert = transformers.BertConfig(
            vocab_size=vocab, hidden_size=64, num_hidden_layers=2, num_attention_heads=2,
            intermediate_size=256, max_position_embeddings=128,
            pad_token_id=tokenizer.pad_token_id,
        )  # fmt: skip
        kind = (
            transformers.BertForMaskedLM
            if objective == "mlm"
            else transformers.BertForMultipleChoice
        )
        model = kind(bert)
    model.save_pretrained(where)
    tokenizer.save_pretrained(where)
    return where


def upstream(args: list[Any], out: Path) -> dict[str, Any]:
    env = {**os.environ, "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1"}
    done = subprocess.run(
        [sys.executable, str(UPSTREAM), *map(str, args), "--output-dir", out / "run", "--out",
         out / "results.json"],
        env=env, capture_output=True, text=True, check=False, timeout=900,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-3000:]
    results: dict[str, Any] = json.loads((out / "results.json").read_text())
    return results


def both(
    tmp_path: Path, objective: str, model: Path, data: list[Path], shape: list[Any]
) -> tuple[float, float]:
    """The final eval loss of the upstream recipe and of lmctl at its defaults."""
    train, valid = data
    common = ["--train-file", train, "--validation-file", valid, "--max-steps", STEPS,
              "--learning-rate", "2e-3", *shape]  # fmt: skip
    baseline = upstream([objective, "--model", model, *common, "--batch-size", 8],
                        tmp_path / "upstream")  # fmt: skip
    out = tmp_path / "lmctl"
    proc = lmctl(
        "train", objective, "--model", model, *common, "--per-device-train-batch-size", 8,
        "--per-device-eval-batch-size", 8, "--save-strategy", "no", "-o", out,
        cwd=tmp_path, timeout=900,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    ours = json.loads((out / "all_results.json").read_text())
    return baseline["eval_loss"], ours["eval_loss"]


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def test_clm_learns_what_upstream_learns(tmp_path: Path, bpe_tokenizer: Path) -> None:
    model = save_model("clm", bpe_tokenizer, tmp_path / "model")
    train = write_lines(tmp_path / "train.txt", numbered_lines(1500, 1, 5, 40))
    valid = write_lines(tmp_path / "valid.txt", numbered_lines(300, 2, 5, 40))
    theirs, ours = both(tmp_path, "clm", model, [train, valid], ["--block-size", 64])
    assert ours == pytest.approx(theirs, rel=0.02), (theirs, ours)


def test_clm_on_the_same_blocks_trains_the_same_model_as_upstream(
    tmp_path: Path, bpe_tokenizer: Path
) -> None:
    """Below 1,000 lines upstream's grouping (each 1,000 lines on their own) cuts the blocks
    lmctl's (the whole text) cuts; then the batches, dropout and optimizer are upstream's too,
    fast paths on, and the two end far closer than another seed would take them (about 0.5%):
    0.04% apart after 40 steps (the step losses agree to 1e-7 for three steps, then drift)."""
    model = save_model("clm", bpe_tokenizer, tmp_path / "model")
    train = write_lines(tmp_path / "train.txt", numbered_lines(999, 1, 5, 40))
    valid = write_lines(tmp_path / "valid.txt", numbered_lines(300, 2, 5, 40))
    theirs, ours = both(tmp_path, "clm", model, [train, valid], ["--block-size", 64])
    assert ours == pytest.approx(theirs, rel=1e-3), (theirs, ours)


@pytest.mark.parametrize("objective", ["mlm", "plm"])
def test_line_by_line_learns_what_upstream_learns(
    tmp_path: Path, wordpiece_tokenizer: Path, objective: str
) -> None:
    """Line by line, where lengths vary: the defaults (no length grouping) learn as upstream."""
    model = save_model(objective, wordpiece_tokenizer, tmp_path / "model")
    train = write_lines(tmp_path / "train.txt", numbered_lines(STEPS * 8, 3, 2, 40))
    # Many evaluation lines: upstream draws new masks at every evaluation.
    valid = write_lines(tmp_path / "valid.txt", numbered_lines(1200, 4, 2, 40))
    theirs, ours = both(
        tmp_path, objective, model, [train, valid], ["--line-by-line", "--max-seq-length", 64]
    )
    assert ours == pytest.approx(theirs, rel=0.02), (theirs, ours)


def test_multiple_choice_learns_what_upstream_learns(
    tmp_path: Path, wordpiece_tokenizer: Path
) -> None:
    model = save_model("swag", wordpiece_tokenizer, tmp_path / "model")
    train = write_jsonl(tmp_path / "train.jsonl", swag_records(STEPS * 8, seed=5))
    valid = write_jsonl(tmp_path / "valid.jsonl", swag_records(200, seed=6))
    theirs, ours = both(tmp_path, "swag", model, [train, valid], ["--max-seq-length", 64])
    assert ours == pytest.approx(theirs, rel=0.02), (theirs, ours)
