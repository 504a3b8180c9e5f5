"""How the C allocator treats large blocks in a process that trains or evaluates a model.

glibc serves a block above its mmap threshold (128 KB, raised on its own up to 32 MB) with a
fresh mapping that goes back to the system on free, and hands the top of its heap back past
a trim threshold. A training step frees and allocates the same large tensors every step
(activations, the gradient of a tied embedding: 47 MB for a 30,522 x 384 fp32 table), so the
step maps them and faults their pages in again each time. Raising both thresholds keeps the
freed blocks for the next step: ``lmctl train clm`` on a 20.6M-parameter GPT-2 (5 x 384, batch
8 x 128, 40 steps) ran 8% faster (train_runtime medians 21.4 against 23.3 s) with a peak RSS
2% higher. Freed blocks under those sizes are reused within the process and go back to the
system when it exits.

Process-wide: the thresholds hold for the rest of the process, past the end of the run (glibc
has no way back to its self-adjusting default once they are set).
"""

from __future__ import annotations

import ctypes
import os

#: mallopt parameters (glibc's malloc.h).
M_TRIM_THRESHOLD = -1
M_MMAP_THRESHOLD = -3

#: Blocks up to this size come from the heap and are reused after they are freed.
MMAP_THRESHOLD = 256 * 2**20
#: Free memory at the top of the heap kept for reuse instead of handed back.
TRIM_THRESHOLD = 2**30


def is_glibc() -> bool:
    """Whether this process's C library is glibc (the settings below are its own)."""
    try:
        return (os.confstr("CS_GNU_LIBC_VERSION") or "").startswith("glibc")
    except (AttributeError, ValueError, OSError):  # pragma: no cover - not a GNU system
        return False


def keep_freed_blocks() -> bool:
    """Keep freed large blocks in the process for reuse; True where the C library is glibc
    and took both settings (elsewhere nothing changes)."""
    if not is_glibc():
        return False
    try:
        libc = ctypes.CDLL(None)
        mallopt = libc.mallopt
    except (OSError, AttributeError):  # pragma: no cover - a glibc without mallopt
        return False
    mallopt.argtypes = [ctypes.c_int, ctypes.c_int]
    mallopt.restype = ctypes.c_int
    return bool(mallopt(M_MMAP_THRESHOLD, MMAP_THRESHOLD)) and bool(
        mallopt(M_TRIM_THRESHOLD, TRIM_THRESHOLD)
    )
