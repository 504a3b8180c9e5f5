"""Will it fit? The per-process memory of a training run, estimated from the model's config
before the model is built or any data is read, against the device's free memory.

The parameters are counted by building the model on the ``meta`` device (no memory, no
weights read); a config that cannot be read offline (a Hub model not in the cache, a storage
URL) skips the check. With ``P`` parameters, ``T`` of them trained (``T = P``, or LoRA's
adapters: ``4·r·h`` per layer, two adapted projections of ``h`` inputs and outputs each), ``N``
processes::

    weights      4·P           fp32 weights; mixed precision adds 2·P for the half-precision
                               copies that autocast keeps during the forward pass
                 2·P           DeepSpeed with bf16/fp16 (its fp32 master copy is optimizer state)
    gradients    4·T           (2·T under DeepSpeed with bf16/fp16)
    optimizer    8·T           AdamW's two fp32 states (+ 4·T fp32 master weights under
                               DeepSpeed with bf16/fp16)
    activations  L·(b·s·h·B    every transformer block's saved tensors (B = BLOCK_BYTES)
                 + b·a·s²·S)   and its attention scores (S = SCORE_BYTES)
               + b·s·V·G       the logits and their fp32 copies for the loss (G = LOGITS_BYTES)

ZeRO divides by ``N``: stage 1 the optimizer state, stage 2 also the gradients, stage 3 also
the weights; FSDP's full sharding divides all three (``grad-op``: gradients and optimizer).
Gradient checkpointing keeps only each block's input (``L·b·s·h·4``, the residual stream
stays fp32 under autocast) plus one block's worth recomputed in the backward pass. ``b`` is
the per-device batch (times the choices of a multiple-choice sample), ``s`` the sequence
length (the objective's flag, else the model's positions capped at 1024), ``L`` layers, ``h``
hidden size, ``a`` attention heads, ``V`` the vocabulary (a model built from scratch takes
its tokenizer's: ``--train-tokenizer``'s size, or a local tokenizer.json's).

The coefficients, in bytes: a block saves for the backward pass its attention input, q, k, v,
the attention output and its projection, two layer norms, the MLP's 4·h input and
activation (GPT-2's tanh GELU saves several 4·h intermediates), dropout masks: about 30
values per hidden unit, ``B = 120`` bytes in fp32; under bf16/fp16 autocast the matmul
outputs are half precision but layer norms and the residual stream stay fp32, ``B = 88``.
The attention scores, their softmax and dropout (fp32 under autocast too): ``S = 13``; a
fused attention kernel without dropout (e.g. evaluation, or dropout 0) saves none of them, so
this term is an upper bound there. The logits (``V`` per token), their fp32 copy, the
log-softmax of the loss and its gradient: ``G = 14`` (first counted as 2.5 fp32 copies, 10
bytes; every measured shape was then 13-25% above the estimate, by about one more copy of
the logits, so 3.5). They were fitted to the peaks measured by
``benchmarks/fit.py`` on six shapes (GPT-2 and BERT, fp32 and bf16, with and without
checkpointing; ``docs/benchmarks.md`` has the table). The estimate leaves out the runtime's
own memory (CUDA context, libraries) and the data; it is meant to catch runs that are far
too large, not to plan the last hundred megabytes.

Free memory: the GPU's free memory (``torch.cuda.mem_get_info``), else the host's available
memory; ``LMCTL_FREE_MEMORY`` (bytes, or with a unit: ``2GiB``, ``500MB``) overrides it.
"""

from __future__ import annotations

import json
import os
import re
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.errors import ConfigError, LmctlError

if TYPE_CHECKING:
    from lmctl.config.slices import (
        Access,
        AdapterSpec,
        ComputeSpec,
        LaunchSpec,
        LoopSpec,
        ModelSpec,
        ScaleSpec,
        TokenizerSpec,
    )
    from lmctl.models.config import ModelObjective

#: Bytes a transformer block saves per token and hidden unit: in fp32, and under autocast.
BLOCK_BYTES = {"fp32": 120, "mixed": 88}
#: Bytes per token, head and attended position: the attention scores, softmax and dropout.
SCORE_BYTES = 13
#: Bytes per token and vocabulary entry: the logits, their fp32 copy, the log-softmax and
#: its gradient (3.5 fp32 copies, as measured).
LOGITS_BYTES = 14
#: Environment variable that replaces the measured free memory (bytes, or with a unit).
FREE_MEMORY_ENV = "LMCTL_FREE_MEMORY"

_UNITS = {
    "": 1,
    "b": 1,
    "k": 1000,
    "kb": 1000,
    "m": 1000**2,
    "mb": 1000**2,
    "g": 1000**3,
    "gb": 1000**3,
    "t": 1000**4,
    "tb": 1000**4,
    "kib": 1024,
    "mib": 1024**2,
    "gib": 1024**3,
    "tib": 1024**4,
}


