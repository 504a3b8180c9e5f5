"""Shared fixtures: tiny data and tokenizers built locally, and a way to run the CLI.

Nothing here touches the network: tokenizers are trained with the ``tokenizers`` library on
text that ships with lmctl, and models are built from small configs.
"""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

import pytest

from lmctl.resources import EMBEDDED_CORPUS

FIXTURES = Path(__file__).parent / "fixtures"


@pytest.fixture(scope="session", autouse=True)
def isolated_caches(tmp_path_factory: pytest.TempPathFactory) -> None:
    """Keep Hugging Face and lmctl caches of the test run away from the user's."""
    home = tmp_path_factory.mktemp("hf-home")
    os.environ["HF_HOME"] = str(home)
    os.environ["HF_DATASETS_CACHE"] = str(home / "datasets")
    os.environ["LMCTL_CACHE"] = str(tmp_path_factory.mktemp("lmctl-cache"))
    os.environ.setdefault("TOKENIZERS_PARALLELISM", "false")


def corpus_lines() -> list[str]:
    return [line for line in EMBEDDED_CORPUS.read_text(encoding="utf-8").splitlines() if line]


@pytest.fixture(scope="session")
def text_files(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """A small train/validation pair of plain-text files."""
    lines = corpus_lines()
    folder = tmp_path_factory.mktemp("text")
    train = folder / "train.txt"
    valid = folder / "valid.txt"
    train.write_text("\n".join(lines[:1500]) + "\n", encoding="utf-8")
    valid.write_text("\n".join(lines[1500:1700]) + "\n", encoding="utf-8")
    return train, valid


@pytest.fixture(scope="session")
def bpe_tokenizer(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A byte-level BPE tokenizer (GPT-2 style) saved with save_pretrained."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=400,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines()[:3000], trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=128,
    )
    path = tmp_path_factory.mktemp("tokenizer-bpe")
    fast.save_pretrained(path)
    return path


def lmctl(
    *args: str | Path,
    cwd: Path | None = None,
    env: dict[str, str] | None = None,
    timeout: float = 600,
) -> subprocess.CompletedProcess[str]:
    """Run ``python -m lmctl`` the way a CI job would (no terminal, CI set)."""
    full_env = {**os.environ, "CI": "1", **(env or {})}
    full_env.pop("LMCTL_DEBUG", None)
    return subprocess.run(
        [sys.executable, "-m", "lmctl", *map(str, args)],
        cwd=cwd,
        env=full_env,
        capture_output=True,
        text=True,
        timeout=timeout,
        check=False,
    )


TINY_GPT2 = ("--model-type", "gpt2", "--config-overrides", "n_layer=2,n_embd=64,n_head=2")
