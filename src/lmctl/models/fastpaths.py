"""Where lmctl's fast training paths run: one table, one decision per run, one log line.

Each fast path computes what the model's and PyTorch's own code computes (tested path by
path), in less time on the hardware it was measured on. A path runs by default only on the
device types where a benchmark showed it faster: every path so far was measured on a
two-core CPU (``docs/benchmarks.md``), but the fused linear loss, which runs on CUDA only
(liger-kernel's Triton kernels) and is on nowhere until measured; so on a CUDA GPU, until
a GPU measurement says otherwise (``benchmarks/device.py`` writes
``docs/benchmarks-gpu.md``), training is the
stock one: the model's own forward and loss (one matmul for the logits, PyTorch's
cross-entropy), PyTorch's dropout, GELU and allocator, and the engine's own optimizer. A
Python loop of small matmuls that wins in a CPU's cache is hundreds of kernel launches on a
GPU.

Besides the device type, a path may need the model's own module tree (DeepSpeed, FSDP, LoRA
and torch.compile wrap or replace it), one process, no gradient checkpointing, and a
precision it was checked in; and the model must have the shape the path works on (checked
when the path is installed: a tied embedding, a linear output layer that reproduces the
logits, dropout modules, ...). ``--fast-paths off`` turns every path off; a list of names
turns on those named wherever they apply, on any device type, to measure them there.

May import config and the bottom layer; each path's own module (``metrics.lm_head``,
``models.embedding``, ...) keeps how the path works, this one when it runs.
"""

from __future__ import annotations

import os
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, get_args

from lmctl import distributed
from lmctl.config.base import FastPathName

if TYPE_CHECKING:
    from lmctl.config.base import TrainConfig

#: Where the figures that put a path on by default were measured.
CPU_FIGURES = "docs/benchmarks.md"


@dataclass(frozen=True)
class FastPath:
    """One row of the table: what the path does and the conditions it runs under."""

    name: FastPathName
    #: What it does, in a few words.
    does: str
    #: Device types on which a benchmark showed it faster (on there by default).
    measured_on: frozenset[str]
    #: It changes the model's modules or forward, which DeepSpeed, FSDP, LoRA or a compiled
    #: graph wrap or replace.
    plain_model: bool = False
    #: It changes a gradient's layout, which DistributedDataParallel would not expect.
    one_process: bool = False
    #: Recomputing activations in the backward pass would draw different numbers.
    no_checkpointing: bool = False
    #: Precisions it was checked in (fp16 autocast only exists on accelerators).
    precisions: frozenset[str] = frozenset({"fp32", "bf16", "fp16"})
    #: Why the path stays off unless ``--fast-paths`` names it, where it changes what a run
    #: computes (other random numbers, so other results than upstream's at the same seed).
    not_by_default: str = ""
    #: Device types it can run on at all (None: any); named elsewhere, it stays off.
    runs_on: frozenset[str] | None = None


