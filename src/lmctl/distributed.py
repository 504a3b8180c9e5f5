"""Where this process stands in a multi-process launch (torchrun, accelerate launch).

Read from the launcher's environment so that it is known before torch is imported: only the
main process checks and writes the run directory and prints progress.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Iterator
from itertools import islice
from typing import Any

#: How long the other processes wait for a value the main process computes (torch's own
#: default timeout for a collective).
SHARED_TIMEOUT_S = 1800


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


def local_rank() -> int:
    return int(os.environ.get("LOCAL_RANK", "0"))


def node_rank() -> int:
    """This machine's rank among the machines of the run (torchrun's ``GROUP_RANK``)."""
    return int(os.environ.get("GROUP_RANK", "0"))


def nodes() -> int:
    """How many machines the run spans (torchrun's ``GROUP_WORLD_SIZE``)."""
    return int(os.environ.get("GROUP_WORLD_SIZE", "1"))


def machine(node_rank_given: int = 0, nodes_given: int = 1) -> tuple[int, int]:
    """This machine's rank and the number of machines: the launcher's in a launched process,
    else those given (``--node-rank``, ``--nnodes``) to the command that will launch it."""
    if launched():
        return node_rank(), nodes()
    return node_rank_given, nodes_given


def restart_count() -> int:
    """How many times torchrun's elastic agent restarted this run's processes (0 at first)."""
    return int(os.environ.get("TORCHELASTIC_RESTART_COUNT", "0"))


def max_restarts() -> int:
    """How many restarts the elastic agent allows this run (``--max-restarts``)."""
    return int(os.environ.get("TORCHELASTIC_MAX_RESTARTS", "0"))


def restartable() -> bool:
    """Whether this process runs under an elastic agent that may restart it."""
    return launched() and max_restarts() > 0


def launched() -> bool:
    """Whether a launcher (torchrun, accelerate launch, a cluster's own) started this process."""
    return "RANK" in os.environ and "WORLD_SIZE" in os.environ


def one_process_group() -> None:
    """The environment a launcher gives, for a process that runs alone (no launcher) with a
    library that needs a process group even then (DeepSpeed): rank 0 of 1, on a free port of
    this machine. Nothing changes under a launcher."""
    if launched():
        return
    import socket

    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    alone = {"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "1", "LOCAL_WORLD_SIZE": "1"}
    os.environ.update({**alone, "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)})


def launcher_store() -> bool:
    """Whether the launcher keeps a key-value store every process can reach before the process
    group exists: torchrun's elastic agent (and accelerate launch, which runs it) does, at
    ``MASTER_ADDR:MASTER_PORT``."""
    return os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True" and all(
        name in os.environ for name in ("MASTER_ADDR", "MASTER_PORT")
    )


def from_main_process(key: str, compute: Callable[[], str]) -> str:
    """``compute()`` on the main process; every other process of the launch receives that
    result through the launcher's store instead of computing its own, for a result that may
    differ from one computation to the next. ``key`` names the value within the run; one
    process alone just computes. The caller checks :func:`launcher_store` first where several
    processes run (without it, each would compute its own)."""
    if world_size() == 1 or not launcher_store():
        return compute()
    from datetime import timedelta

    from torch.distributed import TCPStore

    store = TCPStore(
        host_name=os.environ["MASTER_ADDR"],
        port=int(os.environ["MASTER_PORT"]),
        is_master=False,
        timeout=timedelta(seconds=SHARED_TIMEOUT_S),
    )
    # A restarted launch computes again, under a key of its own.
    name = f"lmctl/{os.environ.get('TORCHELASTIC_RUN_ID', 'run')}/{restart_count()}/{key}"
    if is_main_process():
        value = compute()
        store.set(name, value)
        return value
    return store.get(name).decode()


class EvenBatches:
    """An iterable of batches that ends on every process together: one small all-reduce per
    batch, so that no process runs out of data and leaves the others blocked in a collective.

    Streams split by shards give each process a different number of examples; iteration
    stops as soon as any process has no batch left, and the last batch is cut to the
    smallest size on any process (gathered results must have the same shape everywhere).
    Attributes of the wrapped loader (``dataset``, ``batch_size``, ...) stay reachable.
    """

    def __init__(self, batches: Any, device: Any) -> None:
        self.batches = batches
        self.device = device

    def __getattr__(self, name: str) -> Any:
        return getattr(self.__dict__["batches"], name)

    def __iter__(self) -> Iterator[Any]:
        iterator = iter(self.batches)
        try:
            while True:
                batch = next(iterator, None)
                size = 0 if batch is None else batch_rows(batch)
                common = agreed_minimum(size, self.device)
                if common == 0:
                    return
                yield batch if common == size else cut_rows(batch, size, common)
        finally:
            close = getattr(iterator, "close", None)
            if close is not None:
                close()


def evened(loader: Any, accelerator: Any) -> Any:
    """``loader`` itself, or where it has no length (a stream's) on several processes of
    ``accelerator``, its batches ending on every process together (:class:`EvenBatches`)."""
    try:
        len(loader)
    except TypeError:
        if accelerator.num_processes > 1:
            return EvenBatches(loader, accelerator.device)
    return loader


def summed(values: dict[str, float], accelerator: Any) -> dict[str, float]:
    """``values`` summed over the processes of ``accelerator`` (every process must call
    this), in float64: counts stay exact."""
    import torch

    local = torch.tensor(list(values.values()), dtype=torch.float64, device=accelerator.device)
    return dict(zip(values, accelerator.reduce(local, "sum").tolist(), strict=True))


def take_evenly(batches: Iterator[Any], count: int, device: Any) -> list[Any]:
    """Up to ``count`` batches of ``batches``, as many on every process as the process with
    the fewest has (every process must call this)."""
    taken = list(islice(batches, count))
    return taken[: agreed_minimum(len(taken), device)]


def agreed_minimum(value: int, device: Any) -> int:
    """The smallest ``value`` over every process (every process must call this)."""
    import torch
    import torch.distributed as dist

    tensor = torch.tensor([value], dtype=torch.int64, device=device)
    dist.all_reduce(tensor, op=dist.ReduceOp.MIN)
    return int(tensor.item())


def batch_rows(batch: Any) -> int:
    first = next(iter(batch.values())) if isinstance(batch, dict) else batch
    return int(first.shape[0])


def cut_rows(batch: Any, size: int, keep: int) -> Any:
    """The first ``keep`` rows of every per-example tensor of ``batch``."""
    return {
        key: value[:keep] if getattr(value, "shape", None) and value.shape[0] == size else value
        for key, value in batch.items()
    }


def import_deepspeed_when_used() -> None:
    """Keep deepspeed out of runs that do not use it.

    accelerate's ``unwrap_model`` (called by the Trainer when it is built, and by every
    evaluation) imports deepspeed whenever the package is installed, to tell a
    ``DeepSpeedEngine`` from the other wrappers: about 3.6 s of every run's start-up on a
    CPU, DeepSpeed or not. A model can only be wrapped in one once deepspeed was imported,
    so accelerate asks exactly that."""
    import sys

    from accelerate.utils import other

    other.is_deepspeed_available = lambda: "deepspeed" in sys.modules
