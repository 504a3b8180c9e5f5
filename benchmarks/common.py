"""Helpers the benchmarks share: a generated corpus and a locally trained tokenizer.

Everything is built offline from the public-domain corpus shipped with lmctl.
"""

from __future__ import annotations

import os
import random
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from lmctl.resources import EMBEDDED_CORPUS

ROOT = Path(__file__).resolve().parent.parent


def corpus_lines() -> list[str]:
    return [line for line in EMBEDDED_CORPUS.read_text(encoding="utf-8").splitlines() if line]


def write_corpus(path: Path, megabytes: float, distinct: bool = False) -> Path:
    """A line-per-record text file of about ``megabytes`` MB: the shipped corpus in its
    natural order (blank lines, speaker names and all), copied until the size is reached.
    ``distinct`` numbers every line, so that no two lines are the same."""
    text = EMBEDDED_CORPUS.read_text(encoding="utf-8")
    lines = text.splitlines()
    target = int(megabytes * 1024 * 1024)
    written = number = 0
    with path.open("w", encoding="utf-8") as handle:
        while written < target:
            if distinct:
                chunk = "".join(f"{number + i} {line}\n" for i, line in enumerate(lines))
                number += len(lines)
            else:
                chunk = "\n".join(lines) + "\n"
            handle.write(chunk)
            written += len(chunk.encode())
    return path


def duplicate_share(path: Path, batch: int = 2048, sample_lines: int = 200_000) -> float:
    """Share of lines that repeat an earlier line of the same batch of ``batch`` lines."""
    repeated = total = 0
    with path.open(encoding="utf-8") as handle:
        while total < sample_lines:
            lines = [line for _, line in zip(range(batch), handle, strict=False)]
            if not lines:
                break
            repeated += len(lines) - len(set(lines))
            total += len(lines)
    return repeated / max(1, total)


def write_big_corpus(path: Path, megabytes: float, seed: int = 0) -> Path:
    """A large file written quickly: a 16 MB block of shuffled lines, reshuffled per copy."""
    block = corpus_lines()
    rng = random.Random(seed)
    target = int(megabytes * 1024 * 1024)
    written = 0
    with path.open("w", encoding="utf-8") as handle:
        while written < target:
            rng.shuffle(block)
            text = "\n".join(block) + "\n"
            while len(text) < 16 << 20:
                text += text
            data = text.encode()[: min(16 << 20, target - written)]
            cut = data.rfind(b"\n") + 1 or len(data)
            handle.write(data[:cut].decode())
            written += cut
    return path


def train_bpe_tokenizer(directory: Path, vocab_size: int = 8000) -> Path:
    """A byte-level BPE tokenizer (GPT-2 style) saved with save_pretrained."""
    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers
    from transformers import PreTrainedTokenizerFast

    tokenizer = Tokenizer(models.BPE())
    tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tokenizer.decoder = decoders.ByteLevel()
    trainer = trainers.BpeTrainer(
        vocab_size=vocab_size,
        special_tokens=["<|endoftext|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
        show_progress=False,
    )
    tokenizer.train_from_iterator(corpus_lines(), trainer=trainer)
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer,
        bos_token="<|endoftext|>",
        eos_token="<|endoftext|>",
        unk_token="<|endoftext|>",
        model_max_length=1024,
    )
    fast.save_pretrained(directory)
    return directory


def wordpiece_tokenizer(directory: Path, kept: Path) -> Path:
    """The BERT-style WordPiece tokenizer ([CLS] A [SEP] B [SEP], [MASK], [PAD]) kept in the
    file ``kept``, saved with save_pretrained. It was learnt once from the shipped corpus
    (BERT normalizer and pre-tokenizer, tokenizers' WordPiece trainer) and kept: that trainer
    breaks ties between equally frequent pairs in hash order, so two trainings on the same
    text differ by a token or a few and shift a hundred ids."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    PreTrainedTokenizerFast(
        tokenizer_object=Tokenizer.from_file(str(kept)),
        unk_token="[UNK]",
        pad_token="[PAD]",
        cls_token="[CLS]",
        sep_token="[SEP]",
        mask_token="[MASK]",
        model_max_length=512,
        model_input_names=["input_ids", "token_type_ids", "attention_mask"],
    ).save_pretrained(directory)
    return directory


def tokenizer_for(tokenizer_dir: Path, *, causal: bool) -> Any:
    """The tokenizer of ``tokenizer_dir`` as a benchmark's model is saved with it.

    Beside a causal LM it returns no segment ids, as GPT-2's own tokenizer: GPT-2 accepts
    ``token_type_ids`` and looks them up in its token embedding, so the upstream recipe given
    a BERT tokenizer's all-zero segment ids would add token 0's embedding at every position
    and train another model than lmctl, which trains a causal LM on token ids alone.
    """
    from transformers import AutoTokenizer

    extra = {"model_input_names": ["input_ids", "attention_mask"]} if causal else {}
    return AutoTokenizer.from_pretrained(tokenizer_dir, **extra)


def lmctl_env(**extra: str) -> dict[str, str]:
    # lmctl from this checkout, before whatever the caller's PYTHONPATH adds.
    paths = [str(ROOT / "src"), *filter(None, os.environ.get("PYTHONPATH", "").split(os.pathsep))]
    env = {**os.environ, "CI": "1", "PYTHONPATH": os.pathsep.join(paths), **extra}
    env.pop("LMCTL_DEBUG", None)
    return env


def run_lmctl(
    args: list[Any], env: dict[str, str], sample_memory: bool = False
) -> tuple[subprocess.CompletedProcess[str], float, int]:
    """Run ``python -m lmctl ARGS``; return the process, wall seconds and peak RSS in bytes
    (the largest sum over the process and its children, sampled every 50 ms)."""
    import psutil

    started = time.monotonic()
    process = subprocess.Popen(
        [sys.executable, "-m", "lmctl", *map(str, args)],
        env=env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )
    peak = 0
    if sample_memory:
        watched = psutil.Process(process.pid)
        while process.poll() is None:
            try:
                tree = [watched, *watched.children(recursive=True)]
                peak = max(peak, sum(_rss(member) for member in tree))
            except psutil.NoSuchProcess:
                pass
            time.sleep(0.05)
    stdout, stderr = process.communicate()
    elapsed = time.monotonic() - started
    done = subprocess.CompletedProcess(process.args, process.returncode, stdout, stderr)
    if done.returncode != 0:
        sys.stderr.write(stderr[-4000:])
        raise SystemExit(f"lmctl failed with exit code {done.returncode}")
    return done, elapsed, peak


def _rss(process: Any) -> int:
    import psutil

    try:
        return int(process.memory_info().rss)
    except psutil.NoSuchProcess:
        return 0
