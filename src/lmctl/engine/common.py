"""What both engines share: the result record, progress reporting and loss checks."""

from __future__ import annotations

import json
import time
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl import distributed
from lmctl.console import Console
from lmctl.errors import ConfigError
from lmctl.run import checkpoints, history
from lmctl.run.signals import StopRequest

if TYPE_CHECKING:
    from lmctl.config.base import TrainConfig
    from lmctl.data.stream.positions import StreamCursor

#: Tracker project of both engines (mlflow experiment, trackio project, wandb project); each
#: run is named after its run directory.
TRACKING_PROJECT = "lmctl"
# Keys from the engine's log records shown in the progress display, with their short names.
PROGRESS_KEYS = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad"}


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


def whole_run(
    metrics: dict[str, Any], before: RunTotals | None, global_step: int
) -> dict[str, Any]:
    """A session's end-of-training metrics over the whole run: ``train_loss`` is the mean over
    every step of every segment, ``train_runtime`` their sum; rates stay this session's.

    Without the totals of the checkpoint resumed from (one written by an older lmctl), the
    loss and runtime are named as this segment's instead.
    """
    out = dict(metrics)
    if before is None:
        for key in ("train_loss", "train_runtime"):
            if key in out:
                out[f"{key}_last_segment"] = out.pop(key)
        return out
    if before.steps <= 0 or "train_loss" not in out:
        return out
    session = global_step - before.steps
    out["train_loss"] = (before.loss_sum + out["train_loss"] * session) / max(global_step, 1)
    out["train_runtime"] = round(before.runtime + out.get("train_runtime", 0.0), 4)
    return out


def recorded_totals(before: RunTotals | None) -> dict[str, Any]:
    """The end-of-training metrics of a run resumed at its last step, with nothing left to
    train: the totals its checkpoint recorded (none when it recorded none)."""
    if before is None or before.steps <= 0:
        return {}
    return {
        "train_loss": before.loss_sum / before.steps,
        "train_runtime": round(before.runtime, 4),
    }


class StepReporter:
    """Turns engine events into progress updates and ``metrics.jsonl`` records."""

    def __init__(
        self, console: Console, run_dir: Path, stop: StopRequest, *, is_main: bool
    ) -> None:
        self.console = console
        self.run_dir = run_dir
        self.stop = stop
        self.is_main = is_main
        self.stats: dict[str, Any] = {}
        self._start = 0.0
        self._tokens_at_start = 0
        self._training = False
        self._eval_steps: int | None = None

    def begin(self, total_steps: int, start_step: int = 0, tokens_seen: int = 0) -> None:
        self._start = time.monotonic()
        self._tokens_at_start = tokens_seen
        if self.is_main:
            self._training = True
            self.console.start_progress(total_steps)

    def step(self, step: int, epoch: float | None, tokens_seen: int = 0) -> None:
        if not self.is_main:
            return
        if epoch is not None:
            self.stats["epoch"] = round(epoch, 2)
        elapsed = time.monotonic() - self._start
        if tokens_seen and elapsed > 0:
            self.stats["tok/s"] = int((tokens_seen - self._tokens_at_start) / elapsed)
        self.console.update_progress(step, self.stats, log_line=False)

    def log(self, step: int, epoch: float | None, logs: dict[str, Any]) -> None:
        if not self.is_main:
            return
        record = {"step": step, "epoch": epoch, **logs}
        history.append_metrics(self.run_dir, record)
        for key, short in PROGRESS_KEYS.items():
            if key in logs and isinstance(logs[key], (int, float)):
                self.stats[short] = logs[key]
        is_eval = any(key.startswith("eval_") for key in logs)
        if is_eval:
            shown = ", ".join(
                f"{key} {value:.4g}"
                for key, value in logs.items()
                if key.startswith("eval_") and isinstance(value, (int, float))
            )
            self.console.info(f"step {step}: {shown}")
        elif "loss" in logs:
            self.console.update_progress(step, self.stats, log_line=True)

    def end(self) -> None:
        if self.is_main:
            self._training = False
            self.console.stop_progress()

    def eval_step(self, step: int, total_steps: int | None) -> None:
        """Progress of an evaluation outside training (the final one), as ``lmctl eval``
        shows it; evaluations during training only log their result."""
        if not self.is_main or self._training:
            return
        if self._eval_steps is None:
            self._eval_steps = total_steps or 0
            self.console.start_progress(self._eval_steps, "evaluating")
        self.console.update_progress(step, {}, log_line=False)

    def end_eval(self) -> None:
        if self._eval_steps is not None:
            self._eval_steps = None
            self.console.stop_progress()


