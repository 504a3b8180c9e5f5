"""The GPU benchmark's runs: the models, the runs of each (engine, fast paths, sharding), their
inputs (a word-level tokenizer, synthetic text, sharding configs) and ``lmctl train`` command
lines. ``benchmarks/device.py`` runs them."""

from __future__ import annotations

import argparse
import json
import random
from dataclasses import dataclass
from pathlib import Path
from typing import get_args

from lmctl.config.base import FastPathName

FAST_PATHS = get_args(FastPathName)


@dataclass(frozen=True)
class Model:
    key: str
    name: str
    objective: str
    model_type: str
    #: Tokens per sample (clm's --block-size, mlm's --max-seq-length) and samples per batch.
    length: int
    batch: int
    vocab: int
    #: --config-overrides (the smoke run's tiny models); the default configs otherwise.
    overrides: str | None = None

    @property
    def specials(self) -> tuple[str, ...]:
        if self.objective == "clm":
            return ("<|endoftext|>",)
        return ("[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]")


GPT2 = Model("gpt2", "GPT-2 124M", "clm", "gpt2", 1024, 8, 50257)
BERT = Model("bert", "BERT-base", "mlm", "bert", 512, 16, 30522)
SMOKE_MODELS = (
    Model("gpt2", "GPT-2 (1 x 64)", "clm", "gpt2", 64, 2, 500, "n_layer=1,n_embd=64,n_head=2"),
    Model(
        "bert",
        "BERT (1 x 64)",
        "mlm",
        "bert",
        64,
        2,
        500,
        "num_hidden_layers=1,hidden_size=64,num_attention_heads=2,intermediate_size=128",
    ),
)


@dataclass(frozen=True)
class Run:
    model: Model
    engine: str
    #: "all" (every path measured on a CPU named), "off", "auto" (the sharded runs: the
    #: defaults), or the name of one path (that path alone).
    paths: str
    #: None, "fsdp1", "fsdp2" or "zero2".
    sharding: str | None = None

    @property
    def label(self) -> str:
        if self.sharding is not None:
            return f"{self.model.key}-{self.sharding}"
        return f"{self.model.key}-{self.engine}-{self.paths}"

    @property
    def fast_paths(self) -> str:
        """The ``--fast-paths`` value of the run."""
        if self.paths == "all":
            return ",".join(CPU_PATHS)
        return self.paths


#: The paths measured on a CPU ("all"); the GPU-only fused linear loss is measured alone.
CPU_PATHS = tuple(name for name in FAST_PATHS if name != "fused-linear-loss")


@dataclass
class Result:
    run: Run
    tokens_per_second: float | None = None
    peak_memory: int | None = None
    loss: float | None = None
    note: str = ""
    flops_per_token: int | None = None


def plan(smoke: bool) -> list[Run]:
    """The runs, most telling first (a budget cut drops the last ones): each model with every
    path off and every path on, on the trainer engine; the GPU-only loss; each path alone;
    the accelerate engine; the sharded runs; the paths that change random numbers."""
    if smoke:
        gpt2, bert = SMOKE_MODELS
        return [
            Run(gpt2, "trainer", "off"),
            Run(gpt2, "trainer", "all"),
            Run(gpt2, "trainer", "fused-linear-loss"),
            Run(bert, "trainer", "off"),
            Run(bert, "trainer", "all"),
            Run(gpt2, "accelerate", "off"),
            Run(gpt2, "accelerate", "all"),
        ]
    return [
        Run(GPT2, "trainer", "off"),
        Run(GPT2, "trainer", "all"),
        Run(GPT2, "trainer", "fused-linear-loss"),
        Run(BERT, "trainer", "off"),
        Run(BERT, "trainer", "all"),
        Run(GPT2, "trainer", "tiled-loss"),
        Run(BERT, "trainer", "masked-head"),
        Run(GPT2, "trainer", "fused-gelu"),
        Run(GPT2, "trainer", "sparse-embedding"),
        Run(GPT2, "trainer", "fused-adamw"),
        Run(GPT2, "accelerate", "off"),
        Run(GPT2, "accelerate", "all"),
        Run(GPT2, "accelerate", "fused-linear-loss"),
        Run(BERT, "accelerate", "off"),
        Run(BERT, "accelerate", "all"),
        Run(GPT2, "trainer", "auto", "fsdp2"),
        Run(GPT2, "trainer", "auto", "zero2"),
        Run(GPT2, "trainer", "auto", "fsdp1"),
        Run(GPT2, "trainer", "fast-dropout"),
        Run(BERT, "trainer", "fast-dropout"),
        Run(BERT, "accelerate", "masked-head"),
    ]


# Data -----------------------------------------------------------------------------------------


