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


def native_bf16() -> bool:
    """Whether this process's device computes bfloat16 natively: a CUDA GPU that supports
    it, or a CPU with AVX512-BF16 or AMX instructions (elsewhere bf16 is emulated, slower
    than fp32)."""
    import torch

    if torch.cuda.is_available():
        return bool(torch.cuda.is_bf16_supported())
    cpu = torch.cpu
    checks = ("_is_avx512_bf16_supported", "_is_amx_tile_supported")
    return any(bool(getattr(cpu, name, lambda: False)()) for name in checks)
