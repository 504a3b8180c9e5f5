"""lmctl owns stdout: a library that prints (from Python or straight to file descriptor 1)
never lands there, so ``--json`` output always parses.

The library here is a module imported with ``--import`` that prints at import time, as
DeepSpeed does when it picks an accelerator.
"""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest

from tests.conftest import TINY_GPT2, lmctl

pytestmark = pytest.mark.e2e

NOISY = """
import logging, os, sys
print("[WARNING] noisy: print() to stdout at import")
os.write(1, b"[WARNING] noisy: os.write to fd 1 at import\\n")
_log = logging.getLogger("noisy")
_log.addHandler(logging.StreamHandler(sys.stdout))
_log.warning("[WARNING] noisy: a logger bound to stdout")
"""


@pytest.fixture(scope="module")
def noisy(tmp_path_factory: pytest.TempPathFactory) -> tuple[Path, dict[str, str]]:
    folder = tmp_path_factory.mktemp("noisy")
    (folder / "noisy_library.py").write_text(NOISY, encoding="utf-8")
    return folder, {"PYTHONPATH": str(folder)}


def only_json(proc: subprocess.CompletedProcess[str]) -> dict[str, object]:
    assert "noisy" not in proc.stdout, proc.stdout
    lines = proc.stdout.splitlines()
    assert len(lines) == 1, proc.stdout
    payload = json.loads(lines[0])
    assert isinstance(payload, dict)
    return payload


def train_args(
    out: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path, *extra: str | Path
) -> list[str | Path]:
    train, valid = text_files
    return [
        "train", "clm", *TINY_GPT2, "--tokenizer-name", bpe_tokenizer,
        "--train-file", train, "--validation-file", valid, "--max-train-samples", "200",
        "--max-eval-samples", "20", "--block-size", "32", "--import", "noisy_library",
        "--output-dir", out, *extra,
    ]  # fmt: skip


@pytest.mark.slow
def test_library_output_goes_to_stderr_for_train_resume_and_eval(
    tmp_path: Path,
    text_files: tuple[Path, Path],
    bpe_tokenizer: Path,
    noisy: tuple[Path, dict[str, str]],
) -> None:
    _, env = noisy
    out = tmp_path / "run"
    args = train_args(out, text_files, bpe_tokenizer, "--max-steps", "2", "--save-steps", "2")
    proc = lmctl(*args, "--json", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert only_json(proc)["status"] == "ok"
    # The library's output is not lost: it is in the log.
    assert "noisy: print() to stdout" in proc.stderr
    assert "noisy: os.write to fd 1" in proc.stderr
    assert "noisy: a logger bound to stdout" in proc.stderr

    proc = lmctl("resume", out, "--max-steps", "3", "--json", "--quiet", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert only_json(proc)["status"] == "ok"

    proc = lmctl("eval", out, "--json", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "eval_loss" in only_json(proc)["metrics"]  # type: ignore[operator]

    # Without --json, stdout carries the summary table only.
    proc = lmctl("eval", out, "--quiet", cwd=tmp_path, env=env)
    assert proc.returncode == 0, proc.stderr
    assert "noisy" not in proc.stdout
    assert proc.stdout.startswith("lmctl eval:"), proc.stdout


def test_library_output_goes_to_stderr_on_failure_and_for_prepare(
    tmp_path: Path,
    text_files: tuple[Path, Path],
    bpe_tokenizer: Path,
    noisy: tuple[Path, dict[str, str]],
) -> None:
    _, env = noisy
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"text": "fine"}\n{"text": \n', encoding="utf-8")
    train, _ = text_files
    args = [
        "train", "clm", *TINY_GPT2, "--tokenizer-name", bpe_tokenizer, "--train-file", bad,
        "--no-eval", "--import", "noisy_library", "--output-dir", tmp_path / "run",
    ]  # fmt: skip
    proc = lmctl(*args, "--json", cwd=tmp_path, env=env)
    assert proc.returncode == 3, proc.stderr
    payload = only_json(proc)
    assert payload["status"] == "error"
    assert "bad.jsonl" in str(payload["error"])

    proc = lmctl(
        "prepare", "clm", "--tokenizer-name", bpe_tokenizer, "--train-file", train,
        "--max-train-samples", "50", "--block-size", "32", "--no-eval",
        "--import", "noisy_library", "--json", "--quiet", cwd=tmp_path, env=env,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert only_json(proc)["status"] == "ok"
