"""What a run learns about where it runs, decided once at its start and handed down.

The precision, the device, the processes and dataloader workers that read the data, the
checkpoint to continue from and which fast paths run are facts of the machine and the
launch, not of the document: :func:`resolve_runtime` decides each of them once, where
training or evaluation starts, and no layer below probes the hardware or reads the
launcher's environment for them.
"""

from __future__ import annotations

import os
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Literal

from lmctl import distributed
from lmctl.errors import ConfigError
from lmctl.run import checkpoints
from lmctl.run.totals import BatchShape

if TYPE_CHECKING:
    from lmctl.config.slices import DataSpec, LoopSpec, RunSpec, ScaleSpec
    from lmctl.console import Console
    from lmctl.fastpaths.table import FastPaths, Setting


@dataclass(frozen=True)
class Runtime:
    #: The autocast dtype (None: fp32).
    precision: Literal["bf16", "fp16"] | None
    #: The device type this process computes on (cpu, cuda, ...).
    device: str
    #: Whether training is told the CPU is its device (bf16 autocast on a CPU, or several
    #: processes of a machine without an accelerator training together).
    cpu_only: bool
    processes: int
    rank: int
    #: Dataloader worker processes of each process.
    workers: int
    #: The checkpoint training continues from (None: step 0).
    resume: Path | None
    fast_paths: FastPaths

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    @property
    def pad_multiple(self) -> int | None:
        """Batches are padded to a multiple of 8 under mixed precision (tensor cores)."""
        return 8 if self.precision is not None else None

    @property
    def readers(self) -> int:
        """Readers of a stream: every dataloader worker of every process."""
        return max(1, self.processes) * max(1, self.workers)


def _environment_flag(name: str) -> bool:
    return os.environ.get(name, "").lower() in ("1", "true", "yes", "on")


def device_type(use_cpu: bool) -> str:
    """The accelerator's device type (cuda, mps, xpu, ...) unless the CPU is asked for
    (``training_args.use_cpu``, ``accelerate launch --cpu``)."""
    import torch

    if use_cpu or _environment_flag("ACCELERATE_USE_CPU"):
        return "cpu"
    accelerator = (
        torch.accelerator.current_accelerator() if torch.accelerator.is_available() else None
    )
    return accelerator.type if accelerator is not None else "cpu"


def wrappers(spec: RunSpec) -> tuple[str, ...]:
    """What wraps, shards or replaces the model in training (DeepSpeed, FSDP, LoRA, a compiled
    graph), asked for by lmctl's flags, by ``training_args`` or by an ``accelerate launch``
    config."""
    passed = spec.loop.training_args
    found = [
        name
        for name in ("deepspeed", "fsdp", "megatron_lm")
        if _environment_flag(f"ACCELERATE_USE_{name.upper()}")
    ]
    if spec.scale.deepspeed or passed.get("deepspeed"):
        found.append("deepspeed")
    if spec.scale.fsdp or passed.get("fsdp"):
        found.append("fsdp")
    if spec.adapter.peft:
        found.append("lora")
    if spec.compute.torch_compile or passed.get("torch_compile"):
        found.append("compile")
    return tuple(dict.fromkeys(found))


def resume_point(spec: RunSpec, run_dir: Path, console: Console) -> Path | None:
    """The checkpoint training continues from (``checkpoints.resume_checkpoint`` says which,
    and why newer ones were skipped); it must have been saved by as many processes as this
    run has."""
    if not spec.loop.do_train:
        return None
    checkpoint = checkpoints.resume_checkpoint(spec.run_dir, run_dir, console)
    if checkpoint is not None:
        check_world_size(checkpoint, spec)
        if checkpoint.is_dir() and not checkpoints.holds_training_state(checkpoint):
            console.info(
                f"{checkpoint.name} holds the model alone (save_only_model): training goes on "
                "from its weights with a new optimizer state (AdamW's moments start from "
                "zero) and new random states; the learning-rate schedule goes on"
            )
    return checkpoint


