"""The table of fast paths, and one run's decision: :func:`decide` takes plain values
(:class:`Setting`), which :func:`setting_of` alone reads from a ``TrainConfig``."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from typing import Any, get_args

from lmctl.config.values import FastPathName

#: Where the figures that put a path on by default were measured.
CPU_FIGURES = "docs/benchmarks.md"


@dataclass(frozen=True)
class FastPath:
    """One row of the table: the conditions a path runs under (what it does: its module)."""

    name: FastPathName
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
    FastPath("tiled-loss", CPU, plain_model=True, precisions=CHECKED),
    FastPath(
        "fused-linear-loss",
        frozenset(),
        plain_model=True,
        precisions=CHECKED,
        runs_on=frozenset({"cuda"}),
    ),
    FastPath("masked-head", CPU, plain_model=True, precisions=CHECKED),
    FastPath(
        "skip-padding",
        CPU,
        plain_model=True,
        # The padding positions are known from the batch the model is called with, which a
        # recomputation in the backward pass is not.
        no_checkpointing=True,
        precisions=CHECKED,
    ),
    FastPath("sparse-embedding", CPU, plain_model=True, one_process=True),
    FastPath(
        "fast-dropout",
        CPU,
        plain_model=True,
        no_checkpointing=True,
        # At seed 42, a 40-step fine-tune of a tiny multiple-choice BERT ended 10% above
        # upstream's eval loss with it and equal to it without (tests/test_parity.py).
        not_by_default="other random numbers than PyTorch's dropout; name it to use it",
    ),
    FastPath("fused-gelu", CPU),
    FastPath("fused-adamw", CPU),
    FastPath("allocator", CPU),
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
    """What the decisions depend on, as plain values resolved once per run
    (``lmctl.run.runtime``): the device type (cpu, cuda, mps, ...), the precision (fp32, bf16,
    fp16), the engine, what wraps the model (keys of :data:`WRAPPER_NAMES`), the processes,
    gradient checkpointing, and ``--fast-paths`` ("auto", "off", or the names it lists)."""

    device: str
    precision: str
    engine: str
    wrappers: tuple[str, ...]
    processes: int
    checkpointing: bool
    requested: str | frozenset[str]


@dataclass(frozen=True)
class Decision:
    on: bool
    reason: str
    #: Off by a setting of the run, which the start-of-run line then says (see summary).
    by_setting: bool = False


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
        return Decision(False, f"{names} runs the model's own forward", by_setting=True)
    if path.one_process and setting.processes > 1:
        return Decision(False, f"{setting.processes} processes", by_setting=True)
    if path.no_checkpointing and setting.checkpointing:
        return Decision(False, "gradient checkpointing", by_setting=True)
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
    def of(cls, setting: Setting) -> FastPaths:
        """The table's decisions under ``setting``."""
        return cls(setting, {path.name: decide(path, setting) for path in TABLE})

    def on(self, name: FastPathName) -> bool:
        return self.decisions[name].on

    def apply(self, name: FastPathName, install: Callable[[], object], unfit: str) -> bool:
        """Run ``install`` where ``name`` is on; a falsy result means the model or machine
        does not fit the path (``unfit`` says how), which then counts as off."""
        if name not in self.asked:
            self.asked.append(name)
        if self.on(name) and not install():
            self.decisions[name] = Decision(False, unfit)
        return self.on(name)

    def set_off(self, name: FastPathName, reason: str) -> None:
        """Record ``name`` as off for ``reason`` (another path took its place)."""
        if name not in self.asked:
            self.asked.append(name)
        self.decisions[name] = Decision(False, reason)

    def fused_adamw(self) -> bool:
        """Whether the engines build torch's fused AdamW (else their own optimizer, as
        upstream's): decided once, as the paths were installed."""
        return "fused-adamw" in self.asked and self.on("fused-adamw")

    def summary(self, *, brief: bool = False) -> str:
        """One line: the setting, then the paths on and off, grouped by why. ``brief``: the
        start-of-run line, which names the paths on, and those off only where a setting of
        the run turned them off (with it); every reason is in :meth:`record`."""
        setting = self.setting
        wrapped = f", {'+'.join(setting.wrappers)}" if setting.wrappers else ""
        head = f"fast paths ({setting.device}, {setting.precision}"
        if not brief:
            head += f", {setting.engine} engine{wrapped}; --fast-paths chooses"
        parts = []
        for state, label in ((True, "on"), (False, "off")):
            groups: dict[str, list[str]] = {}
            for name in self.asked:
                decision = self.decisions[name]
                if decision.on is state and (state or decision.by_setting or not brief):
                    named = decision.reason == "named by --fast-paths"
                    why = "" if brief and state and not named else f" ({decision.reason})"
                    groups.setdefault(why, []).append(name)
            if groups:
                said = ", ".join(", ".join(names) + why for why, names in groups.items())
                parts.append(f"{label}: {said}")
        if brief and not any(self.decisions[name].on for name in self.asked):
            parts.insert(0, "none on")
        return f"{head}): " + ("; ".join(parts) or "none apply")

    def record(self) -> dict[str, Any]:
        """The setting and each asked path's decision with its reason, for the run's metadata."""
        setting = asdict(self.setting)
        if not isinstance(self.setting.requested, str):
            setting["requested"] = sorted(self.setting.requested)
        decisions = {name: self.decisions[name] for name in self.asked}
        paths = {name: {"on": d.on, "reason": d.reason} for name, d in decisions.items()}
        return {"setting": setting, "paths": paths}


def fused_adamw_available(device: str) -> bool:
    """Whether torch's fused AdamW runs on ``device`` (a device type): one kernel per
    parameter group instead of a loop over parameters (CPU since torch 2.4, CUDA, and other
    accelerators it names)."""
    try:
        from torch.optim.optimizer import _get_fused_kernels_supported_devices

        return device in _get_fused_kernels_supported_devices()
    except ImportError:
        return False