def any_process(accelerator: Any, flag: bool) -> bool:
    """Whether ``flag`` holds on any process, so that every process takes the same decision
    (every process must call this at the same point)."""
    if accelerator.num_processes == 1:
        return flag
    import torch

    value = torch.tensor(float(flag), device=accelerator.device)
    return bool(accelerator.reduce(value, "sum").item() > 0)


def end_processes(accelerator: Any) -> None:
    """Release what the accelerator holds, then the process group, while the interpreter is
    fully alive. The caller drops its references to the distributed model first: a gradient
    reducer must not outlive the process group (its teardown would hang). A gloo group left to
    interpreter shutdown can abort a process after a successful run (SIGABRT, "terminate
    called without an active exception"), and the launcher then stops every other process."""
    accelerator.free_memory()
    accelerator.end_training()


def resolve_resume(config: TrainConfig, run_dir: Path, console: Console) -> str | None:
    """The checkpoint to resume from: the one named, or with 'auto' the newest complete one."""
    if config.resume_from_checkpoint is None:
        return None
    if config.resume_from_checkpoint != "auto":
        check_world_size(Path(config.resume_from_checkpoint))
        return config.resume_from_checkpoint
    skipped: list[tuple[Path, str]] = []
    latest = checkpoints.latest_checkpoint(run_dir, skipped)
    for checkpoint, problem in skipped:
        console.warn(f"skipping {checkpoint}: {problem}")
    if latest is None:
        console.info(f"no checkpoint in {run_dir} yet: starting from step 0")
        return None
    check_world_size(latest)
    console.info(f"resuming from {latest}")
    return str(latest)


def check_world_size(checkpoint: Path) -> None:
    """Refuse to continue a checkpoint on another number of processes: the per-process data
    order, RNG streams and stream positions it holds would not carry over exactly."""
    if not checkpoint.is_dir():
        return
    saved = checkpoints.checkpoint_world_size(checkpoint)
    current = distributed.world_size()
    if saved is None or saved == current:
        return
    raise ConfigError(
        f"{checkpoint} was saved by {saved} process(es); this run has {current}",
        f"resume it on {saved}: add --nproc {saved} (or launch with --nproc_per_node "
        f"{saved}), or start a new run to train on {current}",
    )


STREAM_POSITION_FILE = "stream_position.json"


@dataclass
class StreamRecord:
    """One process's place in a training stream, as a checkpoint records it: the pass, the
    batches of it consumed, and for each shard read by each dataloader worker the examples
    given and the position (see :class:`lmctl.data.stream.positions.StreamPlan`; None in
    checkpoints written before positions were recorded, which resume by reading the consumed
    batches again)."""

    epoch: int
    batches: int
    readers: dict[str, list[int]] | None = None
    #: What the readers' positions depend on (see ``StreamCursor.layout``).
    layout: dict[str, int] | None = None

    @classmethod
    def of(cls, epoch: int, batches: int, cursor: StreamCursor | None) -> StreamRecord:
        if cursor is None:
            return cls(epoch, batches)
        # At a pass's start (a save after the pass ended) no reader has given anything yet.
        return cls(epoch, batches, cursor.state() if batches else {}, cursor.layout())

    def continue_in(self, cursor: StreamCursor | None) -> None:
        """Make ``cursor``'s stream seek to the recorded positions (if any were recorded)."""
        if cursor is not None and self.readers is not None:
            cursor.restore(self.epoch, self.readers, self.layout)

    @staticmethod
    def file(checkpoint: Path, rank: int) -> Path:
        """Each process records its own position: ``stream_position.json`` for the first,
        ``stream_position-<rank>.json`` for the others."""
        return checkpoint / (STREAM_POSITION_FILE if rank == 0 else f"stream_position-{rank}.json")

    def write(self, checkpoint: Path, rank: int) -> None:
        record: dict[str, Any] = {"epoch": self.epoch, "batches": self.batches, "rank": rank}
        if self.readers is not None:
            record["readers"] = self.readers
        if self.layout is not None:
            record["layout"] = self.layout
        self.file(checkpoint, rank).write_text(json.dumps(record) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, checkpoint: Path, rank: int = 0) -> StreamRecord | None:
        try:
            data = json.loads(cls.file(checkpoint, rank).read_text(encoding="utf-8"))
            readers = data.get("readers")
            if readers is not None:
                readers = {str(key): [int(value) for value in row] for key, row in readers.items()}
            layout = data.get("layout")
            if layout is not None:
                layout = {str(key): int(value) for key, value in layout.items()}
            return cls(int(data["epoch"]), int(data["batches"]), readers, layout)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None
