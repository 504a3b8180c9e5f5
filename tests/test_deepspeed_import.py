"""deepspeed is imported by runs that use it, not by every run where it is installed."""

from __future__ import annotations

import subprocess
import sys

import pytest

# accelerate's unwrap_model imports deepspeed whenever accelerate finds it installed (the
# first line printed: the check has a cause to fail).
PROBE = """
import sys
import torch
from accelerate.utils import is_deepspeed_available
from accelerate.utils.other import extract_model_from_parallel
from lmctl.distributed import import_deepspeed_when_used
import_deepspeed_when_used()
model = torch.nn.Linear(2, 2)
assert extract_model_from_parallel(model) is model
print(is_deepspeed_available())
print("deepspeed" in sys.modules)
"""


def test_unwrapping_a_model_does_not_import_deepspeed() -> None:
    pytest.importorskip("deepspeed")
    proc = subprocess.run(
        [sys.executable, "-c", PROBE], check=False, capture_output=True, text=True
    )
    assert proc.returncode == 0, proc.stderr
    assert proc.stdout.splitlines() == ["True", "False"]
