"""A run's training totals over every segment of it, as its checkpoints record them, so that
a resumed run reports the mean loss, the runtime and the rates of the whole run."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from lmctl.run import checkpoints

#: Where a checkpoint's ``trainer_state.json`` records the run's training totals so far
#: (under ``stateful_callbacks``; the Trainer ignores names it does not know).
RUN_TOTALS = "LmctlRunTotals"


@dataclass
class RunTotals:
    """Training totals of a run up to a step, over every segment of it (a resumed run goes
    on from those of its checkpoint)."""

    steps: int = 0
    #: Sum of the per-step training losses.
    loss_sum: float = 0.0
    #: Seconds spent training.
    runtime: float = 0.0

    def then(self, steps: int, session_loss_sum: float, session_seconds: float) -> RunTotals:
        """The totals after this session's steps so far."""
        return RunTotals(steps, self.loss_sum + session_loss_sum, self.runtime + session_seconds)

    def record(self, state: Any) -> None:
        """Store in a ``TrainerState`` about to be saved into a checkpoint."""
        extra: Any = state.stateful_callbacks or {}
        extra[RUN_TOTALS] = asdict(self)
        state.stateful_callbacks = extra

    @classmethod
    def of_checkpoint(cls, checkpoint: str | None) -> RunTotals | None:
        """The totals a checkpoint recorded (a fresh run: zero; None: unknown)."""
        if checkpoint is None:
            return cls()
        try:
            saved = checkpoints.read_checkpoint_state(Path(checkpoint))
            data = (saved.get("stateful_callbacks") or {})[RUN_TOTALS]
            return cls(int(data["steps"]), float(data["loss_sum"]), float(data["runtime"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None


#: A session's rates, which a resumed run reports over the whole run.
RATES = ("train_samples_per_second", "train_steps_per_second")


def whole_run(
    metrics: dict[str, Any], before: RunTotals | None, global_step: int
) -> dict[str, Any]:
    """A session's end-of-training metrics over the whole run: ``train_loss`` is the mean over
    every step of every segment, ``train_runtime`` their sum, and the rates are those of that
    sum (the steps of the whole run over its runtime; its samples, at this session's samples
    per step), so that rate times runtime is what the whole run trained on.

    Without the totals of the checkpoint resumed from (one written by an older lmctl), the
    loss, runtime and rates are named as this segment's instead.
    """
    out = dict(metrics)
    if before is None:
        for key in ("train_loss", "train_runtime", *RATES):
            if key in out:
                out[f"{key}_last_segment"] = out.pop(key)
        return out
    if before.steps <= 0 or "train_loss" not in out:
        return out
    session = global_step - before.steps
    out["train_loss"] = (before.loss_sum + out["train_loss"] * session) / max(global_step, 1)
    seconds = out.get("train_runtime", 0.0)
    out["train_runtime"] = round(before.runtime + seconds, 4)
    return {**out, **_rates(out, seconds, session, global_step)}


def _rates(
    metrics: dict[str, Any], seconds: float, session: int, global_step: int
) -> dict[str, float]:
    """The rates over the whole run, rounded as the Trainer rounds them."""
    runtime = metrics["train_runtime"]
    if runtime <= 0 or session <= 0:
        return {}
    rates = {"train_steps_per_second": round(global_step / runtime, 3)}
    samples = metrics.get("train_samples_per_second")
    if isinstance(samples, (int, float)):
        per_step = samples * seconds / session
        rates["train_samples_per_second"] = round(per_step * global_step / runtime, 3)
    return rates


def recorded_totals(before: RunTotals | None) -> dict[str, Any]:
    """The end-of-training metrics of a run resumed at its last step, with nothing left to
    train: the totals its checkpoint recorded (none when it recorded none)."""
    if before is None or before.steps <= 0:
        return {}
    metrics = {
        "train_loss": before.loss_sum / before.steps,
        "train_runtime": round(before.runtime, 4),
    }
    if before.runtime > 0:
        metrics["train_steps_per_second"] = round(before.steps / before.runtime, 3)
    return metrics


#: Where a checkpoint's ``trainer_state.json`` records the shape of the global batch that
#: trained it (under ``stateful_callbacks``), so that a resume on another number of
#: processes keeps the same global batch.
GLOBAL_BATCH = "LmctlGlobalBatch"


@dataclass(frozen=True)
class BatchShape:
    """The global batch of an optimizer step: per-device batch x processes x accumulation."""

    per_device: int
    processes: int
    accumulation: int

    @property
    def size(self) -> int:
        return self.per_device * self.processes * self.accumulation

    def describe(self) -> str:
        return (
            f"{self.size} = {self.per_device} per device x {self.processes} process(es) x "
            f"{self.accumulation} accumulation step(s)"
        )

    def continuing(self, checkpoint: str, saved: int | None) -> str:
        """The line that says a checkpoint continues on another number of processes."""
        return (
            f"{checkpoint} was saved by {saved} process(es); continuing on {self.processes} "
            f"with the same global batch of {self.describe()}"
        )

    @classmethod
    def of(cls, loop: Any, processes: int) -> BatchShape:
        """The shape a training loop's settings (``TrainingArguments`` or ``LoopSpec``) give on
        ``processes`` processes."""
        return cls(loop.per_device_train_batch_size, processes, loop.gradient_accumulation_steps)

    def record(self, state: Any) -> None:
        """Store in a ``TrainerState`` about to be saved into a checkpoint."""
        extra: Any = state.stateful_callbacks or {}
        extra[GLOBAL_BATCH] = asdict(self)
        state.stateful_callbacks = extra

    @classmethod
    def of_checkpoint(cls, checkpoint: Path) -> BatchShape | None:
        """The shape a checkpoint recorded (None: a checkpoint written before it was)."""
        try:
            saved = checkpoints.read_checkpoint_state(checkpoint)
            data = (saved.get("stateful_callbacks") or {})[GLOBAL_BATCH]
            return cls(int(data["per_device"]), int(data["processes"]), int(data["accumulation"]))
        except (OSError, ValueError, KeyError, TypeError):
            return None

    def on(self, processes: int) -> BatchShape | None:
        """The same global batch on ``processes`` processes: the per-device batch kept and the
        accumulation steps changed when that divides, else the largest smaller per-device
        batch that does (None: the global batch does not split evenly over ``processes``)."""
        if self.size % processes:
            return None
        share = self.size // processes
        per_device = max(b for b in range(1, self.per_device + 1) if share % b == 0)
        return BatchShape(per_device, processes, share // per_device)
