"""Tokenize-and-group throughput: lmctl against the plain upstream recipe.

Both start from the same raw ``datasets.Dataset`` (a 64 MB line-per-record text file: the
shipped public-domain corpus in natural order, repeated), use the same tokenizer and the same
number of worker processes, and run alternately in this one process; the best wall time of
each is compared.

* upstream: ``run_clm.py``'s recipe — ``Dataset.map`` of ``tokenizer(texts)`` (ids and
  attention masks), then ``Dataset.map`` of ``group_texts`` (``itertools.chain`` into lists,
  slicing into blocks, a ``labels`` copy), ``num_proc`` workers;
* lmctl: ``tokenize_and_group`` as ``lmctl train``/``lmctl prepare`` run it on a cache miss
  (fast batch encoding into a flat int32 array, numpy blocks written straight to Arrow, the
  manifest and tokenizer hash included), ``--preprocessing-num-workers`` workers.

``TOKENIZERS_PARALLELISM=false`` for both, so the worker count is the only parallelism.

    python benchmarks/preprocess_speed.py [--size-mb 64] [--workers 1] [--repeats 2] [--distinct]

``--distinct`` numbers every line, for text without the repeated lines that lmctl encodes
once (blank lines and the like are 29% of this corpus's lines, counted per batch).

Prints the wall and CPU times and the ratio upstream / lmctl (lmctl aims at >= 2).
"""

from __future__ import annotations

import argparse
import os
import resource
import shutil
import sys
import tempfile
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))
sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
os.environ["TOKENIZERS_PARALLELISM"] = "false"

from benchmarks.common import duplicate_share, train_bpe_tokenizer, write_corpus
from benchmarks.upstream import group_recipe


def upstream_recipe(raw: Any, tokenizer: Any, block_size: int, workers: int) -> Any:
    """Exactly what run_clm.py does (tokenize_function and group_texts)."""
    return group_recipe(raw, tokenizer, block_size, "text", workers if workers > 1 else None)


def lmctl_pipeline(
    raw: Any,
    tokenizer: Any,
    *,
    corpus: Path,
    tokenizer_dir: Path,
    cache: Path,
    block_size: int,
    workers: int,
) -> Any:
    import contextlib
    import io

    import datasets

    from lmctl.config.loader import build_config
    from lmctl.config.slices import DataSpec, LoopSpec, take
    from lmctl.console import Console, OutputOptions
    from lmctl.objectives.clm import ClmConfig
    from lmctl.objectives.common import tokenize_and_group

    config = build_config(
        ClmConfig,
        cli_values={
            "train_file": str(corpus),
            "model_type": "gpt2",
            "tokenizer_name": str(tokenizer_dir),
            "do_eval": False,
            "prepared_cache_dir": str(cache),
            "preprocessing_num_workers": workers,
            "overwrite_cache": True,
        },
    )
    with contextlib.redirect_stderr(io.StringIO()):
        splits = tokenize_and_group(
            datasets.DatasetDict({"train": raw}),
            tokenizer,
            block_size,
            Console(OutputOptions(quiet=True)),
            data=take(DataSpec, config),
            loop=take(LoopSpec, config),
            text_options={"keep_linebreaks": config.keep_linebreaks},
        )
    return splits["train"]


def measure(function: Callable[[], Any]) -> tuple[float, float, Any]:
    """Wall seconds, CPU seconds (this process and its finished children), result."""

    def cpu() -> float:
        own = resource.getrusage(resource.RUSAGE_SELF)
        children = resource.getrusage(resource.RUSAGE_CHILDREN)
        return own.ru_utime + own.ru_stime + children.ru_utime + children.ru_stime

    cpu_before, wall_before = cpu(), time.perf_counter()
    result = function()
    return time.perf_counter() - wall_before, cpu() - cpu_before, result


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--size-mb", type=float, default=64)
    parser.add_argument("--workers", type=int, default=1)
    parser.add_argument("--block-size", type=int, default=1024)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--tokenizer", help="a tokenizer directory (default: train a BPE one)")
    parser.add_argument(
        "--distinct", action="store_true", help="number every line so that none repeats"
    )
    args = parser.parse_args()

    import datasets
    from transformers import AutoTokenizer

    datasets.disable_progress_bars()
    work = Path(tempfile.mkdtemp(prefix="lmctl-bench-"))
    try:
        corpus = write_corpus(work / "corpus.txt", args.size_mb, distinct=args.distinct)
        tokenizer_dir = (
            Path(args.tokenizer) if args.tokenizer else train_bpe_tokenizer(work / "tok")
        )
        tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
        raw = datasets.load_dataset(
            "text",
            data_files=str(corpus),
            split="train",
            cache_dir=str(work / "hf"),
            keep_linebreaks=True,
        )
        size_mb = corpus.stat().st_size / 2**20
        print(
            f"corpus: {size_mb:.1f} MB, {len(raw)} lines; workers: {args.workers}; "
            f"block size {args.block_size}; cpus: {os.cpu_count()}; "
            f"TOKENIZERS_PARALLELISM={os.environ['TOKENIZERS_PARALLELISM']}; "
            f"lines repeating within a 2048-line batch: {duplicate_share(corpus):.0%}"
        )
        best: dict[str, tuple[float, float]] = {}
        blocks: dict[str, Any] = {}
        for attempt in range(args.repeats):
            runs = {
                "lmctl": lambda attempt=attempt: lmctl_pipeline(
                    raw,
                    tokenizer,
                    corpus=corpus,
                    tokenizer_dir=tokenizer_dir,
                    cache=work / f"cache-{attempt}",
                    block_size=args.block_size,
                    workers=args.workers,
                ),
                "upstream": lambda: upstream_recipe(raw, tokenizer, args.block_size, args.workers),
            }
            for name, function in runs.items():
                wall, cpu, result = measure(function)
                print(f"  run {attempt + 1} {name:<8} wall {wall:7.2f} s  cpu {cpu:7.2f} s")
                if name not in best or wall < best[name][0]:
                    best[name] = (wall, cpu)
                blocks[name] = result
        first_same = blocks["lmctl"][0]["input_ids"] == blocks["upstream"][0]["input_ids"]
        print(
            f"blocks: lmctl {len(blocks['lmctl'])}, upstream {len(blocks['upstream'])} "
            f"(upstream drops the remainder of every 1000-record batch); "
            f"first block identical: {first_same}"
        )
        wall_ratio = best["upstream"][0] / best["lmctl"][0]
        cpu_ratio = best["upstream"][1] / best["lmctl"][1]
        print(
            f"best wall: lmctl {best['lmctl'][0]:.2f} s, upstream {best['upstream'][0]:.2f} s; "
            f"MB/s: lmctl {size_mb / best['lmctl'][0]:.2f}, "
            f"upstream {size_mb / best['upstream'][0]:.2f}"
        )
        print(f"speed ratio (upstream / lmctl wall time): {wall_ratio:.2f}x")
        print(f"cpu ratio (upstream / lmctl cpu time): {cpu_ratio:.2f}x")
        return 0
    finally:
        shutil.rmtree(work, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