CPU = frozenset({"cpu"})
CHECKED = frozenset({"fp32", "bf16"})
TABLE: tuple[FastPath, ...] = (
    FastPath(
        "tiled-loss",
        "clm training loss from the output layer in 512-row tiles",
        CPU,
        plain_model=True,
        precisions=CHECKED,
    ),
    FastPath(
        "fused-linear-loss",
        "clm training loss by liger-kernel's fused linear cross-entropy",
        frozenset(),
        plain_model=True,
        precisions=CHECKED,
        runs_on=frozenset({"cuda"}),
    ),
    FastPath(
        "masked-head",
        "mlm prediction head on the masked positions only",
        CPU,
        plain_model=True,
        precisions=CHECKED,
    ),
    FastPath(
        "skip-padding",
        "an encoder's linear layers on the non-padding positions only",
        CPU,
        plain_model=True,
        # The padding positions are known from the batch the model is called with, which a
        # recomputation in the backward pass is not.
        no_checkpointing=True,
        precisions=CHECKED,
    ),
    FastPath(
        "sparse-embedding",
        "tied input embedding's gradient taken sparse",
        CPU,
        plain_model=True,
        one_process=True,
    ),
    FastPath(
        "fast-dropout",
        "dropout masks from 16 random bits an element",
        CPU,
        plain_model=True,
        no_checkpointing=True,
        # At seed 42, a 40-step fine-tune of a tiny multiple-choice BERT ended 10% above
        # upstream's eval loss with it and equal to it without (tests/test_parity.py).
        not_by_default="other random numbers than PyTorch's dropout; name it to use it",
    ),
    FastPath("fused-gelu", "tanh GELU as one fused kernel", CPU),
    FastPath("fused-adamw", "torch's fused AdamW chosen by lmctl", CPU),
    FastPath("allocator", "glibc keeps freed large blocks", CPU),
)
PATHS = {path.name: path for path in TABLE}
assert set(PATHS) == set(get_args(FastPathName)), "one row per --fast-paths name"

#: How the wrappers that replace the model's own module tree are named in the log.
WRAPPER_NAMES = {
    "deepspeed": "DeepSpeed",
    "fsdp": "FSDP",
    "megatron_lm": "Megatron-LM",
    "lora": "LoRA",
    "compile": "torch.compile",
}


@dataclass(frozen=True)
class Setting:
    """What the decisions depend on, read once from the config and the machine."""

    device: str
    precision: str
    engine: str
    #: Keys of :data:`WRAPPER_NAMES` for what wraps or replaces the model.
    wrappers: tuple[str, ...]
    processes: int
    checkpointing: bool
    #: ``--fast-paths``: "auto", "off", or the names it lists.
    requested: str | frozenset[str]

    @classmethod
    def of(cls, config: TrainConfig) -> Setting:
        names = config.fast_path_names()
        return cls(
            device=device_type(config),
            precision=config.mixed_precision(distributed.native_bf16) or "fp32",
            engine=config.engine,
            wrappers=wrappers(config),
            processes=distributed.world_size(),
            checkpointing=bool(
                config.gradient_checkpointing or config.training_args.get("gradient_checkpointing")
            ),
            requested=config.fast_paths if names is None else names,
        )


def _environment_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")


def device_type(config: TrainConfig) -> str:
    """The device type this process trains on: the accelerator's (cuda, mps, xpu, ...) unless
    the CPU is asked for (``training_args.use_cpu``, ``accelerate launch --cpu``)."""
    import torch

    if config.training_args.get("use_cpu") or _environment_flag("ACCELERATE_USE_CPU"):
        return "cpu"
    accelerator = (
        torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    )
    return accelerator.type if accelerator is not None else "cpu"


def wrappers(config: TrainConfig) -> tuple[str, ...]:
    """What wraps, shards or replaces the model in training (DeepSpeed, FSDP, LoRA, a compiled
    graph), asked for by lmctl's flags, by ``training_args`` or by an ``accelerate launch``
    config; only the model's own forward may run under them."""
    passed = config.training_args
    found = [
        name
        for name in ("deepspeed", "fsdp", "megatron_lm")
        if _environment_flag(f"ACCELERATE_USE_{name.upper()}")
    ]
    if config.deepspeed or passed.get("deepspeed"):
        found.append("deepspeed")
    if config.fsdp or passed.get("fsdp"):
        found.append("fsdp")
    if config.peft:
        found.append("lora")
    if config.torch_compile or passed.get("torch_compile"):
        found.append("compile")
    return tuple(dict.fromkeys(found))


@dataclass(frozen=True)
class Decision:
    on: bool
    reason: str


