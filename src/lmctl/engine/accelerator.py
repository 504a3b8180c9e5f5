"""The Accelerator of a run of the ``accelerate`` engine."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.engine.sharding import accelerate_plugins
from lmctl.errors import ConfigError

if TYPE_CHECKING:
    from lmctl.config.slices import RunSpec
    from lmctl.run.runtime import Runtime


def make_accelerator(spec: RunSpec, runtime: Runtime, run_dir: Path) -> Any:
    """An Accelerator for a run; a setting it cannot honour becomes a config error.

    The sampler is seeded per epoch (``seed + epoch``), so the data order of any epoch can be
    replayed on resume, and matches the ``trainer`` engine's. Streaming data is not dispatched
    from the main process: every process reads its own shards. Without --bf16/--fp16 the mixed
    precision of ``accelerate launch --mixed_precision`` (or its config) applies.
    """
    from accelerate import Accelerator
    from accelerate.utils import (
        DataLoaderConfiguration,
        GradientAccumulationPlugin,
        ProjectConfiguration,
    )

    precision, loop = runtime.precision, spec.loop
    try:
        accelerator = Accelerator(
            cpu=runtime.cpu_only,
            # A stream's window closes when it is full, as the Trainer's does: its pass ends
            # at a different batch on each process (cut to the shortest), where Accelerate
            # would close the window on one process and not on another.
            gradient_accumulation_plugin=GradientAccumulationPlugin(
                num_steps=loop.gradient_accumulation_steps,
                sync_with_dataloader=not spec.data.streaming,
            ),
            mixed_precision=precision,
            log_with=list(spec.tracking.report_to) or None,
            project_config=ProjectConfiguration(
                project_dir=str(run_dir), logging_dir=str(run_dir / "runs")
            ),
            dataloader_config=DataLoaderConfiguration(
                use_seedable_sampler=True, data_seed=loop.seed, dispatch_batches=False
            ),
            step_scheduler_with_optimizer=False,
            dynamo_backend="inductor" if spec.compute.torch_compile else None,
            **accelerate_plugins(spec.scale),
        )
    except (ValueError, ImportError) as exc:
        raise ConfigError(
            f"accelerate can't run this configuration: {exc}",
            "check --bf16/--fp16, --deepspeed/--fsdp and the settings of accelerate launch or "
            "accelerate config",
        ) from exc
    if precision is not None and not (accelerator.native_amp or precision == "bf16"):
        raise ConfigError(
            f"--{precision}: mixed precision is not available on {accelerator.device.type}",
            "use --bf16 on a CPU, or --fp16 on a CUDA GPU",
        )
    return accelerator