@dataclass(frozen=True)
class ModelSize:
    """What the estimate needs of the architecture."""

    parameters: int
    layers: int
    hidden: int
    vocab: int
    heads: int = 1


@dataclass(frozen=True)
class Shape:
    """How the run trains: what the estimate needs of its flags."""

    batch: int
    length: int
    accumulation: int = 1
    processes: int = 1
    #: ``bf16``, ``fp16`` or None (fp32).
    precision: str | None = None
    checkpointing: bool = False
    #: DeepSpeed ZeRO stage (0: no DeepSpeed).
    zero: int = 0
    #: FSDP sharding (``full``, ``hybrid``, ``grad-op``), or None.
    fsdp: str | None = None
    #: LoRA rank, or None (every weight trained).
    lora_rank: int | None = None


@dataclass(frozen=True)
class Estimate:
    weights: int
    gradients: int
    optimizer: int
    activations: int

    @property
    def total(self) -> int:
        return self.weights + self.gradients + self.optimizer + self.activations


def trainable(size: ModelSize, shape: Shape) -> int:
    """Parameters that get gradients and optimizer state."""
    if shape.lora_rank is None:
        return size.parameters
    return min(size.parameters, 4 * shape.lora_rank * size.hidden * size.layers)


def estimate(size: ModelSize, shape: Shape) -> Estimate:
    """Per-process bytes of a training step (the module's docstring has the formula)."""
    params, trained = size.parameters, trainable(size, shape)
    mixed = shape.precision is not None
    if shape.zero and mixed:
        weights, gradients, optimizer = 2.0 * params, 2.0 * trained, 12.0 * trained
    else:
        weights = (6.0 if mixed else 4.0) * params
        gradients, optimizer = 4.0 * trained, 8.0 * trained
    n = max(1, shape.processes)
    if shape.zero >= 1:
        optimizer /= n
    if shape.zero >= 2:
        gradients /= n
    if shape.zero >= 3:
        weights /= n
    if shape.fsdp is not None and n > 1:
        gradients, optimizer = gradients / n, optimizer / n
        if shape.fsdp != "grad-op":
            weights /= n
    tokens = shape.batch * shape.length
    block = tokens * size.hidden * BLOCK_BYTES["mixed" if mixed else "fp32"]
    block += tokens * size.heads * shape.length * SCORE_BYTES
    if shape.checkpointing:
        blocks = size.layers * tokens * size.hidden * 4 + block
    else:
        blocks = size.layers * block
    logits = tokens * size.vocab * LOGITS_BYTES
    return Estimate(int(weights), int(gradients), int(optimizer), int(blocks + logits))


def parse_bytes(text: str) -> int:
    """``2GiB``, ``500MB``, ``1.5 G`` or a plain number of bytes."""
    found = re.fullmatch(r"\s*([0-9]+(?:\.[0-9]*)?)\s*([A-Za-z]*)\s*", text)
    unit = found.group(2).lower() if found else ""
    if found is None or unit not in _UNITS:
        raise ConfigError(
            f"{FREE_MEMORY_ENV}={text}: not an amount of memory",
            "give bytes, or a number with a unit such as 2GiB or 500MB",
        )
    return int(float(found.group(1)) * _UNITS[unit])


def format_bytes(value: float) -> str:
    for unit, size in (("TiB", 1024**4), ("GiB", 1024**3), ("MiB", 1024**2), ("KiB", 1024)):
        if value >= size:
            return f"{value / size:.1f} {unit}"
    return f"{int(value)} B"


def free_memory(on_gpu: bool) -> tuple[int, str]:
    """Free bytes of the device the run trains on, and where the number comes from."""
    given = os.environ.get(FREE_MEMORY_ENV)
    if given:
        return parse_bytes(given), FREE_MEMORY_ENV
    if on_gpu:
        import torch

        from lmctl.distributed import local_rank

        # This process's GPU (the launchers give each process its LOCAL_RANK).
        free, _ = torch.cuda.mem_get_info(local_rank() % torch.cuda.device_count())
        return int(free), "GPU free memory"
    import psutil

    return int(psutil.virtual_memory().available), "host available memory"


def zero_stage(deepspeed: str | None) -> int:
    """The ZeRO stage ``--deepspeed`` names (a stage, or a config file with one)."""
    if deepspeed is None:
        return 0
    if deepspeed.strip() in ("0", "1", "2", "3"):
        return int(deepspeed)
    try:
        document = json.loads(Path(deepspeed).read_text(encoding="utf-8"))
        return int(document.get("zero_optimization", {}).get("stage", 0))
    except (OSError, ValueError, TypeError, AttributeError):
        return 0


