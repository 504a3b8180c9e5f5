"""Imported into a training run with ``--import``: each process writes the examples it trains
on (token ids, padding and masking undone) to ``$LMCTL_RECORD_DIR/rank-<RANK>.jsonl``
(``rank-<RANK>.restart-<N>.jsonl`` for the Nth restart of the process by torchrun's agent);
``$LMCTL_STEP_DELAY`` seconds of sleep per training forward slow a tiny run down enough to
kill it between two checkpoints; ``$LMCTL_NAN_RANK`` makes that process's loss NaN from the
third training forward on. Training batches are seen in the model's own forward, or where
lmctl takes the loss from the hidden states, in the body's pass that replaces it. At exit,
each process writes ``exit-<RANK>.json``: whether its process group was still up when the
interpreter began to shut down."""

from __future__ import annotations

import atexit
import functools
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from transformers import BertForMaskedLM, GPT2LMHeadModel

from lmctl.metrics.lm_head import TiledHead

CALLS = {"n": 0}


def _record_name(rank: str) -> str:
    """A restarted process records apart from the attempts before it."""
    restart = int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))
    return f"rank-{rank}.restart-{restart}.jsonl" if restart else f"rank-{rank}.jsonl"


def _observe(inputs: dict[str, Any]) -> bool:
    """Record one training batch and sleep as asked; returns whether this process's loss is
    to become NaN."""
    CALLS["n"] += 1
    rank = os.environ.get("RANK", "0")
    folder = os.environ.get("LMCTL_RECORD_DIR")
    if folder:
        ids, labels = inputs["input_ids"], inputs.get("labels")
        if labels is not None:
            ids = torch.where(labels != -100, labels, ids)
        mask = inputs.get("attention_mask")
        rows = [
            row[mask[index].bool()].tolist() if mask is not None else row.tolist()
            for index, row in enumerate(ids)
        ]
        with (Path(folder) / _record_name(rank)).open("a") as handle:
            for row in rows:
                handle.write(json.dumps(row) + "\n")
    delay = float(os.environ.get("LMCTL_STEP_DELAY", "0"))
    if delay:
        time.sleep(delay)
    return os.environ.get("LMCTL_NAN_RANK") == rank and CALLS["n"] >= 3


def _recording(forward: Any) -> Any:
    """The model's own forward (models that keep it: DeepSpeed, FSDP, LoRA)."""

    @functools.wraps(forward)  # the Trainer reads the label names from the signature
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = forward(self, *args, **kwargs)
        if self.training and _observe(kwargs):
            output.loss = output.loss * float("nan")
        return output

    return wrapped


def _recording_hidden(hidden: Any) -> Any:
    """The body's pass of a training loss taken from the hidden states (lmctl.fastpaths.losses),
    which runs instead of the model's own forward: its inputs still hold the labels."""

    @functools.wraps(hidden)
    def wrapped(self: Any, inputs: dict[str, Any]) -> Any:
        states = hidden(self, inputs)
        if "labels" not in inputs or not self.body.training or not torch.is_grad_enabled():
            return states
        return states * float("nan") if _observe(inputs) else states

    return wrapped


def _record_exit() -> None:
    folder = os.environ.get("LMCTL_RECORD_DIR")
    if folder:
        alive = torch.distributed.is_available() and torch.distributed.is_initialized()
        exit_file = Path(folder) / f"exit-{os.environ.get('RANK', '0')}.json"
        exit_file.write_text(json.dumps({"process_group": alive}))


atexit.register(_record_exit)
GPT2LMHeadModel.forward = _recording(GPT2LMHeadModel.forward)  # type: ignore[method-assign]
BertForMaskedLM.forward = _recording(BertForMaskedLM.forward)  # type: ignore[method-assign]
TiledHead.hidden = _recording_hidden(TiledHead.hidden)  # type: ignore[method-assign]
