"""The reliability tier: bad input, fuzzing, faults and secrets across every command.

Every test under this folder is marked ``reliability``; run the tier with
``python -m pytest -m reliability tests/reliability``. It ends with one summary line of
figures (cases tried, clean exits, tracebacks, exit-1s, user files changed, secrets found).
"""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from tests.conftest import corpus_lines, swag_records, write_jsonl
from tests.reliability.harness import forked

HERE = Path(__file__).parent

#: The tiny GPT-2 that every fault trial trains (seconds per run on a CPU).
TINY = "n_layer=1,n_embd=32,n_head=2,n_positions=64"
FAULT_STEPS = 9
FAULT_SAVE_STEPS = 3


def pytest_collection_modifyitems(config: pytest.Config, items: list[pytest.Item]) -> None:
    for item in items:
        if HERE in Path(str(item.path)).parents:
            item.add_marker(pytest.mark.reliability)


@pytest.fixture(scope="session")
def corpus(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A small training text (300 lines)."""
    path = tmp_path_factory.mktemp("corpus") / "train.txt"
    path.write_text("\n".join(corpus_lines()[:300]) + "\n", encoding="utf-8")
    return path


@pytest.fixture(scope="session")
def swag_data(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    folder = tmp_path_factory.mktemp("swag-small")
    return (
        write_jsonl(folder / "train.jsonl", swag_records(40, seed=1)),
        write_jsonl(folder / "valid.jsonl", swag_records(8, seed=2)),
    )


def fault_args(tokenizer: Path, corpus: Path, out: Path, *extra: str) -> list[str]:
    return [
        "train",
        "clm",
        "--model-type",
        "gpt2",
        "--config-overrides",
        TINY,
        "--tokenizer-name",
        str(tokenizer),
        "--train-file",
        str(corpus),
        "--block-size",
        "32",
        "--per-device-train-batch-size",
        "4",
        "--max-steps",
        str(FAULT_STEPS),
        "--save-steps",
        str(FAULT_SAVE_STEPS),
        "--logging-steps",
        "1",
        "--no-eval",
        "-o",
        str(out),
        *extra,
    ]


@pytest.fixture(scope="session")
def reference_run(
    tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer: Path, corpus: Path
) -> Path:
    """One uninterrupted run that the fault trials compare with, and that the bad-input
    table copies to get a real run directory (checkpoints, final model, results)."""
    folder = tmp_path_factory.mktemp("reference")
    out = folder / "run"
    outcome = forked(fault_args(bpe_tokenizer, corpus, out), folder / "train")
    assert outcome.code == 0, outcome.stderr
    return out


@pytest.fixture
def run_copy(reference_run: Path, tmp_path: Path) -> Path:
    """A private copy of the reference run (a case may try to damage it)."""
    copy = tmp_path / "run"
    shutil.copytree(reference_run, copy)
    return copy


@pytest.fixture(scope="session")
def tiny_models(tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer: Path) -> dict[str, Path]:
    """Saved tiny models: a GPT-2 (causal LM) and a BERT and an XLNet, each with a tokenizer."""
    from transformers import (
        AutoTokenizer,
        BertConfig,
        BertForMaskedLM,
        GPT2Config,
        GPT2LMHeadModel,
    )

    root = tmp_path_factory.mktemp("models")
    gpt2 = root / "gpt2"
    GPT2LMHeadModel(
        GPT2Config(vocab_size=400, n_layer=1, n_embd=32, n_head=2, n_positions=64)
    ).save_pretrained(gpt2)
    AutoTokenizer.from_pretrained(bpe_tokenizer).save_pretrained(gpt2)
    bert = root / "bert"
    BertForMaskedLM(
        BertConfig(
            vocab_size=400,
            hidden_size=32,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=64,
            max_position_embeddings=64,
        )
    ).save_pretrained(bert)
    # the BPE tokenizer has no [MASK]/[CLS]/[SEP] tokens: a tokenizer mlm and swag cannot use
    AutoTokenizer.from_pretrained(bpe_tokenizer).save_pretrained(bert)
    return {"gpt2": gpt2, "bert": bert}