def decide(path: FastPath, setting: Setting) -> Decision:
    """Whether ``path`` runs under ``setting``, and why (before the model's shape is checked)."""
    if setting.requested == "off":
        return Decision(False, "--fast-paths off")
    listed = isinstance(setting.requested, frozenset)
    if listed and path.name not in setting.requested:
        return Decision(False, "not in --fast-paths")
    if path.runs_on is not None and setting.device not in path.runs_on:
        return Decision(False, f"runs on {', '.join(sorted(path.runs_on))} only")
    if path.plain_model and setting.wrappers:
        names = ", ".join(WRAPPER_NAMES[name] for name in setting.wrappers)
        return Decision(False, f"{names} runs the model's own forward")
    if path.one_process and setting.processes > 1:
        return Decision(False, f"{setting.processes} processes")
    if path.no_checkpointing and setting.checkpointing:
        return Decision(False, "gradient checkpointing")
    if setting.precision not in path.precisions:
        return Decision(False, f"not checked in {setting.precision}")
    if listed:
        return Decision(True, "named by --fast-paths")
    if setting.device not in path.measured_on:
        return Decision(False, f"not measured faster on {setting.device}")
    if path.not_by_default:
        return Decision(False, path.not_by_default)
    return Decision(True, f"measured faster on {setting.device}, {CPU_FIGURES}")


@dataclass
class FastPaths:
    """The decisions of one run, and what became of each: :meth:`apply` installs a path that
    is on, and records it as off where the model or the machine does not fit it."""

    setting: Setting
    decisions: dict[str, Decision] = field(default_factory=dict)
    #: Paths asked about (applied, or found not to fit), in the order they were.
    asked: list[str] = field(default_factory=list)

    @classmethod
    def of(cls, config: TrainConfig, setting: Setting | None = None) -> FastPaths:
        setting = setting or Setting.of(config)
        return cls(setting, {path.name: decide(path, setting) for path in TABLE})

    def on(self, name: FastPathName) -> bool:
        return self.decisions[name].on

    def apply(self, name: FastPathName, install: Callable[[], object], unfit: str) -> bool:
        """Run ``install`` where ``name`` is on; a falsy result means the model or machine
        does not fit the path (``unfit`` says how), which then counts as off."""
        if name not in self.asked:
            self.asked.append(name)
        if not self.on(name):
            return False
        if install():
            return True
        self.decisions[name] = Decision(False, unfit)
        return False

    def set_off(self, name: FastPathName, reason: str) -> None:
        """Record ``name`` as off for ``reason`` (another path took its place)."""
        if name not in self.asked:
            self.asked.append(name)
        self.decisions[name] = Decision(False, reason)

    def fused_adamw(self) -> bool:
        """Whether AdamW runs torch's fused kernel by lmctl's choice (off: the engine's own
        optimizer, as upstream builds it)."""
        device = self.setting.device
        return self.apply(
            "fused-adamw",
            lambda: fused_adamw_available(device),
            f"this torch has no fused AdamW for {device}",
        )

    def summary(self) -> str:
        """One line: the setting, then the paths on and off, grouped by why."""
        setting = self.setting
        wrapped = f", {'+'.join(setting.wrappers)}" if setting.wrappers else ""
        head = (
            f"fast paths ({setting.device}, {setting.precision}, {setting.engine} engine"
            f"{wrapped}; --fast-paths chooses): "
        )
        parts = []
        for state, label in ((True, "on"), (False, "off")):
            groups: dict[str, list[str]] = {}
            for name in self.asked:
                decision = self.decisions[name]
                if decision.on is state:
                    groups.setdefault(decision.reason, []).append(name)
            if groups:
                listed = ", ".join(f"{', '.join(names)} ({why})" for why, names in groups.items())
                parts.append(f"{label}: {listed}")
        return head + ("; ".join(parts) or "none apply")


def fused_adamw_available(device: str) -> bool:
    """Whether torch's fused AdamW runs on ``device`` (a device type): one kernel per
    parameter group instead of a loop over parameters (CPU since torch 2.4, CUDA, and other
    accelerators it names)."""
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        return device in _get_fused_kernels_supported_devices()
    except ImportError:
        return False
