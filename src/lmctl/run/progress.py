"""Turning an engine's events into the progress display and ``metrics.jsonl`` records."""

from __future__ import annotations

import time
from pathlib import Path
from typing import Any

from lmctl.console import Console, format_number
from lmctl.run import history
from lmctl.run.signals import StopRequest

# Keys from the engine's log records shown in the progress display, with their short names.
PROGRESS_KEYS = {"loss": "loss", "learning_rate": "lr", "grad_norm": "grad"}


class StepReporter:
    """Turns engine events into progress updates and ``metrics.jsonl`` records."""

    def __init__(
        self,
        console: Console,
        run_dir: Path,
        stop: StopRequest,
        *,
        is_main: bool,
        streaming: bool = False,
    ) -> None:
        self.console = console
        self.run_dir = run_dir
        self.stop = stop
        self.is_main = is_main
        #: Training reads a stream: its epoch is the number of passes completed over it.
        self.streaming = streaming
        self.stats: dict[str, Any] = {}
        self._start = 0.0
        self._tokens_at_start = 0
        self._training = False
        self._evaluating = False

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
            self.stats["epoch"] = int(epoch) if self.streaming else round(epoch, 2)
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
            # As the end-of-run summary shows them: the same number reads the same in both.
            shown = ", ".join(
                f"{key} {format_number(value)}"
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
        shows it; evaluations during training only log their result. ``total_steps`` None:
        the evaluation reads a stream, whose length is known once it has been read."""
        if not self.is_main or self._training:
            return
        if not self._evaluating:
            self._evaluating = True
            self.console.start_progress(total_steps, "evaluating")
        self.console.update_progress(step, {}, log_line=False)

    def end_eval(self, samples: int) -> None:
        """The evaluation's end, with the samples it saw (said when a stream's length was
        not known beforehand)."""
        if self._evaluating:
            self._evaluating = False
            self.console.stop_progress(samples)
