"""The final model is saved atomically on both engines, and eval and push refuse one whose
files do not match the manifest of its save."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmctl.run import checkpoints
from lmctl.storage import atomic
from tests.conftest import TINY_GPT2, assert_clean_failure, lmctl

pytestmark = pytest.mark.e2e

MODEL_MANIFEST = "lmctl_model.json"


def train_args(out: Path, text_files: tuple[Path, Path], tokenizer: Path, *extra: str) -> list[str]:
    train, valid = text_files
    return [
        "train",
        "clm",
        *TINY_GPT2,
        "--tokenizer-name",
        str(tokenizer),
        "--train-file",
        str(train),
        "--validation-file",
        str(valid),
        "--block-size",
        "32",
        "--max-steps",
        "2",
        "--output-dir",
        str(out),
        *extra,
    ]


@pytest.mark.slow
def test_kill_during_the_final_save_leaves_no_model_that_looks_complete(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    out = tmp_path / "run"
    env = {**os.environ, "CI": "1", atomic.TEST_PAUSE_ENV: "model:120"}
    proc = subprocess.Popen(
        [
            sys.executable,
            "-m",
            "lmctl",
            *train_args(out, text_files, bpe_tokenizer, "--save-steps", "2"),
        ],
        env=env,
        stderr=subprocess.PIPE,
        stdout=subprocess.DEVNULL,
        text=True,
    )
    assert proc.stderr is not None
    deadline = time.monotonic() + 600
    seen = []
    for line in proc.stderr:
        seen.append(line)
        if "pausing 120s before committing model" in line:
            break
        assert time.monotonic() < deadline, "".join(seen)
    else:
        pytest.fail("the final save never paused:\n" + "".join(seen))
    proc.kill()
    proc.wait(timeout=60)
    assert not (out / "model.safetensors").exists() and not (out / MODEL_MANIFEST).exists()
    assert any(p.name.startswith(".tmp-model-") for p in out.iterdir())

    pushed = lmctl("push", out, "--to", (tmp_path / "dest").as_uri())
    assert_clean_failure(pushed, 2, "no final model")
    assert not (tmp_path / "dest").exists()
    evaluated = lmctl("eval", out, "--json", "--output", tmp_path / "eval.json")
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["model"].endswith("checkpoint-2")

    resumed = lmctl("resume", out)
    assert resumed.returncode == 0, resumed.stderr
    assert not any(p.name.startswith(".tmp-") for p in out.iterdir())
    assert checkpoints.model_problem(out) is None and (out / MODEL_MANIFEST).is_file()


def test_a_truncated_or_unlisted_final_model_is_refused(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    out = tmp_path / "run"
    proc = lmctl(
        *train_args(
            out, text_files, bpe_tokenizer, "--engine", "accelerate", "--save-strategy", "no"
        )
    )
    assert proc.returncode == 0, proc.stderr
    weights = out / "model.safetensors"
    size = weights.stat().st_size
    with open(weights, "r+b") as handle:
        handle.truncate(size // 2)

    evaluated = lmctl("eval", out, "--json")
    assert_clean_failure(evaluated, 5, "model.safetensors", f"instead of {size}")
    assert json.loads(evaluated.stdout)["exit_code"] == 5
    pushed = lmctl("push", out, "--to", (tmp_path / "dest").as_uri())
    assert_clean_failure(pushed, 5, "model.safetensors")
    assert not (tmp_path / "dest").exists()
    listed = json.loads((out / MODEL_MANIFEST).read_text())["files"]
    assert {"config.json", "model.safetensors", "tokenizer.json"} <= set(listed)

    weights.write_bytes(b"")
    (out / MODEL_MANIFEST).unlink()
    evaluated = lmctl("eval", out)
    assert_clean_failure(evaluated, 5, MODEL_MANIFEST)
