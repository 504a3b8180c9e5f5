"""The suite's sections before the first training step: start-up and preprocessing."""

from __future__ import annotations

import os
import sys
import time
from collections.abc import Callable

from benchmarks.figures import Figure, interleave, wall
from benchmarks.workload import Work, write_text_of_size


def startup(work: Work, reps: int) -> list[Figure]:
    env = work.env()
    lmctl = [sys.executable, "-m", "lmctl"]
    stack = [
        sys.executable,
        "-c",
        "import torch, transformers, datasets, accelerate, evaluate; "
        "from transformers import HfArgumentParser, Trainer, TrainingArguments",
    ]
    commands = {
        "lmctl --help": ([*lmctl, "--help"], (0,)),
        "lmctl train clm --help": ([*lmctl, "train", "clm", "--help"], (0,)),
        "config error (exit 2)": ([*lmctl, "train", "clm", "--learning-rate", "-1"], (2,)),
    }
    sides: dict[str, Callable[[], float]] = {"stack": lambda: wall(stack, env)}
    for name, (command, codes) in commands.items():
        sides[name] = lambda command=command, codes=codes: wall(command, env, codes)
    runs = interleave(reps, sides)  # one stack import per round serves all three ratios
    note = "baseline: importing the stack an upstream script imports before parsing flags"
    return [
        Figure("start-up", name, "s", runs[name], runs["stack"], "lower", 10.0, note)
        for name in commands
    ]


def preprocessing(work: Work, reps: int, megabytes: float) -> list[Figure]:
    """Tokens/s of clm grouping and mlm line by line, in this process, both sides alternating."""
    import contextlib
    import io

    import datasets
    from transformers import AutoTokenizer

    from benchmarks.upstream import group_recipe, line_recipe
    from lmctl.config.loader import build_config
    from lmctl.config.slices import DataSpec, LoopSpec, take
    from lmctl.console import Console, OutputOptions
    from lmctl.objectives.clm import ClmConfig
    from lmctl.objectives.common import tokenize_and_group, tokenize_lines
    from lmctl.objectives.mlm import MlmConfig

    os.environ.pop("TOKENIZERS_PARALLELISM", None)
    datasets.disable_progress_bars()
    corpus = write_text_of_size(work.root / "corpus.txt", megabytes)
    tokenizer = AutoTokenizer.from_pretrained(work.tokenizer)
    raw = datasets.load_dataset(
        "text", data_files=str(corpus), split="train", cache_dir=str(work.root / "hf")
    )
    total_tokens = 0

    def lmctl_side(kind: str, workers: int) -> float:
        nonlocal total_tokens
        values = {
            "train_file": str(corpus),
            "tokenizer_name": str(work.tokenizer),
            "do_eval": False,
            "prepared_cache_dir": str(work.fresh("prepared")),
            "cache_dir": str(work.fresh("hf")),
            "preprocessing_num_workers": workers if workers > 1 else None,
            "overwrite_cache": True,
        }
        console = Console(OutputOptions(quiet=True))
        started = time.perf_counter()
        with contextlib.redirect_stderr(io.StringIO()):
            if kind == "clm":
                config = build_config(ClmConfig, cli_values={**values, "model_type": "gpt2"})
                out = tokenize_and_group(
                    datasets.DatasetDict({"train": raw}),
                    tokenizer,
                    128,
                    console,
                    data=take(DataSpec, config),
                    loop=take(LoopSpec, config),
                    text_options={"keep_linebreaks": config.keep_linebreaks},
                )
            else:
                config = build_config(
                    MlmConfig, cli_values={**values, "model_type": "bert", "line_by_line": True}
                )
                out = tokenize_lines(
                    datasets.DatasetDict({"train": raw}),
                    tokenizer,
                    128,
                    console,
                    data=take(DataSpec, config),
                    loop=take(LoopSpec, config),
                    text_options={},
                    special_tokens_mask=True,
                )
        elapsed = time.perf_counter() - started
        if kind == "mlm":
            from lmctl.data.batching import sample_lengths

            total_tokens = sum(sample_lengths(out["train"]))
        return elapsed

    def baseline_side(kind: str, workers: int) -> float:
        started = time.perf_counter()
        if kind == "clm":
            group_recipe(raw, tokenizer, 128, "text", workers if workers > 1 else None)
        else:
            line_recipe(raw, tokenizer, 128, "text", workers if workers > 1 else None)
        return time.perf_counter() - started

    figures = []
    cores = os.cpu_count() or 1
    settings = [("clm", 1), ("mlm", 1)] + ([("clm", cores), ("mlm", cores)] if cores > 1 else [])
    for kind, workers in settings:
        runs = interleave(
            reps,
            {
                "lmctl": lambda kind=kind, workers=workers: lmctl_side(kind, workers),
                "baseline": lambda kind=kind, workers=workers: baseline_side(kind, workers),
            },
        )
        what = "clm grouping" if kind == "clm" else "mlm line by line"
        setting = "default settings" if workers == 1 else f"{workers} workers"
        size = corpus.stat().st_size / 2**20
        figures.append(
            Figure(
                "preprocessing",
                f"{what}, {size:.0f} MB, {setting}",
                "MB/s",
                [size / t for t in runs["lmctl"]],
                [size / t for t in runs["baseline"]],
                "higher",
                2.0 if workers == 1 else None,
            )
        )
    figures.append(
        Figure(
            "preprocessing",
            "tokens in the corpus (mlm line by line, truncated to 128)",
            "tokens",
            [float(total_tokens)],
            note="MB/s times tokens/MB gives tokens/s",
        )
    )
    return figures
