"""The GPU benchmark's page: MFU's terms (FLOP per token, the bf16 peak, a measured matmul),
the machine, and the tables of runs written by ``benchmarks/device.py``."""

from __future__ import annotations

import argparse
import time
from pathlib import Path
from typing import Any

from benchmarks.device_runs import Model, Result

#: Datasheet dense bf16 tensor-core peaks, TFLOP/s (no sparsity), by a part of the name
#: ``torch.cuda.get_device_name`` gives; the first match counts.
BF16_PEAKS = (
    ("B200", 2250.0),
    ("H200", 989.4),
    ("H100 PCIe", 756.5),
    ("H100 NVL", 835.5),
    ("H100", 989.4),
    ("A100", 312.0),
    ("L40S", 362.1),
    ("L4", 121.0),
)


# MFU ------------------------------------------------------------------------------------------


def flops_per_token(model: Model) -> tuple[int, int]:
    """Parameters (less the position embeddings) and training FLOP per token, 6N + 12 L T d,
    of ``model`` as lmctl builds it (its vocabulary the tokenizer's size)."""
    import torch
    from transformers import AutoConfig, AutoModelForCausalLM, AutoModelForMaskedLM

    overrides: dict[str, Any] = {"vocab_size": model.vocab}
    for item in (model.overrides or "").split(","):
        if item:
            key, value = item.split("=")
            overrides[key] = int(value)
    config = AutoConfig.for_model(model.model_type, **overrides)
    auto = AutoModelForCausalLM if model.objective == "clm" else AutoModelForMaskedLM
    with torch.device("meta"):
        built = auto.from_config(config)
    hidden, layers = config.hidden_size, config.num_hidden_layers
    params = built.num_parameters() - config.max_position_embeddings * hidden
    return params, 6 * params + 12 * layers * model.length * hidden


def bf16_peak(device_name: str, given: float | None) -> tuple[float | None, str]:
    """The bf16 peak MFU is taken against, TFLOP/s, and where the figure comes from."""
    if given is not None:
        return given, "--peak-tflops"
    for part, peak in BF16_PEAKS:
        if part in device_name:
            return peak, f"datasheet dense bf16 of the {part}"
    return None, f"unknown for {device_name}: give --peak-tflops"


def matmul_tflops(device: str, seconds: float = 1.0) -> float:
    """TFLOP/s of a square bf16 matmul on ``device``: the practical peak, for comparison."""
    import torch

    size = 8192 if device == "cuda" else 1024
    a = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    b = torch.randn(size, size, device=device, dtype=torch.bfloat16)
    torch.mm(a, b)
    count, started = 0, time.perf_counter()
    while time.perf_counter() - started < seconds:
        torch.mm(a, b)
        count += 1
    if device == "cuda":
        torch.cuda.synchronize()
    return 2 * size**3 * count / (time.perf_counter() - started) / 1e12


# The page -------------------------------------------------------------------------------------


