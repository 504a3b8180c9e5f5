"""The suite's training sections: throughput of each objective on both engines against the
baseline, and the model FLOP utilisation (MFU) of the clm runs."""

from __future__ import annotations

import json
import shutil
from collections.abc import Callable
from pathlib import Path
from typing import Any

from benchmarks.common import run_lmctl
from benchmarks.figures import Figure, interleave
from benchmarks.workload import (
    Work,
    matmul_peak,
    run_upstream,
    text_lines,
    write_lines,
    write_text_of_size,
)


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
        variants["baseline"] = lambda: run_upstream(work, upstream_args)
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