def sequence_length(options: Any, model_config: Any) -> int:
    """The objective's length flag, else the model's positions capped at 1024."""
    for name in ("block_size", "max_seq_length"):
        value = getattr(options, name, None)
        if isinstance(value, int) and value > 0:
            return value
    from lmctl.models.config import DEFAULT_LENGTH_CAP, max_positions

    positions = max_positions(model_config)
    return min(positions, DEFAULT_LENGTH_CAP) if positions else DEFAULT_LENGTH_CAP


def read_model_config(model: ModelSpec, access: Access) -> Any | None:
    """The run's model config, read without downloading anything (None when it can't be)."""
    from lmctl.console import Console, OutputOptions
    from lmctl.models.config import build_model_config
    from lmctl.models.plugins import load_plugins
    from lmctl.storage.paths import is_remote, local_path

    if not model.given:
        return None
    for name in (model.config_name, model.model_name_or_path):
        if name is None:
            continue
        if is_remote(name):
            return None  # a storage URL: reading it would download it
        if not local_path(name).is_dir():
            return _cached_config(name, model, access)
        break
    quiet = Console(OutputOptions(quiet=True))
    try:
        load_plugins(model.imports, quiet)
        return build_model_config(model, access, quiet)
    except (LmctlError, OSError, ValueError):
        return None  # the pipeline says what is wrong with it


def _cached_config(name: str, model: ModelSpec, access: Access) -> Any | None:
    """A Hub model's config from the local cache only."""
    from transformers import AutoConfig

    try:
        return AutoConfig.from_pretrained(
            name,
            local_files_only=True,
            cache_dir=access.cache_dir,
            revision=model.model_revision,
            trust_remote_code=access.trust_remote_code,
        )
    except Exception:  # not cached, or not readable: no estimate
        return None


def tokenizer_vocabulary(tokenizer: TokenizerSpec) -> int | None:
    """The vocabulary a model built from scratch takes from its tokenizer (None: unknown
    without loading it): ``--train-tokenizer``'s size, or a local tokenizer.json's."""
    if tokenizer.train_tokenizer is not None:
        return tokenizer.train_tokenizer
    if tokenizer.tokenizer_name is None:
        return None
    path = Path(tokenizer.tokenizer_name) / "tokenizer.json"
    try:
        document = json.loads(path.read_text(encoding="utf-8"))
        vocab = document["model"]["vocab"]
        added = {item["content"] for item in document.get("added_tokens", [])}
        return len(vocab) + len(added - set(vocab if isinstance(vocab, dict) else ()))
    except (OSError, ValueError, KeyError, TypeError):
        return None


def model_size(objective: ModelObjective, model_config: Any, access: Access) -> ModelSize | None:
    """Count the parameters of the objective's model built on the meta device."""
    import torch

    try:
        with torch.device("meta"):
            model = objective.auto_model_class().from_config(
                model_config, trust_remote_code=access.trust_remote_code
            )
    except Exception:  # the pipeline reports an architecture it cannot build
        return None
    params = sum(p.numel() for p in model.parameters())
    return ModelSize(
        parameters=params,
        layers=int(_first(model_config, "num_hidden_layers", "n_layer", "num_layers")),
        hidden=int(_first(model_config, "hidden_size", "n_embd", "d_model")),
        vocab=int(_first(model_config, "vocab_size")),
        heads=max(1, _first(model_config, "num_attention_heads", "n_head")),
    )