def machine(device: str) -> dict[str, str]:
    import platform
    from importlib import metadata

    import torch
    import transformers

    info = {
        "device": torch.cuda.get_device_name() if device == "cuda" else _cpu_name(),
        "torch": torch.__version__,
        "CUDA": str(torch.version.cuda),
        "transformers": transformers.__version__,
        "python": platform.python_version(),
    }
    for package in ("accelerate", "deepspeed"):
        try:
            info[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            info[package] = "not installed"
    return info


def _cpu_name() -> str:
    cpuinfo = Path("/proc/cpuinfo")
    if cpuinfo.is_file():
        for line in cpuinfo.read_text().splitlines():
            if line.startswith("model name"):
                return f"CPU: {line.split(':', 1)[1].strip()}"
    import platform

    return f"CPU: {platform.machine()}"


def cell(value: float | None, digits: str) -> str:
    return "-" if value is None else format(value, digits)


def render(
    results: list[Result],
    info: dict[str, str],
    *,
    peak: tuple[float | None, str],
    matmul: float,
    minutes: float,
    args: argparse.Namespace,
) -> str:
    tflops, source = peak
    memory_kind = "GPU memory allocated" if info.get("CUDA") not in (None, "None") else "peak RSS"
    lines = [
        "# Benchmarks on a GPU",
        "",
        f"Written by `python benchmarks/device.py{' --smoke' if args.smoke else ''}` in "
        f"{minutes:.1f} minutes: one fresh `lmctl train` process per row, {args.steps} steps, "
        f"tokens/s between steps {args.log_every} and {args.steps}, precision "
        f"{args.precision}. Synthetic tokens (words drawn uniformly from the whole vocabulary), "
        'random weights from the models\' default configs. "all": `--fast-paths` naming '
        "every path measured on a CPU (all but fused-linear-loss, which replaces the same "
        'loss as tiled-loss); "off": `--fast-paths off`, the stock paths; a path\'s name: '
        "that path alone; the sharded runs use the defaults (`auto`), in one process under "
        "torchrun, on the trainer engine.",
        "",
        "## Machine",
        "",
        *(f"- {key}: {value}" for key, value in info.items()),
        f"- bf16 peak for MFU: {cell(tflops, '.1f')} TFLOP/s ({source})",
        f"- measured bf16 matmul: {matmul:.1f} TFLOP/s",
        "",
        "## Runs",
        "",
        f"| model | engine | fast paths | sharding | tokens/s | MFU | {memory_kind} (GiB) | "
        "loss | lmctl's log |",
        "| --- | --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for result in results:
        run = result.run
        mfu = None
        if result.tokens_per_second is not None and tflops and result.flops_per_token:
            mfu = result.tokens_per_second * result.flops_per_token / (tflops * 1e12)
        memory = None if result.peak_memory is None else result.peak_memory / 2**30
        lines.append(
            f"| {run.model.name} | {run.engine} | {run.paths} | {run.sharding or '-'} | "
            f"{cell(result.tokens_per_second, ',.0f')} | {cell(mfu, '.1%')} | "
            f"{cell(memory, '.2f')} | {cell(result.loss, '.3f')} | {result.note} |"
        )
    lines += ["", "## Against every path off", ""]
    lines += [
        "Each run against the run of the same model and engine with `--fast-paths off` "
        "(above 1x: faster, or more memory). The loss is the last logged one of the same "
        "seed and batches: a path that computes the same model lands near the same loss.",
        "",
        "| model | engine | fast paths | tokens/s / off | memory / off | loss - off |",
        "| --- | --- | --- | --- | --- | --- |",
    ]
    by_label = {result.run.label: result for result in results}
    for result in results:
        run = result.run
        if run.paths == "off" or run.sharding is not None:
            continue
        stock = by_label.get(f"{run.model.key}-{run.engine}-off")
        if stock is None:
            continue
        speed = _ratio(result.tokens_per_second, stock.tokens_per_second)
        memory = _ratio(
            None if result.peak_memory is None else float(result.peak_memory),
            None if stock.peak_memory is None else float(stock.peak_memory),
        )
        loss = (
            "-"
            if result.loss is None or stock.loss is None
            else format(result.loss - stock.loss, "+.3f")
        )
        lines.append(
            f"| {run.model.name} | {run.engine} | {run.paths} | {speed} | {memory} | {loss} |"
        )
    lines += [
        "",
        "A path is on by default on CUDA only where these figures show it faster (its row "
        "in `src/lmctl/fastpaths/table.py` names the device types it was measured faster "
        "on). MFU counts 6N + 12 L T d "
        "FLOP per token (N: parameters less the position embeddings, L layers, T tokens per "
        "sample, d hidden size), whatever a path skips (the masked head computes the "
        "output layer at the masked positions only).",
        "",
    ]
    return "\n".join(lines)


def _ratio(value: float | None, reference: float | None) -> str:
    if value is None or not reference:
        return "-"
    return f"{value / reference:.2f}x"
