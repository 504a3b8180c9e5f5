"""Imported into a training run with ``--import``: each process writes the examples it trains
on (token ids, padding and masking undone) to ``$LMCTL_RECORD_DIR/rank-<RANK>.jsonl``;
``$LMCTL_STEP_DELAY`` seconds of sleep per training forward slow a tiny run down enough to
kill it between two checkpoints; ``$LMCTL_NAN_RANK`` makes that process's loss NaN from the
third training forward on."""

from __future__ import annotations

import functools
import json
import os
import time
from pathlib import Path
from typing import Any

import torch
from transformers import BertForMaskedLM, GPT2LMHeadModel

CALLS = {"n": 0}


def _recording(forward: Any) -> Any:
    @functools.wraps(forward)  # the Trainer reads the label names from the signature
    def wrapped(self: Any, *args: Any, **kwargs: Any) -> Any:
        output = forward(self, *args, **kwargs)
        if not self.training:
            return output
        CALLS["n"] += 1
        rank = os.environ.get("RANK", "0")
        folder = os.environ.get("LMCTL_RECORD_DIR")
        if folder:
            ids, labels = kwargs["input_ids"], kwargs.get("labels")
            if labels is not None:
                ids = torch.where(labels != -100, labels, ids)
            mask = kwargs.get("attention_mask")
            rows = [
                row[mask[index].bool()].tolist() if mask is not None else row.tolist()
                for index, row in enumerate(ids)
            ]
            with (Path(folder) / f"rank-{rank}.jsonl").open("a") as handle:
                for row in rows:
                    handle.write(json.dumps(row) + "\n")
        delay = float(os.environ.get("LMCTL_STEP_DELAY", "0"))
        if delay:
            time.sleep(delay)
        if os.environ.get("LMCTL_NAN_RANK") == rank and CALLS["n"] >= 3:
            output.loss = output.loss * float("nan")
        return output

    return wrapped


GPT2LMHeadModel.forward = _recording(GPT2LMHeadModel.forward)  # type: ignore[method-assign]
BertForMaskedLM.forward = _recording(BertForMaskedLM.forward)  # type: ignore[method-assign]
