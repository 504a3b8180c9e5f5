"""The launch line of each template in examples/cluster/, run on this machine as two
machines (loopback, one process each, a file:// run directory, tiny model): the SLURM script
under stand-ins for srun and scontrol, the plain script once per machine. The templates pass
LAUNCHER on to lmctl as they are; to keep this tier short, each runs with one launcher, the
two with different ones."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import pytest

from tests.conftest import free_port
from tests.distributed.conftest import TINY_GPT2, finish, start

pytestmark = pytest.mark.distributed

CLUSTER = Path(__file__).resolve().parents[2] / "examples" / "cluster"
MANIFEST = "lmctl-manifest.json"

#: srun runs its command once per machine of the job, each with its SLURM_NODEID; here the
#: machines are processes side by side.
FAKE_SRUN = """#!/usr/bin/env bash
while [[ $# -gt 0 && $1 == --* ]]; do shift; done
pids=()
for ((node = 0; node < SLURM_NNODES; node++)); do
    SLURM_NODEID=$node SLURM_PROCID=$node "$@" &
    pids+=($!)
done
status=0
for pid in "${pids[@]}"; do wait "$pid" || status=$?; done
exit $status
"""
FAKE_SCONTROL = """#!/usr/bin/env bash
echo 127.0.0.1
"""


def _train_args(tokenizer: Path, data: tuple[Path, Path]) -> list[str]:
    train, valid = data
    return [
        *TINY_GPT2, "--tokenizer", str(tokenizer), "--train-file", str(train),
        "--validation-file", str(valid), "--block-size", "32", "--max-steps", "4",
        "--save-steps", "2", "--per-device-train-batch-size", "4", "--no-eval",
    ]  # fmt: skip


def _environment(tmp_path: Path, launcher: str) -> tuple[dict[str, str], Path]:
    root = tmp_path / "store" / "run"
    env = {
        "LMCTL": f"{sys.executable} -m lmctl",
        "LAUNCHER": launcher,
        "NPROC": "1",
        "MASTER_PORT": str(free_port()),
        "OUTPUT_DIR": f"file://{root}",
        "LMCTL_CACHE": str(tmp_path / "cache"),
    }
    return env, root


def _check_run(root: Path, logs: str, launcher: str) -> None:
    """One run of two machines: its checkpoints hold both processes' states, its model is
    published, and the launch line was the launcher's, for two machines."""
    shown = [line for line in logs.splitlines() if "running: " in line]
    assert len(shown) == 2, logs[-4000:]
    module = "torch.distributed.run" if launcher == "torchrun" else "accelerate.commands.launch"
    assert all(module in line and "--max_restarts 3" in line for line in shown), shown
    for step in (2, 4):
        manifest = json.loads((root / f"checkpoint-{step}" / MANIFEST).read_text())
        names = {item["path"] for item in manifest["files"]}
        assert {"rng_state_0.pth", "rng_state_1.pth"} <= names, names
    published = json.loads((root / MANIFEST).read_text())
    assert "model.safetensors" in {item["path"] for item in published["files"]}


@pytest.mark.parametrize("launcher", ["torchrun"])
def test_slurm_template(
    launcher: str, bpe_tokenizer: Path, unique_lines: tuple[Path, Path], tmp_path: Path
) -> None:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("srun", FAKE_SRUN), ("scontrol", FAKE_SCONTROL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    env, root = _environment(tmp_path, launcher)
    env.update(
        {
            "PATH": f"{bin_dir}:{Path(sys.executable).parent}:/usr/bin:/bin",
            "SLURM_JOB_NODELIST": "node[1-2]",
            "SLURM_NNODES": "2",
            "SLURM_JOB_ID": "7",
        }
    )
    command = ["bash", str(CLUSTER / "slurm.sbatch"), *_train_args(bpe_tokenizer, unique_lines)]
    done = finish(start(command, tmp_path, env))
    assert done.returncode == 0, done.stderr[-4000:]
    _check_run(root, done.stderr, launcher)


@pytest.mark.parametrize("launcher", ["accelerate"])
def test_two_machines_template(
    launcher: str, bpe_tokenizer: Path, unique_lines: tuple[Path, Path], tmp_path: Path
) -> None:
    env, root = _environment(tmp_path, launcher)
    env["MASTER_ADDR"] = "127.0.0.1"
    command = ["bash", str(CLUSTER / "two-machines.sh"), *_train_args(bpe_tokenizer, unique_lines)]
    procs = [start(command, tmp_path, {**env, "NODE_RANK": str(node)}) for node in (0, 1)]
    done = [finish(proc) for proc in procs]
    for proc in done:
        assert proc.returncode == 0, proc.stderr[-4000:]
    _check_run(root, "".join(proc.stderr for proc in done), launcher)
