"""What ``lmctl env`` reports for a bug report: versions, devices, precision, threads.

Package versions come from the installed metadata (no import); torch is imported to ask
about devices, so nothing on the ``--help`` path imports this module's callers' heavy parts.
"""

from __future__ import annotations

import os
import platform
import sys
from importlib.metadata import PackageNotFoundError, version
from pathlib import Path
from typing import Any

from lmctl import __version__

#: Always listed (``not installed`` when missing).
PACKAGES = ("torch", "transformers", "datasets", "accelerate", "evaluate", "tokenizers")
#: Listed when installed.
OPTIONAL_PACKAGES = (
    "deepspeed",
    "peft",
    "matplotlib",
    "tensorboard",
    "mlflow",
    "mlflow-skinny",
    "trackio",
)


def _version(name: str) -> str | None:
    try:
        return version(name)
    except PackageNotFoundError:
        return None


def _cpu_flags() -> set[str]:
    try:
        text = Path("/proc/cpuinfo").read_text(encoding="utf-8", errors="replace")
    except OSError:
        return set()
    for line in text.splitlines():
        if line.startswith("flags"):
            return set(line.partition(":")[2].split())
    return set()


def _devices() -> dict[str, Any]:
    import torch

    info: dict[str, Any] = {"cuda_available": torch.cuda.is_available()}
    if torch.cuda.is_available():
        info["cuda"] = torch.version.cuda
        info["devices"] = [torch.cuda.get_device_name(i) for i in range(torch.cuda.device_count())]
        info["bf16"] = "supported" if torch.cuda.is_bf16_supported() else "not supported"
        info["device"] = "cuda"
    elif getattr(torch.backends, "mps", None) is not None and torch.backends.mps.is_available():
        info["device"] = "mps"
        info["bf16"] = "supported"
    else:
        info["device"] = "cpu"
        native = {"avx512_bf16", "amx_bf16"} & _cpu_flags()
        info["bf16"] = "native (" + ", ".join(sorted(native)) + ")" if native else "emulated"
    info["torch_threads"] = torch.get_num_threads()
    return info


def report() -> dict[str, Any]:
    """The environment as plain data (``lmctl env --json`` prints it as is)."""
    packages = {name: _version(name) or "not installed" for name in PACKAGES}
    packages.update({name: v for name in OPTIONAL_PACKAGES if (v := _version(name))})
    try:
        usable = len(os.sched_getaffinity(0))
    except AttributeError:  # pragma: no cover - not Linux
        usable = os.cpu_count() or 1
    out: dict[str, Any] = {
        "lmctl": __version__,
        "python": sys.version.split()[0],
        "platform": platform.platform(),
        "packages": packages,
        "cpu_count": os.cpu_count(),
        "cpu_usable": usable,
    }
    if packages["torch"] != "not installed":
        out.update(_devices())
    return out
