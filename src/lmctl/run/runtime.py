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
from lmctl.run import checkpoints, reshard
from lmctl.run.restarts import restarted
from lmctl.run.totals import BatchShape

if TYPE_CHECKING:
    from lmctl.config.slices import DataSpec, LoopSpec, RunSpec, ScaleSpec
    from lmctl.console import Console
    from lmctl.fastpaths.table import FastPaths, Setting


#: Said when a stream continues on another number of processes than saved it.
STREAM_WORLD_NOTE = (
    "the stream goes on from every shard's recorded position, its shards shared between the "
    "processes anew: no example is read twice or skipped, but the examples are not batched "
    "in the uninterrupted run's order"
)


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
    #: After a restart on another number of processes than saved ``resume``: the per-device
    #: batch and accumulation steps that keep its global batch (None: the run's own).
    batch: BatchShape | None
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


def resume_point(
    spec: RunSpec, run_dir: Path, console: Console
) -> tuple[Path | None, BatchShape | None]:
    """The checkpoint training continues from (``checkpoints.resume_checkpoint`` says which,
    and why newer ones were skipped), and the batch shape that keeps its global batch when a
    restart continues it on another number of processes (see :func:`check_world_size`)."""
    if not spec.loop.do_train:
        return None, None
    checkpoint = checkpoints.resume_checkpoint(spec.run_dir, run_dir, console)
    if checkpoint is None:
        return None, None
    batch = check_world_size(checkpoint, spec)
    if batch is not None and distributed.is_main_process():
        saved = checkpoints.checkpoint_world_size(checkpoint)
        console.info(batch.continuing(checkpoint.name, saved))
        if spec.data.streaming:
            console.info(STREAM_WORLD_NOTE)
    if checkpoint.is_dir() and not checkpoints.holds_training_state(checkpoint):
        console.info(
            f"{checkpoint.name} holds the model alone (save_only_model): training goes on "
            "from its weights with a new optimizer state (AdamW's moments start from "
            "zero) and new random states; the learning-rate schedule goes on"
        )
    return checkpoint, batch


def batch_on(
    checkpoint: Path,
    processes: int,
    run: tuple[DataSpec, ScaleSpec, LoopSpec],
    flag: str | None = None,
) -> BatchShape | None:
    """How ``checkpoint`` continues on ``processes`` processes with the global batch it
    recorded: the per-device batch and accumulation steps that keep it (None: it was saved by
    as many processes, or holds no training state). The seeded order of map-style data is
    split between processes by global batch, so every step trains on the same examples.
    A stream goes on from every shard's recorded position, its shards shared anew between
    the processes. What is cut per process is refused: sharded optimizer states, length
    groups; and a global batch, or a stream's recorded shards, that does not split evenly.
    ``flag``: the option that asked for ``processes``, named first in a refusal."""
    asked = f"{flag}: " if flag else ""
    saved = checkpoints.checkpoint_world_size(checkpoint) if checkpoint.is_dir() else None
    if saved is None or saved == processes:
        return None
    problem = world_change_problem(*run)
    if problem is None and run[0].streaming:
        problem = _stream_split(checkpoint, processes, run[2].dataloader_num_workers, asked)
    shape = BatchShape.of_checkpoint(checkpoint)
    if problem is None and shape is None:
        problem = "it does not record its global batch (it was written by an older lmctl)"
    if problem is not None or shape is None:
        raise ConfigError(
            f"{asked}{checkpoint.name} was saved by {saved} process(es) and cannot continue on "
            f"{processes}: {problem}",
            f"resume it on {saved} (leave --nproc out), or start a new run",
        )
    new = shape.on(processes)
    if new is None:
        fits = [n for n in range(1, shape.size + 1) if shape.size % n == 0 and n <= 64]
        raise ConfigError(
            f"{asked}the global batch of {checkpoint.name}, {shape.describe()}, "
            f"does not split evenly over {processes} processes",
            "resume on a number of processes that divides it: " + ", ".join(map(str, fits)),
        )
    return new


def _stream_split(checkpoint: Path, processes: int, workers: int, asked: str) -> str | None:
    """Why the checkpoint's stream cannot go on with ``processes`` (None: it can); shards
    that they cannot share evenly are refused here, naming the numbers that can."""
    from lmctl.data.stream.positions import StreamRecord, check_split

    record = StreamRecord.read(checkpoint)
    if record is None or record.layout is None or record.readers is None:
        return (
            "its stream's positions were not recorded (a mixture read without them, or a "
            "checkpoint of an older lmctl)"
        )
    workers = record.layout.get("workers", workers)
    check_split(record.layout["shards"], workers, processes, f"{asked}{checkpoint.name}")
    return None


def check_world_size(checkpoint: Path, spec: RunSpec) -> BatchShape | None:
    """A checkpoint saved by another number of processes than this run has continues with
    the same global batch: ``lmctl resume`` chose the batch shape for it before launching;
    after a restart by the elastic agent on fewer or more machines (``--nnodes MIN:MAX``),
    the shape to continue with is returned. Anything else is refused."""
    current = distributed.world_size()
    new = batch_on(checkpoint, current, (spec.data, spec.scale, spec.loop))
    here = BatchShape.of(spec.loop, current)
    if new is not None and spec.scale.deepspeed and not reshard.has_universal(checkpoint):
        raise ConfigError(
            f"{checkpoint} was saved by {checkpoints.checkpoint_world_size(checkpoint)} "
            f"process(es) and its DeepSpeed ZeRO states are not converted for {current}",
            f"resume it with lmctl resume RUN_DIR --nproc {current} (it converts them)",
        )
    if new is None or new.size == here.size:
        return None
    if restarted():
        return new
    shape = BatchShape.of_checkpoint(checkpoint)
    assert shape is not None
    saved = checkpoints.checkpoint_world_size(checkpoint)
    raise ConfigError(
        f"{checkpoint} was saved by {saved} process(es) and cannot continue on {current}: "
        f"its global batch is {shape.describe()}; this run's would be {here.describe()}",
        f"resume it with lmctl resume RUN_DIR --nproc {current} (it keeps the global batch), "
        "or start a new run",
    )


def world_change_problem(data: DataSpec, scale: ScaleSpec, loop: LoopSpec) -> str | None:
    """Why a run cannot continue on another number of processes (None: it can)."""
    if scale.deepspeed and loop.engine != "trainer":
        return (
            "the accelerate engine does not reshard DeepSpeed ZeRO states (the trainer engine "
            "does, through DeepSpeed's universal checkpoint)"
        )
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
    resume, batch = resume_point(spec, run_dir, console)
    return Runtime(
        precision=precision,
        device=device,
        cpu_only=use_cpu or alone_on_cpu,
        processes=processes,
        rank=distributed.rank(),
        workers=spec.loop.dataloader_num_workers,
        resume=resume,
        batch=batch,
        fast_paths=FastPaths.of(fast_path_setting(spec, device, precision)),
    )