def check_world_size(checkpoint: Path, spec: RunSpec) -> None:
    """A checkpoint continues on another number of processes with the same global batch
    (``lmctl resume`` chooses the accumulation steps for it, see :mod:`lmctl.run.resume`): the
    seeded order of map-style data is split between processes by global batch, so every step
    trains on the same examples. What is cut per process is refused: a stream's positions,
    sharded optimizer states, length groups."""
    if not checkpoint.is_dir():
        return
    saved = checkpoints.checkpoint_world_size(checkpoint)
    current = distributed.world_size()
    if saved is None or saved == current:
        return
    problem = world_change_problem(spec.data, spec.scale, spec.loop)
    shape = BatchShape.of_checkpoint(checkpoint)
    loop = spec.loop
    here = BatchShape(loop.per_device_train_batch_size, current, loop.gradient_accumulation_steps)
    if problem is None and shape is None:
        problem = "it does not record its global batch (it was written by an older lmctl)"
    if problem is None and shape is not None and shape.size != here.size:
        problem = f"its global batch is {shape.describe()}; this run's would be {here.describe()}"
    if problem is None:
        return
    raise ConfigError(
        f"{checkpoint} was saved by {saved} process(es) and cannot continue on {current}: "
        f"{problem}",
        f"resume it on {saved} (lmctl resume RUN_DIR without --nproc), or start a new run",
    )


def world_change_problem(data: DataSpec, scale: ScaleSpec, loop: LoopSpec) -> str | None:
    """Why a run cannot continue on another number of processes (None: it can)."""
    if data.streaming:
        return "a stream's recorded positions belong to the processes that read them"
    if scale.deepspeed:
        return "its DeepSpeed ZeRO states are sharded per process (resharding is not supported)"
    if scale.fsdp:
        return "its FSDP states are sharded per process (resharding is not supported)"
    if loop.group_by_length:
        return "--group-by-length groups samples within each process's share of a step"
    return None


def fast_path_setting(spec: RunSpec, device: str, precision: str | None) -> Setting:
    """What the fast paths' decisions depend on, in this process."""
    from lmctl.fastpaths.table import Setting

    names = spec.compute.fast_path_names()
    return Setting(
        device=device,
        precision=precision or "fp32",
        engine=spec.loop.engine,
        wrappers=wrappers(spec),
        processes=distributed.world_size(),
        checkpointing=bool(
            spec.model.gradient_checkpointing
            or spec.loop.training_args.get("gradient_checkpointing")
        ),
        requested=spec.compute.fast_paths if names is None else names,
    )


def decide_fast_paths(spec: RunSpec) -> FastPaths:
    """The fast paths a run of ``spec`` takes in this process (before the model is checked)."""
    from lmctl.fastpaths.table import FastPaths

    device = device_type(bool(spec.loop.training_args.get("use_cpu")))
    precision = spec.compute.mixed_precision(distributed.native_bf16)
    return FastPaths.of(fast_path_setting(spec, device, precision))


def resolve_runtime(spec: RunSpec, run_dir: Path, console: Console) -> Runtime:
    """Decide, once, what the run computes on and where it continues from."""
    import torch

    from lmctl.fastpaths.table import FastPaths

    processes = distributed.world_size()
    use_cpu = bool(spec.loop.training_args.get("use_cpu"))
    device = device_type(use_cpu)
    precision = spec.compute.mixed_precision(distributed.native_bf16)
    # The engines run bf16 autocast on a CPU, and several processes of a machine without an
    # accelerator train together on its CPUs (gloo) instead of each as a separate job, only
    # when told the CPU is the device.
    alone_on_cpu = not torch.accelerator.is_available() and (precision == "bf16" or processes > 1)
    return Runtime(
        precision=precision,
        device=device,
        cpu_only=use_cpu or alone_on_cpu,
        processes=processes,
        rank=distributed.rank(),
        workers=spec.loop.dataloader_num_workers,
        resume=resume_point(spec, run_dir, console),
        fast_paths=FastPaths.of(fast_path_setting(spec, device, precision)),
    )