def write_tokenizer(directory: Path, model: Model) -> Path:
    """A word-level tokenizer of ``model.vocab`` entries, w0, w1, ... and the specials: BERT's
    first, GPT-2's end-of-text last (the ids its default config names)."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    specials = model.specials
    words = [f"w{i}" for i in range(model.vocab - len(specials))]
    tokens = [*words, *specials] if model.objective == "clm" else [*specials, *words]
    unknown = specials[0] if model.objective == "clm" else "[UNK]"
    tokenizer = Tokenizer(models.WordLevel({t: i for i, t in enumerate(tokens)}, unk_token=unknown))
    tokenizer.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    if model.objective == "clm":
        names = {"bos_token": specials[0], "eos_token": specials[0], "unk_token": specials[0]}
    else:
        names = {
            "pad_token": "[PAD]",
            "unk_token": "[UNK]",
            "cls_token": "[CLS]",
            "sep_token": "[SEP]",
            "mask_token": "[MASK]",
        }
    fast = PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_max_length=model.length, **names
    )
    fast.save_pretrained(directory)
    return directory


def write_text(path: Path, model: Model, tokens: int, seed: int = 0) -> Path:
    """About ``tokens`` words drawn uniformly from the vocabulary's words, 64 to a line."""
    rng = random.Random(seed)
    words = model.vocab - len(model.specials)
    with path.open("w", encoding="utf-8") as handle:
        for _ in range(tokens // 64 + 1):
            handle.write(" ".join(f"w{rng.randrange(words)}" for _ in range(64)) + "\n")
    return path


def data_paths(work: Path, model: Model) -> tuple[Path, Path]:
    """Where ``model``'s tokenizer and training text are, under the work directory."""
    return work / model.key / "tokenizer", work / model.key / "train.txt"


def write_inputs(work: Path, run: Run, steps: int) -> None:
    """The tokenizer and text of the run's model (once per benchmark), and its sharding
    config file."""
    tokenizer, text = data_paths(work, run.model)
    if not text.is_file():
        tokenizer.parent.mkdir(parents=True, exist_ok=True)
        write_tokenizer(tokenizer, run.model)
        tokens = int(steps * run.model.batch * run.model.length * 1.2) + run.model.length
        write_text(text, run.model, tokens)
    if run.sharding in ("fsdp1", "fsdp2"):
        options = {"fsdp": "full_shard", "fsdp_config": {"version": int(run.sharding[-1])}}
        sharding_file(work, run).write_text(json.dumps({"training_args": options}))
    elif run.sharding == "zero2":
        sharding_file(work, run).write_text(json.dumps(DEEPSPEED_ZERO2_FUSED_ADAM))


def sharding_file(work: Path, run: Run) -> Path:
    return work / f"{run.sharding}.json"


DEEPSPEED_ZERO2_FUSED_ADAM = {
    "train_micro_batch_size_per_gpu": "auto",
    "train_batch_size": "auto",
    "gradient_accumulation_steps": "auto",
    "gradient_clipping": "auto",
    "bf16": {"enabled": "auto"},
    "zero_optimization": {
        "stage": 2,
        "overlap_comm": True,
        "contiguous_gradients": True,
        "reduce_bucket_size": "auto",
        "allgather_bucket_size": 5e8,
    },
    # DeepSpeed's own AdamW: its fused CUDA kernel (FusedAdam) where it is not offloaded.
    "optimizer": {
        "type": "AdamW",
        "params": {"lr": "auto", "betas": "auto", "eps": "auto", "weight_decay": "auto"},
    },
}


def lmctl_arguments(run: Run, work: Path, run_dir: Path, args: argparse.Namespace) -> list[str]:
    """``lmctl train ...`` for ``run``, its inputs under ``work``; steps, logging and
    precision from the benchmark's ``args``."""
    steps, log_every, precision = args.steps, args.log_every, args.precision
    model = run.model
    tokenizer, text = data_paths(work, model)
    paths = run.fast_paths
    arguments = [
        "train", model.objective, "--model-type", model.model_type, "--tokenizer",
        str(tokenizer), "--train-file", str(text), "--no-eval", "--engine", run.engine,
        "--precision", precision, "--max-steps", str(steps), "--logging-steps", str(log_every),
        "--save-strategy", "no", "--per-device-train-batch-size", str(model.batch),
        "--fast-paths", paths, "--seed", "0", "--no-progress", "-o", str(run_dir),
    ]  # fmt: skip
    arguments += ["--block-size" if model.objective == "clm" else "--max-seq-length"]
    arguments += [str(model.length)]
    if model.overrides:
        arguments += ["--config-overrides", model.overrides]
    if run.sharding in ("fsdp1", "fsdp2"):
        arguments += ["--config", str(sharding_file(work, run))]
    elif run.sharding == "zero2":
        arguments += ["--deepspeed", str(sharding_file(work, run))]
    return arguments
