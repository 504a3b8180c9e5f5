"""What a run does around its loop, written once for both engines.

An engine module keeps only what truly differs: the Trainer's wiring, or the Accelerate
loop. Both come here for the rest: the trackers they may log to, the sampler that groups
samples by length, a checkpoint written into a staging folder and committed (then rotated),
the final model staged and committed, a non-finite loss that stops every process, the
agreement of every process to stop, and the training record of a run that resumed (perhaps
at its last step) or ran to its end.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.errors import ConfigError
from lmctl.run import checkpoints
from lmctl.run.totals import RunTotals, recorded_totals, whole_run
from lmctl.storage import atomic

if TYPE_CHECKING:
    from lmctl.console import Console

#: Tracker project of both engines (mlflow experiment, trackio project, wandb project); each
#: run is named after its run directory.
TRACKING_PROJECT = "lmctl"


class NonFiniteLoss(RuntimeError):
    def __init__(self, step: int, value: float) -> None:
        super().__init__(f"loss is {value} at step {step}")
        self.step = step
        self.value = value


@dataclass
class EngineResult:
    train_metrics: dict[str, Any] = field(default_factory=dict)
    eval_metrics: dict[str, Any] = field(default_factory=dict)
    global_step: int = 0
    resumed_from: str | None = None
    interrupted_at: int | None = None
    checkpoint: Path | None = None


def check_trackers(report_to: list[str], known: set[str], available: set[str], engine: str) -> None:
    """Refuse, before any work, a tracker the engine does not know or cannot load (an engine
    would skip it silently, or fail after training)."""
    for name in report_to:
        if name == "all":
            continue
        if name not in known:
            raise ConfigError(
                f"--report-to {name}: not a tracker {engine} knows",
                "choose from " + ", ".join(sorted(known)),
            )
        if name not in available:
            raise ConfigError(
                f"--report-to {name}: its package is not installed",
                f"pip install {name.replace('_', '-')}, or drop --report-to {name}",
            )


def length_sampler(lengths: list[int] | None, window: int, seed: int) -> Any:
    """Batches of similar length over ``window`` samples at a time (None: no grouping)."""
    if lengths is None:
        return None
    from lmctl.data.batching import LengthGroupedSampler

    return LengthGroupedSampler(lengths, window, seed)


def any_process(accelerator: Any, flag: bool) -> bool:
    """Whether ``flag`` holds on any process, so that every process takes the same decision
    (every process must call this at the same point)."""
    if accelerator.num_processes == 1:
        return flag
    import torch

    value = torch.tensor(float(flag), device=accelerator.device)
    return bool(accelerator.reduce(value, "sum").item() > 0)


def stop_agreed(accelerator: Any, stop: Any) -> bool:
    """A signal seen by any process stops all of them after the same step."""
    if not any_process(accelerator, stop.requested):
        return False
    stop.adopt()
    return True


def check_finite(accelerator: Any, loss: Any, step: int) -> None:
    """A non-finite loss on any process stops every process before the optimizer step can
    spoil the weights, and without leaving one waiting in a collective."""
    import torch

    finite = bool(torch.isfinite(loss).all())
    if any_process(accelerator, not finite):
        value = float(loss.detach().float().mean()) if not finite else math.nan
        raise NonFiniteLoss(step, value)


def end_processes(accelerator: Any) -> None:
    """Release what the accelerator holds, then the process group, while the interpreter is
    fully alive. The caller drops its references to the distributed model first: a gradient
    reducer must not outlive the process group (its teardown would hang). A gloo group left to
    interpreter shutdown can abort a process after a successful run (SIGABRT, "terminate
    called without an active exception"), and the launcher then stops every other process."""
    accelerator.free_memory()
    accelerator.end_training()


def save_checkpoint(
    run_dir: Path,
    step: int,
    *,
    owner: str,
    commits: bool,
    writes_state: bool,
    wait: Callable[[], Any],
    write_parts: Callable[[Path], Any],
    write_state: Callable[[Path], Any],
    limit: int | None,
    protect: list[Path] | None = None,
) -> Path:
    """``checkpoint-<step>``: every process writes its parts (weights, optimizer, RNG state,
    stream position) into one staging folder, then the main process the trainer state, last;
    the folder is renamed into place once complete, so that a crash never leaves a
    half-written checkpoint that looks complete, and older ones are rotated out.

    ``commits``: this process renames the folder (see ``rundir.commits_checkpoints``).
    """
    final = run_dir / f"checkpoint-{step}"
    staging = atomic.staging_dir(final, owner=owner)
    if commits:
        atomic.begin_staging(final, owner=owner)
    wait()
    write_parts(staging)
    wait()
    if writes_state:
        write_state(staging)
    if commits:
        checkpoints.commit_dir(staging, final)
        checkpoints.rotate_checkpoints(run_dir, limit, protect=protect or [])
    wait()
    return final


def save_final_model(
    run_dir: Path,
    *,
    owner: str,
    is_main: bool,
    wait: Callable[[], Any],
    save: Callable[[Path], Any],
    complete: Callable[[Path], Any] | None = None,
) -> None:
    """The final model, as ``save_pretrained`` writes it: every process takes part in the save
    (sharded models need it), into a staging folder that the main process completes
    (``complete``) and moves into the run directory with its manifest last."""
    staging = checkpoints.model_staging(run_dir, owner=owner)
    if is_main:
        checkpoints.begin_model(run_dir, owner=owner)
    wait()
    save(staging)
    wait()
    if is_main:
        if complete is not None:
            complete(staging)
        checkpoints.commit_model(staging, run_dir)
    wait()


def training_record(
    session_metrics: Callable[[], dict[str, Any]],
    *,
    resumed_from: str | None,
    stepped: bool,
    before: RunTotals | None,
    global_step: int,
    samples: int,
    console: Console,
) -> dict[str, Any]:
    """The run's end-of-training metrics: over every segment of a resumed run, or the totals
    its checkpoint recorded when it resumed at its last step with nothing left to train."""
    if resumed_from is not None and not stepped:
        console.info("the checkpoint was already at the last step; finishing the run")
        metrics = recorded_totals(before)
    else:
        metrics = whole_run(session_metrics(), before, global_step)
    if metrics:
        metrics["train_samples"] = samples
    return metrics


def train_samples(dataset: Any, consumed: Callable[[], int]) -> int:
    """Training examples: the dataset's length, or for a stream the examples consumed."""
    if dataset is not None and hasattr(dataset, "__len__"):
        return len(dataset)
    return consumed()
