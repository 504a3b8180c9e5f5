"""Freed large blocks stay in the process for the next training step (glibc)."""

from __future__ import annotations

import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from lmctl.fastpaths.allocator import is_glibc
from tests.conftest import tiny_clm_args

pytestmark = pytest.mark.skipif(not is_glibc(), reason="the allocator settings are glibc's")

#: Runs the lmctl command in its arguments (or none), then allocates and frees a 40 MB block
#: twice, printing the bytes glibc held in mappings of their own while the block was live
#: (mallinfo2's hblkhd): a mapped block counts there, one from the heap does not.
PROBE = textwrap.dedent(
    """
    import ctypes, sys

    class MallInfo2(ctypes.Structure):
        _fields_ = [(name, ctypes.c_size_t) for name in (
            "arena", "ordblks", "smblks", "hblks", "hblkhd", "usmblks", "fsmblks",
            "uordblks", "fordblks", "keepcost")]

    libc = ctypes.CDLL(None)
    libc.malloc.restype = ctypes.c_void_p
    libc.free.argtypes = [ctypes.c_void_p]
    libc.mallinfo2.restype = MallInfo2
    if len(sys.argv) > 1:
        from lmctl.cli.app import main
        sys.argv[0] = "lmctl"
        try:
            main()
        except SystemExit as exit:
            assert not exit.code, exit.code
    before = libc.mallinfo2().hblkhd
    for _ in range(2):
        block = libc.malloc(40 * 2**20)
        ctypes.memset(block, 1, 40 * 2**20)
        print(libc.mallinfo2().hblkhd - before)
        libc.free(block)
    """
)


def mapped_while_live(*args: str | Path) -> list[int]:
    env = {**os.environ, "CI": "1"}
    out = subprocess.run(
        [sys.executable, "-c", PROBE, *map(str, args)],
        capture_output=True,
        text=True,
        check=True,
        env=env,
    ).stdout
    return [int(line) for line in out.split()[-2:]]


def test_a_process_that_has_not_trained_maps_large_blocks_afresh() -> None:
    # glibc's own threshold stops rising at 32 MB: a 40 MB block is mapped every time.
    assert mapped_while_live() == [40 * 2**20 + 4096] * 2


@pytest.mark.slow
@pytest.mark.e2e
def test_after_train_clm_large_blocks_come_from_the_heap(
    bpe_tokenizer: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    args = tiny_clm_args(bpe_tokenizer, text_files, "-o", tmp_path / "run", "--quiet")
    assert mapped_while_live(*args) == [0, 0]
