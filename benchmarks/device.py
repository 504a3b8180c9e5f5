"""Training speed on one CUDA GPU, with lmctl's fast paths on and off.

GPT-2 124M (clm) and BERT-base (mlm), built from their default configs with random weights,
train in bf16 on synthetic tokens: words drawn uniformly from the whole vocabulary, through a
word-level tokenizer the size of the model's vocabulary (GPT-2's 50,257, BERT's 30,522).
Each model trains on both engines with every fast path named (``--fast-paths`` listing them
all, on whatever device) and with ``--fast-paths off``; then GPT-2 once under FSDP version 1
and once under version 2, and once under DeepSpeed ZeRO-2 with DeepSpeed's fused Adam, each
in one process (torchrun), on the trainer engine. Every run is a fresh ``lmctl train``
process. Per run: tokens/s between the first and the last logged step (start-up, the first
steps' allocations and any compilation left out), MFU (6N + 12 L T d FLOP per token over the
GPU's datasheet dense bf16 peak, stated on the page), the peak of the GPU memory allocated,
and the last logged loss. It writes ``docs/benchmarks-gpu.md``, in under 8 minutes on one
H100-class GPU (``--budget-minutes`` stops starting runs after that).

    python benchmarks/device.py                      # one CUDA GPU: writes the page
    python benchmarks/device.py --dry-run            # the runs and their commands
    python benchmarks/device.py --smoke --output /tmp/gpu.md   # tiny models, any device
"""

from __future__ import annotations

import argparse
import json
import os
import random
import shutil
import socket
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass
from pathlib import Path
from typing import Any, get_args

ROOT = Path(__file__).resolve().parent.parent
if str(ROOT) not in sys.path:  # run as a script: benchmarks/ is a package of the checkout
    sys.path.insert(0, str(ROOT))
if str(ROOT / "src") not in sys.path:
    sys.path.insert(0, str(ROOT / "src"))

from benchmarks.common import lmctl_env  # noqa: E402
from lmctl.config.base import FastPathName  # noqa: E402

FAST_PATHS = get_args(FastPathName)
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
#: Per-run wall-clock limit: a run past it is recorded as failed.
RUN_TIMEOUT = 180


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


# Measuring ------------------------------------------------------------------------------------


def _free_port() -> int:
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        return int(sock.getsockname()[1])


def measure(run: Run, work: Path, args: argparse.Namespace) -> Result:
    """One ``lmctl train`` process (under torchrun when sharded), read back from its run
    directory's metrics and the peak memory it reported."""
    write_inputs(work, run, args.steps)
    run_dir = work / "runs" / run.label
    report = work / "runs" / f"{run.label}.json"
    report.parent.mkdir(parents=True, exist_ok=True)
    arguments = lmctl_arguments(run, work, run_dir, args)
    inner = [str(Path(__file__).resolve()), "--one-run", str(report), "--", *arguments]
    if run.sharding is None:
        command = [sys.executable, *inner]
    else:
        command = [
            sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "1",
            "--master_port", str(_free_port()), *inner,
        ]  # fmt: skip
    env = lmctl_env(LMCTL_CACHE=str(work / "cache"))
    try:
        done = subprocess.run(
            command, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT, check=False
        )
    except subprocess.TimeoutExpired:
        return Result(run, note=f"failed: over {RUN_TIMEOUT} s")
    if args.log_file:
        with Path(args.log_file).open("a", encoding="utf-8") as handle:
            tail = "\n".join(done.stderr.splitlines()[-40:])
            handle.write(f"=== {run.label} (exit {done.returncode})\n{tail}\n")
    if done.returncode != 0:
        lines = [line for line in done.stderr.splitlines() if line.strip()]
        return Result(run, note=f"failed (exit {done.returncode}): {lines[-1] if lines else ''}")
    reported = json.loads(report.read_text()) if report.is_file() else {}
    rows = [
        json.loads(line)
        for line in (run_dir / "metrics.jsonl").read_text().splitlines()
        if '"loss"' in line
    ]
    result = Result(run, peak_memory=reported.get("peak_memory"))
    result.note = fast_path_line(done.stderr)
    if len(rows) >= 2:
        first, last = rows[0], rows[-1]
        tokens = (last["step"] - first["step"]) * run.model.batch * run.model.length
        result.tokens_per_second = tokens / max(last["time"] - first["time"], 1e-9)
        result.loss = float(last["loss"])
    else:
        result.note = f"fewer than two logged steps (--steps {args.steps})"
    shutil.rmtree(run_dir, ignore_errors=True)
    return result


def fast_path_line(stderr: str) -> str:
    """What lmctl's log said was on (the part after ``on:``, up to the paths that were off)."""
    for line in stderr.splitlines():
        if "fast paths (" in line:
            said = line.split("): ", 1)[-1]
            on = said.split("off: ", 1)[0].rstrip("; ")
            return on if on.startswith("on: ") else "none on"
    return ""


