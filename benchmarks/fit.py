"""The fit check's memory estimate (``lmctl.run.fit``) against the measured peak of training.

For six shapes (clm and mlm; fp32 and bf16 autocast; with and without gradient
checkpointing) a subprocess builds the model from its config, then trains it a few steps the
way the engines do (AdamW, fp32 weights, autocast for bf16), and reports its peak resident
memory (``VmHWM``, reset with ``/proc/self/clear_refs`` after the imports) minus its resident
memory before the model was built. glibc's allocator is told to return large blocks at once
(``MALLOC_ARENA_MAX=1``, ``MALLOC_MMAP_THRESHOLD_``, ``MALLOC_TRIM_THRESHOLD_``), so that
the peak is the tensors' and not the allocator's caching. Prints one row per shape with the
ratio estimate / measured.

    python benchmarks/fit.py [--steps 3] [--markdown]
"""

from __future__ import annotations

import argparse
import json
import os
import subprocess
import sys
import time
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent.parent / "src"))

#: (name, objective, precision, gradient checkpointing)
SHAPES = [
    ("clm fp32", "clm", None, False),
    ("clm bf16", "clm", "bf16", False),
    ("clm fp32, checkpointing", "clm", None, True),
    ("mlm fp32", "mlm", None, False),
    ("mlm bf16", "mlm", "bf16", False),
    ("mlm bf16, checkpointing", "mlm", "bf16", True),
]
LAYERS, HIDDEN, HEADS, VOCAB, LENGTH, BATCH = 4, 256, 4, 8000, 256, 8

ALLOCATOR = {
    "MALLOC_ARENA_MAX": "1",
    "MALLOC_MMAP_THRESHOLD_": "65536",
    "MALLOC_TRIM_THRESHOLD_": "0",
}


def _status(key: str) -> int:
    for line in Path("/proc/self/status").read_text().splitlines():
        if line.startswith(key + ":"):
            return int(line.split()[1]) * 1024
    raise KeyError(key)


def child(objective: str, precision: str | None, checkpointing: bool, steps: int) -> dict:
    import torch
    from transformers import (
        AutoModelForCausalLM,
        AutoModelForMaskedLM,
        BertConfig,
        GPT2Config,
    )

    from lmctl.run.fit import ModelSize, Shape, estimate

    torch.manual_seed(0)
    torch.set_num_threads(2)
    if objective == "clm":
        config = GPT2Config(
            n_layer=LAYERS, n_embd=HIDDEN, n_head=HEADS, vocab_size=VOCAB, n_positions=LENGTH
        )
        auto = AutoModelForCausalLM
    else:
        config = BertConfig(
            num_hidden_layers=LAYERS,
            hidden_size=HIDDEN,
            num_attention_heads=HEADS,
            intermediate_size=4 * HIDDEN,
            vocab_size=VOCAB,
            max_position_embeddings=LENGTH,
        )
        auto = AutoModelForMaskedLM
    ids = torch.randint(0, VOCAB, (BATCH, LENGTH))
    if objective == "clm":
        labels = ids.clone()
    else:
        labels = torch.full_like(ids, -100)
        chosen = torch.rand(ids.shape) < 0.15
        labels[chosen] = ids[chosen]
    # Baseline: the libraries loaded, the batch made; nothing of the model yet.
    Path("/proc/self/clear_refs").write_text("5")
    baseline = _status("VmRSS")
    model = auto.from_config(config)
    if checkpointing:
        model.gradient_checkpointing_enable()
    model.train()
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-4)
    started = time.monotonic()
    for _ in range(steps):
        with torch.autocast("cpu", dtype=torch.bfloat16, enabled=precision == "bf16"):
            loss = model(input_ids=ids, labels=labels).loss
        loss.backward()
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
    seconds = time.monotonic() - started
    peak = _status("VmHWM") - baseline
    size = ModelSize(
        parameters=sum(p.numel() for p in model.parameters()),
        layers=LAYERS,
        hidden=HIDDEN,
        vocab=VOCAB,
        heads=HEADS,
    )
    shape = Shape(batch=BATCH, length=LENGTH, precision=precision, checkpointing=checkpointing)
    e = estimate(size, shape)
    return {
        "parameters": size.parameters,
        "estimate": e.total,
        "parts": [e.weights, e.gradients, e.optimizer, e.activations],
        "measured": peak,
        "seconds": seconds,
    }


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--steps", type=int, default=2)
    parser.add_argument("--markdown", action="store_true")
    parser.add_argument("--child", help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.child:
        objective, precision, checkpointing = json.loads(args.child)
        print(json.dumps(child(objective, precision, checkpointing, args.steps)))
        return
    rows = []
    for name, objective, precision, checkpointing in SHAPES:
        proc = subprocess.run(
            [
                sys.executable,
                __file__,
                "--steps",
                str(args.steps),
                "--child",
                json.dumps([objective, precision, checkpointing]),
            ],
            env={**os.environ, **ALLOCATOR},
            capture_output=True,
            text=True,
            check=True,
        )
        result = json.loads(proc.stdout.strip().splitlines()[-1])
        ratio = result["estimate"] / result["measured"]
        rows.append((name, result, ratio))
        if not args.markdown:
            print(
                f"{name:<26} estimate {result['estimate'] / 2**20:8.1f} MiB  measured "
                f"{result['measured'] / 2**20:8.1f} MiB  ratio {ratio:.2f}  "
                f"({result['seconds']:.1f} s)",
                flush=True,
            )
    if args.markdown:
        print(
            "| shape | parameters | estimate (MiB) | measured peak (MiB) | estimate / measured "
            "| within ±25% |"
        )
        print("| --- | --- | --- | --- | --- | --- |")
        for name, result, ratio in rows:
            within = "yes" if 0.75 <= ratio <= 1.25 else "no"
            print(
                f"| {name} | {result['parameters'] / 1e6:.1f}M | {result['estimate'] / 2**20:.0f} "
                f"| {result['measured'] / 2**20:.0f} | {ratio:.2f} | {within} |"
            )


if __name__ == "__main__":
    main()
