"""The record a training loop keeps as the Trainer keeps it, for the accelerate engine.

Its ``TrainerState`` (saved as ``trainer_state.json``), the tokens, FLOPs and samples of this
session (per process, summed over every process when a record is made), and each log record:
to ``metrics.jsonl`` and the progress display (through the reporter), the state's log history
and the trackers.
"""

from __future__ import annotations

from typing import TYPE_CHECKING, Any

from lmctl.distributed import summed

if TYPE_CHECKING:
    from lmctl.run.progress import StepReporter


#: Where a checkpoint's ``trainer_state.json`` records the samples trained on so far (under
#: ``stateful_callbacks``; the TrainerState has no field for them).
SAMPLES = "LmctlTrainSamples"


def batch_size(batch: dict[str, Any]) -> int:
    return int(next(iter(batch.values())).shape[0])


class LoopRecord:
    def __init__(self, accelerator: Any, model: Any, reporter: StepReporter) -> None:
        from transformers import TrainerState

        self.accelerator = accelerator
        self.reporter = reporter
        self.state = TrainerState(
            is_local_process_zero=bool(accelerator.is_local_main_process),
            is_world_process_zero=bool(accelerator.is_main_process),
        )
        # Counters of this session, per process; summed over processes by totals().
        self.local = {"tokens": 0.0, "flos": 0.0, "samples": 0.0}
        #: The run's counters before this session (a resumed run: its checkpoint's).
        self.restored: dict[str, float] = {"tokens": 0, "flos": 0.0, "samples": 0}
        self.flos_per_token = 6 * model.num_parameters(exclude_embeddings=True)
        self.main_input = getattr(model, "main_input_name", "input_ids")

    def restore(self, saved: Any, *, samples_per_step: int) -> None:
        """Continue the run totals of a checkpoint's state. A checkpoint without a count of
        samples (written by an older lmctl) counts ``samples_per_step`` for each of its
        steps, as the Trainer counts them."""
        recorded = (saved.stateful_callbacks or {}).get(SAMPLES, {}).get("samples")
        self.restored = {
            "tokens": saved.num_input_tokens_seen,
            "flos": saved.total_flos,
            "samples": saved.global_step * samples_per_step if recorded is None else recorded,
        }

    def count(self, batch: dict[str, Any]) -> None:
        tokens = batch[self.main_input].numel() if self.main_input in batch else 0
        self.local["tokens"] += tokens
        self.local["flos"] += self.flos_per_token * tokens
        self.local["samples"] += batch_size(batch)

    def totals(self) -> dict[str, float]:
        """This session's counters summed over processes (every process must call this); the
        run's totals go into the trainer state."""
        totals = summed(self.local, self.accelerator)
        self.state.num_input_tokens_seen = int(self.restored["tokens"] + totals["tokens"])
        self.state.total_flos = self.restored["flos"] + totals["flos"]
        # Not a callback: TrainerState keeps this mapping as is, and the Trainer ignores
        # names it does not know.
        extra: Any = self.state.stateful_callbacks or {}
        extra[SAMPLES] = {"samples": int(self.restored["samples"] + totals["samples"])}
        self.state.stateful_callbacks = extra
        return totals

    def run_samples(self) -> int:
        """Training samples over the whole run, every segment of a resumed one (every
        process must call this)."""
        return int(self.restored["samples"] + self.totals()["samples"])

    def tokens_estimate(self) -> int:
        """Tokens seen so far for the progress display, without synchronising processes."""
        return int(self.restored["tokens"] + self.local["tokens"] * self.accelerator.num_processes)

    def log(self, logs: dict[str, Any], *, train_start: float | None = None) -> dict[str, Any]:
        """One log record, as the Trainer writes it; returns the record."""
        from transformers.trainer_utils import speed_metrics

        totals = self.totals()
        state = self.state
        logs = {key: value for key, value in logs.items() if value is not None}
        logs["epoch"] = state.epoch
        logs["num_input_tokens_seen"] = state.num_input_tokens_seen
        if train_start is not None:
            logs.update(speed_metrics("train", train_start, num_tokens=totals["tokens"]))
        state.log_history.append({**logs, "step": state.global_step})
        self.reporter.log(state.global_step, state.epoch, logs)
        tracked = {
            (f"eval/{key[5:]}" if key.startswith("eval_") else f"train/{key}"): value
            for key, value in logs.items()
            if isinstance(value, (int, float))
        }
        self.accelerator.log(tracked, step=state.global_step)
        return logs