def _first(model_config: Any, *names: str) -> int:
    for name in names:
        value = getattr(model_config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return 0


@dataclass(frozen=True)
class FitCheck:
    size: ModelSize
    shape: Shape
    estimate: Estimate
    free: int
    free_source: str

    @property
    def fits(self) -> bool:
        return self.estimate.total <= self.free

    def table(self) -> dict[str, int]:
        e = self.estimate
        return {
            "parameters": self.size.parameters,
            "weights": e.weights,
            "gradients": e.gradients,
            "optimizer": e.optimizer,
            "activations": e.activations,
            "total": e.total,
            "free": self.free,
        }

    def lines(self) -> str:
        """The table as YAML comments, so that a dry run's output stays a config file."""
        rows = [(k, v) for k, v in self.table().items() if k != "parameters"]
        verdict = "fits" if self.fits else "does NOT fit"
        text = f"# memory per process ({self.size.parameters / 1e6:.1f}M parameters), {verdict}\n"
        text += "".join(f"#   {name:<12} {format_bytes(value):>11}\n" for name, value in rows)
        return text + f"#   (free: {self.free_source})\n"


def run_shape(
    options: Any,
    model_config: Any,
    *,
    model: ModelSpec,
    loop: LoopSpec,
    compute: ComputeSpec,
    scale: ScaleSpec,
    adapter: AdapterSpec,
    launch: LaunchSpec,
    on_gpu: bool,
) -> Shape:
    """The run's shape from its slices."""
    from lmctl.distributed import native_bf16, world_size

    endings = getattr(options, "endings", None)
    choices = len(endings) if isinstance(endings, list) and endings else 1
    processes = launch.nproc * launch.nnodes if launch.nproc else world_size()
    precision = compute.mixed_precision(native_bf16 if on_gpu else lambda: False)
    if precision is None and model.dtype in ("bfloat16", "float16"):
        precision = "bf16"
    return Shape(
        batch=loop.per_device_train_batch_size * choices,
        length=sequence_length(options, model_config),
        accumulation=loop.gradient_accumulation_steps,
        processes=processes,
        precision=precision,
        checkpointing=model.gradient_checkpointing
        or bool(loop.training_args.get("gradient_checkpointing")),
        zero=zero_stage(scale.deepspeed),
        fsdp=scale.fsdp_sharding if scale.fsdp else None,
        lora_rank=adapter.lora_r if adapter.peft == "lora" else None,
    )


def check_fit(
    objective: ModelObjective,
    options: Any,
    *,
    model: ModelSpec,
    access: Access,
    loop: LoopSpec,
    compute: ComputeSpec,
    scale: ScaleSpec,
    adapter: AdapterSpec,
    launch: LaunchSpec,
    tokenizer: TokenizerSpec,
) -> FitCheck | None:
    """The estimate against the free memory (None when the model's config can't be read
    offline or the run does not train)."""
    if not loop.do_train:
        return None
    model_config = read_model_config(model, access)
    if model_config is None:
        return None
    from lmctl.models.config import overridden

    vocabulary = tokenizer_vocabulary(tokenizer)
    if not model.from_pretrained and vocabulary and "vocab_size" not in overridden(model):
        # As the model built from scratch will be (lmctl.models.build).
        model_config.vocab_size = vocabulary
    size = model_size(objective, model_config, access)
    if size is None:
        return None
    import torch

    on_gpu = torch.cuda.is_available() and not loop.training_args.get("use_cpu", False)
    shape = run_shape(
        options,
        model_config,
        model=model,
        loop=loop,
        compute=compute,
        scale=scale,
        adapter=adapter,
        launch=launch,
        on_gpu=on_gpu,
    )
    free, source = free_memory(on_gpu)
    return FitCheck(size, shape, estimate(size, shape), free, source)


def alternatives(check: FitCheck, *, can_lora: bool) -> list[tuple[str, int]]:
    """Changes of flags that lower the estimate, each with its estimate."""
    shape, size = check.shape, check.size
    found: list[tuple[str, Shape]] = []
    batch = shape.batch
    if batch > 1:
        smaller = batch
        while smaller > 1:
            smaller //= 2
            if estimate(size, replace(shape, batch=smaller)).total <= check.free:
                break
        steps = shape.accumulation * -(-batch // smaller)
        found.append(
            (
                f"--per-device-train-batch-size {smaller} --gradient-accumulation-steps {steps}",
                replace(shape, batch=smaller, accumulation=steps),
            )
        )
    if not shape.checkpointing:
        found.append(("--gradient-checkpointing", replace(shape, checkpointing=True)))
    if shape.processes > 1 and shape.fsdp is None:
        for stage in (2, 3):
            if shape.zero < stage:
                found.append((f"--deepspeed {stage}", replace(shape, zero=stage)))
    if shape.lora_rank is None and can_lora:
        found.append(("--peft lora", replace(shape, lora_rank=8)))
    return [(flags, estimate(size, changed).total) for flags, changed in found]


def refusal(check: FitCheck, *, can_lora: bool) -> ConfigError:
    """The error that refuses a run that does not fit, with the changes that would."""
    options = alternatives(check, can_lora=can_lora)
    fitting = [(flags, total) for flags, total in options if total <= check.free]
    shown = fitting or options
    listed = "; ".join(f"{flags} (~{format_bytes(total)})" for flags, total in shown)
    if fitting:
        hint = f"changes that fit: {listed}; or --no-fit-check to try anyway"
    elif listed:
        hint = (
            f"no single change fits: {listed}; combine them, use a smaller model or more "
            "processes, or --no-fit-check to try anyway"
        )
    else:
        hint = "use a smaller model or more memory, or --no-fit-check to try anyway"
    e = check.estimate
    return ConfigError(
        f"this run needs about {format_bytes(e.total)} per process (weights "
        f"{format_bytes(e.weights)}, gradients {format_bytes(e.gradients)}, optimizer "
        f"{format_bytes(e.optimizer)}, activations {format_bytes(e.activations)}) but "
        f"{format_bytes(check.free)} is free ({check.free_source})",
        hint,
        details={"memory": check.table()},
    )
