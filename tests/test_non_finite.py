"""Results are strict JSON: a NaN or infinity is written as null, with a ``non_finite`` note."""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import pytest

from lmctl.run import history
from tests.conftest import lmctl


def strict(text: str) -> Any:
    def refuse(name: str) -> None:
        raise ValueError(f"not strict JSON: {name}")

    return json.loads(text, parse_constant=refuse)


def broken_model(folder: Path, tokenizer: Path, damage: str) -> Path:
    """A tiny GPT-2 whose eval loss overflows exp() (``huge``) or is NaN (``nan``)."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    tok = AutoTokenizer.from_pretrained(tokenizer)
    config = GPT2Config(
        n_layer=1,
        n_embd=16,
        n_head=2,
        vocab_size=len(tok),
        n_positions=64,
        bos_token_id=0,
        eos_token_id=0,
    )
    model = GPT2LMHeadModel(config)
    with torch.no_grad():
        if damage == "huge":
            model.transformer.wte.weight.mul_(1e5)
        else:
            model.transformer.ln_f.weight.fill_(math.nan)
    model.save_pretrained(folder)
    tok.save_pretrained(folder)
    return folder


@pytest.mark.parametrize(("damage", "keys"), [("huge", ["perplexity"]), ("nan", None)])
def test_eval_writes_strict_json(
    tmp_path: Path,
    text_files: tuple[Path, Path],
    bpe_tokenizer: Path,
    damage: str,
    keys: list[str] | None,
) -> None:
    model = broken_model(tmp_path / "model", bpe_tokenizer, damage)
    output = tmp_path / "results.json"
    proc = lmctl(
        "eval",
        model,
        "--task",
        "clm",
        "--validation-file",
        text_files[1],
        "--block-size",
        "32",
        "--max-eval-samples",
        "8",
        "--output",
        output,
        "--json",
    )
    assert proc.returncode == 0, proc.stderr
    payload = strict(proc.stdout)
    assert proc.stdout.count("\n") == 1
    written = strict(output.read_text())
    for data in (payload["metrics"], written):
        assert data["perplexity"] is None
        if keys is None:
            assert data["eval_loss"] is None
        else:
            assert isinstance(data["eval_loss"], float)
    if keys is not None:
        assert written["non_finite"] == keys
    else:
        assert {"eval_loss", "perplexity"} <= set(written["non_finite"])
    assert payload["non_finite"] == [f"metrics.{key}" for key in written["non_finite"]]


def test_results_and_metrics_log_are_strict(tmp_path: Path) -> None:
    history.save_results(tmp_path, "eval", {"eval_loss": math.inf, "eval_accuracy": 0.5})
    history.save_results(tmp_path, "train", {"train_loss": math.nan})
    everything = strict((tmp_path / "all_results.json").read_text())
    assert everything["eval_loss"] is None and everything["train_loss"] is None
    assert sorted(everything["non_finite"]) == ["eval_loss", "train_loss"]
    history.save_results(tmp_path, "eval", {"eval_loss": 1.5})
    assert strict((tmp_path / "all_results.json").read_text())["non_finite"] == ["train_loss"]
    history.append_metrics(tmp_path, {"step": 3, "loss": 2.0, "grad_norm": math.inf})
    record = strict((tmp_path / "metrics.jsonl").read_text())
    assert record["grad_norm"] is None and record["non_finite"] == ["grad_norm"]
