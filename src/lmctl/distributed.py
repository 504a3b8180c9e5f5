"""Where this process stands in a multi-process launch (torchrun, accelerate launch).

Read from the launcher's environment so that it is known before torch is imported: only the
main process checks and writes the run directory and prints progress.
"""

from __future__ import annotations

import os


def rank() -> int:
    return int(os.environ.get("RANK", "0"))


def world_size() -> int:
    return int(os.environ.get("WORLD_SIZE", "1"))


def is_main_process() -> bool:
    return rank() == 0
