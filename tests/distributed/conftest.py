"""Several processes on the CPU (gloo): launching lmctl and reading what the ranks did.

Every launch runs in its own process group with a timeout that kills the whole group, so a
hang fails the test instead of the test run.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable
from contextlib import suppress
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import corpus_lines

RECORDER = Path(__file__).with_name("record_batches.py")
TINY_GPT2 = ("--model-type", "gpt2", "--config-overrides", "n_layer=2,n_embd=32,n_head=2")
TINY_BERT = (
    "--model-type", "bert", "--config-overrides",
    "num_hidden_layers=2,hidden_size=32,num_attention_heads=2,intermediate_size=64",
)  # fmt: skip
LAUNCH_TIMEOUT = 300


def descendants(pid: int) -> list[int]:
    """Every process below ``pid``."""
    found = []
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            stat = (entry / "stat").read_text().rsplit(")", 1)[1].split()
        except OSError:
            continue
        if int(stat[1]) == pid:
            found.append(int(entry.name))
            found.extend(descendants(int(entry.name)))
    return found


def kill_tree(proc: subprocess.Popen[str]) -> None:
    """SIGKILL the launch and everything it started (a launcher may start its workers in
    sessions of their own, out of reach of the process group)."""
    for pid in [*descendants(proc.pid), proc.pid]:
        with suppress(ProcessLookupError):
            os.kill(pid, signal.SIGKILL)


def environment(extra: dict[str, str] | None = None) -> dict[str, str]:
    """This process's environment without a launcher's variables (those in ``extra`` stay)."""
    env = {**os.environ, "CI": "1", "OMP_NUM_THREADS": "1"}
    env.pop("LMCTL_DEBUG", None)
    for name in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return {**env, **(extra or {})}


def start(
    command: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.Popen[str]:
    return subprocess.Popen(
        command,
        cwd=cwd,
        env=environment(env),
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
        start_new_session=True,
    )


def finish(
    proc: subprocess.Popen[str], timeout: float = LAUNCH_TIMEOUT
) -> subprocess.CompletedProcess[str]:
    try:
        stdout, stderr = proc.communicate(timeout=timeout)
    except subprocess.TimeoutExpired:
        kill_tree(proc)
        stdout, stderr = proc.communicate()
        pytest.fail(f"the processes did not finish in {timeout} s:\n{stderr[-4000:]}")
    return subprocess.CompletedProcess(proc.args, proc.returncode, stdout, stderr)


def run(
    command: list[str], cwd: Path, env: dict[str, str] | None = None
) -> subprocess.CompletedProcess[str]:
    return finish(start(command, cwd, env))


def lmctl_command(*args: str | Path) -> list[str]:
    return [sys.executable, "-m", "lmctl", *map(str, args)]


def kill_when(
    proc: subprocess.Popen[str], ready: Callable[[], bool], timeout: float = LAUNCH_TIMEOUT
) -> None:
    """SIGKILL the whole process group as soon as ``ready()`` holds."""
    deadline = time.monotonic() + timeout
    while not ready():
        if proc.poll() is not None:
            _, stderr = proc.communicate()
            pytest.fail(f"the run ended before it could be killed:\n{stderr[-4000:]}")
        if time.monotonic() > deadline:
            kill_tree(proc)
            pytest.fail("the run never reached the point to kill it at")
        time.sleep(0.05)
    kill_tree(proc)
    proc.communicate()


def rank_of(pid: int) -> str | None:
    """The ``RANK`` a launcher gave process ``pid`` (None for a process it did not start)."""
    try:
        environ = Path(f"/proc/{pid}/environ").read_bytes().split(b"\0")
    except OSError:
        return None
    for item in environ:
        if item.startswith(b"RANK="):
            return item[5:].decode()
    return None


def kill_rank_when(
    procs: list[subprocess.Popen[str]],
    rank: int,
    ready: Callable[[], bool],
    timeout: float = LAUNCH_TIMEOUT,
) -> int:
    """SIGKILL the process of ``rank`` (one of those the launches ``procs`` started) as soon
    as ``ready()`` holds; the others run on. Returns its process id."""
    deadline = time.monotonic() + timeout
    while not ready():
        if any(proc.poll() is not None for proc in procs):
            pytest.fail("a launch ended before the rank could be killed")
        if time.monotonic() > deadline:
            for proc in procs:
                kill_tree(proc)
            pytest.fail("the run never reached the point to kill a rank at")
        time.sleep(0.05)
    pids = [pid for proc in procs for pid in descendants(proc.pid) if rank_of(pid) == str(rank)]
    assert pids, f"no process of rank {rank} found"
    os.kill(pids[0], signal.SIGKILL)
    return pids[0]


def records(folder: Path, rank: int, restart: int = 0) -> list[tuple[int, ...]]:
    """The examples the process of ``rank`` trained on (in its ``restart``-th restart by the
    agent), as ``record_batches.py`` wrote them."""
    file = folder / (f"rank-{rank}.restart-{restart}.jsonl" if restart else f"rank-{rank}.jsonl")
    return (
        [tuple(json.loads(line)) for line in file.read_text().splitlines()] if file.exists() else []
    )


def results(run_dir: Path) -> dict[str, Any]:
    return json.loads((run_dir / "all_results.json").read_text())


def weights(run_dir: Path) -> dict[str, Any]:
    from safetensors.torch import load_file

    return load_file(run_dir / "model.safetensors")


def max_difference(a: dict[str, Any], b: dict[str, Any]) -> float:
    assert a.keys() == b.keys()
    return max(float((a[key].float() - b[key].float()).abs().max()) for key in a)


@pytest.fixture(scope="session")
def unique_lines(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, Path]:
    """Train/validation text whose lines are all different, so that two ranks reading the
    same example shows."""
    return unique_text(tmp_path_factory.mktemp("unique"), 600, 64)


def unique_text(folder: Path, train_lines: int, valid_lines: int) -> tuple[Path, Path]:
    """``train.txt`` of ``train_lines`` numbered (so all different) lines of the corpus, and
    ``valid.txt`` of ``valid_lines`` others, in ``folder``."""
    lines = corpus_lines()
    train, valid = folder / "train.txt", folder / "valid.txt"
    train.write_text("".join(f"{n} {line}\n" for n, line in enumerate(lines[:train_lines])))
    valid.write_text("".join(f"{line}\n" for line in lines[1500 : 1500 + valid_lines]))
    return train, valid


@pytest.fixture(scope="session")
def deepspeed_ops() -> None:
    """DeepSpeed's CPU communication kernel is compiled on first use (minutes on a small
    machine); build it once here so that the runs' own timeouts measure the runs."""
    pytest.importorskip("deepspeed")
    env = environment({"DS_ACCELERATOR": "cpu"})
    code = (
        "from deepspeed.accelerator import get_accelerator\n"
        "get_accelerator().create_op_builder('ShareMemCommBuilder').load()\n"
    )
    subprocess.run([sys.executable, "-c", code], env=env, check=True, timeout=1800,
                   capture_output=True)  # fmt: skip