def one_run(report: Path, arguments: list[str]) -> int:
    """Run lmctl in this process, then write its exit code and the peak memory it took (the
    GPU memory allocated on CUDA, else the process's peak RSS)."""
    import resource

    import torch

    from lmctl.cli.app import main

    sys.argv = ["lmctl", *arguments]
    code = 0
    try:
        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    if torch.cuda.is_available():
        peak = int(torch.cuda.max_memory_allocated())
    else:
        peak = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024
    if int(os.environ.get("RANK", "0")) == 0:
        report.write_text(json.dumps({"exit_code": code, "peak_memory": peak}), encoding="utf-8")
    return code


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


def _cell(value: float | None, digits: str) -> str:
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
        f"- bf16 peak for MFU: {_cell(tflops, '.1f')} TFLOP/s ({source})",
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
            f"{_cell(result.tokens_per_second, ',.0f')} | {_cell(mfu, '.1%')} | "
            f"{_cell(memory, '.2f')} | {_cell(result.loss, '.3f')} | {result.note} |"
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


# Command line ---------------------------------------------------------------------------------


def parse(argv: list[str] | None = None) -> argparse.Namespace:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--output", default=str(ROOT / "docs" / "benchmarks-gpu.md"))
    parser.add_argument("--steps", type=int, default=60, help="steps per run (default 60)")
    parser.add_argument(
        "--log-every", type=int, default=10, help="steps between logged losses (default 10)"
    )
    parser.add_argument("--precision", default="bf16", choices=["bf16", "fp32", "fp16"])
    parser.add_argument("--only", help="comma-separated run labels (see --dry-run)")
    parser.add_argument("--log-file", help="append the end of each run's log to this file")
    parser.add_argument(
        "--peak-tflops", type=float, help="the GPU's bf16 peak, for a GPU not in the table"
    )
    parser.add_argument(
        "--budget-minutes",
        type=float,
        default=8.0,
        help="start no run after this many minutes (default 8)",
    )
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="tiny models, any device (a check of the benchmark, not a measurement)",
    )
    parser.add_argument("--dry-run", action="store_true", help="list the runs; run nothing")
    parser.add_argument("--one-run", help=argparse.SUPPRESS)
    parser.add_argument("rest", nargs=argparse.REMAINDER, help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.log_every >= args.steps:
        parser.error("--log-every must be below --steps: tokens/s is taken between logs")
    return args


def selected(args: argparse.Namespace) -> list[Run]:
    runs = plan(args.smoke)
    if args.only:
        wanted = set(args.only.split(","))
        unknown = wanted - {run.label for run in runs}
        if unknown:
            raise SystemExit(
                f"--only: no run named {', '.join(sorted(unknown))}; "
                f"the runs: {', '.join(run.label for run in runs)}"
            )
        runs = [run for run in runs if run.label in wanted]
    return runs


def main(argv: list[str] | None = None) -> int:
    args = parse(argv)
    if args.one_run:
        rest = args.rest[1:] if args.rest[:1] == ["--"] else args.rest
        return one_run(Path(args.one_run), rest)
    runs = selected(args)
    if args.dry_run:
        for run in runs:
            arguments = lmctl_arguments(run, Path("WORK"), Path("WORK/runs") / run.label, args)
            launcher = "torchrun --nproc_per_node 1 -m " if run.sharding else "python -m "
            print(f"{run.label}: {launcher}lmctl {' '.join(arguments)}")
        return 0
    import torch

    device = "cuda" if torch.cuda.is_available() else "cpu"
    if device != "cuda" and not args.smoke:
        print(
            "benchmarks/device.py measures a CUDA GPU and this machine has none; run it on "
            "one, or check the benchmark itself with --smoke",
            file=sys.stderr,
        )
        return 2
    started = time.monotonic()
    work = Path(tempfile.mkdtemp(prefix="lmctl-device-"))
    try:
        info = machine(device)
        matmul = matmul_tflops(device)
        if device == "cuda":
            peak = bf16_peak(info["device"], args.peak_tflops)
        else:
            peak = (matmul, "the measured bf16 matmul: no GPU, a check of the benchmark only")
        results: list[Result] = []
        for run in runs:
            if time.monotonic() - started > args.budget_minutes * 60:
                results.append(Result(run, note=f"not run: past {args.budget_minutes} minutes"))
                continue
            result = measure(run, work, args)
            result.flops_per_token = flops_per_token(run.model)[1]
            results.append(result)
            print(
                f"{run.label}: {_cell(result.tokens_per_second, ',.0f')} tokens/s {result.note}",
                file=sys.stderr,
            )
            # The page so far, after every run: a run cut short still leaves its figures.
            minutes = (time.monotonic() - started) / 60
            text = render(results, info, peak=peak, matmul=matmul, minutes=minutes, args=args)
            write_page(Path(args.output), text)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    minutes = (time.monotonic() - started) / 60
    text = render(results, info, peak=peak, matmul=matmul, minutes=minutes, args=args)
    write_page(Path(args.output), text)
    print(text)
    return 0


def write_page(path: Path, text: str) -> None:
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text, encoding="utf-8")


if __name__ == "__main__":
    sys.exit(main())
