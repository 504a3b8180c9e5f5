"""DeepSpeed ZeRO states continued on another number of processes.

A ZeRO checkpoint holds each process's shard of the optimizer states (and, under ZeRO-3, of the
weights). Before a run continues on another number of processes, its checkpoint is converted
once into DeepSpeed's universal checkpoint (``deepspeed.checkpoint.ds_to_universal``): a
folder ``<tag>_universal`` beside the checkpoint's own states, named by the file
``latest_universal``, which DeepSpeed loads on any number of processes when its config says
``checkpoint.load_universal``. The checkpoint's own states are left as they were; the file
that names the conversion is written last, so an interrupted conversion is redone.
"""

from __future__ import annotations

import argparse
import contextlib
import io
import os
import shutil
from pathlib import Path
from typing import TYPE_CHECKING

from lmctl.errors import ConfigError
from lmctl.run import checkpoints

if TYPE_CHECKING:
    from lmctl.console import Console

#: The file DeepSpeed reads a universal checkpoint's tag from.
UNIVERSAL_LATEST = "latest_universal"
#: The file DeepSpeed reads a checkpoint's own tag from.
LATEST = "latest"


def has_universal(checkpoint: Path) -> bool:
    """Whether ``checkpoint`` holds a complete universal conversion of its ZeRO states."""
    latest = checkpoint / UNIVERSAL_LATEST
    try:
        return (checkpoint / latest.read_text(encoding="utf-8").strip()).is_dir()
    except OSError:
        return False


def converted_for(checkpoint: Path | None, processes: int) -> bool:
    """Whether a run of ``processes`` processes continues ``checkpoint`` (saved by another
    number) from its universal conversion."""
    if checkpoint is None or not has_universal(checkpoint):
        return False
    return checkpoints.checkpoint_world_size(checkpoint) not in (None, processes)


def is_deepspeed_checkpoint(checkpoint: Path) -> bool:
    """Whether ``checkpoint`` holds DeepSpeed's own states (the Trainer's layout)."""
    return (checkpoint / LATEST).is_file()


def make_universal(checkpoint: Path, console: Console) -> None:
    """Convert ``checkpoint``'s ZeRO states for another number of processes (once)."""
    if has_universal(checkpoint):
        return
    if not is_deepspeed_checkpoint(checkpoint):
        raise ConfigError(
            f"{checkpoint.name} holds no DeepSpeed states in the layout lmctl converts ('latest' "
            "and a global_step folder)",
            "resume it on the number of processes it was saved by",
        )
    tag = (checkpoint / LATEST).read_text(encoding="utf-8").strip()
    output = checkpoint / f"{tag}_universal"
    shutil.rmtree(output, ignore_errors=True)  # an earlier, interrupted conversion
    console.info(
        f"{checkpoint.name}: converting its DeepSpeed ZeRO states into a universal checkpoint "
        f"({output.name}) to continue on another number of processes"
    )
    from deepspeed.checkpoint.ds_to_universal import main

    options = argparse.Namespace(
        input_folder=str(checkpoint / tag),
        output_folder=str(output),
        num_extract_workers=1,
        num_merge_workers=1,
        keep_temp_folder=False,
        strict=True,
        inject_missing_state=True,
    )
    # The converter prints its progress (on stdout, which holds lmctl's result alone) and
    # progress bars: the line above says what happens.
    quiet = {"TQDM_DISABLE": "1"}
    saved = {name: os.environ.get(name) for name in quiet}
    os.environ.update(quiet)
    try:
        with contextlib.redirect_stdout(io.StringIO()):
            main(options)
    finally:
        for name, value in saved.items():
            if value is None:
                os.environ.pop(name, None)
            else:
                os.environ[name] = value
    if not has_universal(checkpoint):
        raise ConfigError(
            f"{checkpoint.name}: the conversion of its DeepSpeed states did not complete",
            "resume it on the number of processes it was saved by",
        )
