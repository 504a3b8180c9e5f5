"""A store that stops answering while a run uploads to it (``--output-dir s3://...``).

The loopback S3 server runs in a process of its own here, so that it can be stopped with
SIGSTOP (a store that hangs: connections are accepted by the kernel, nothing answers) and
continued with SIGCONT. Each test asserts the exit code, the message and that the run's
local copy is complete.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from pathlib import Path

import pytest

from tests.conftest import S3Store, assert_clean_failure, free_port, lmctl, tiny_clm_args

pytestmark = pytest.mark.faults

MANIFEST = "lmctl-manifest.json"
#: A run of 6 steps with a checkpoint every 2: three checkpoints.
STEPS = ("--max-steps", "6", "--save-steps", "2", "--no-eval")


class StoppableStore(S3Store):
    """moto's S3 server in its own process (no authentication: any credentials do)."""

    process: subprocess.Popen[bytes]

    def stop(self) -> None:
        os.kill(self.process.pid, signal.SIGSTOP)

    def go_on(self) -> None:
        os.kill(self.process.pid, signal.SIGCONT)


@pytest.fixture
def store() -> Iterator[StoppableStore]:
    import boto3

    port = free_port()
    server = ["-c", "from moto.server import main; main()", "-H", "127.0.0.1", "-p", str(port)]
    process = subprocess.Popen(
        [sys.executable, *server],
        stdout=subprocess.DEVNULL,
        stderr=subprocess.DEVNULL,
    )
    store = StoppableStore(f"http://127.0.0.1:{port}", "models", ("w", "w"), ("r", "r"))
    store.process = process
    try:
        for _ in range(300):
            try:
                boto3.client(
                    "s3", endpoint_url=store.endpoint, region_name="us-east-1",
                    aws_access_key_id="w", aws_secret_access_key="w",
                ).create_bucket(Bucket=store.bucket)  # fmt: skip
                break
            except Exception:
                time.sleep(0.1)
        yield store
    finally:
        store.go_on()
        process.terminate()
        process.wait(timeout=30)


def _start(args: list[str | Path], env: dict[str, str], cwd: Path) -> subprocess.Popen[str]:
    full_env = {**os.environ, "CI": "1", **env}
    full_env.pop("LMCTL_DEBUG", None)
    return subprocess.Popen(
        [sys.executable, "-m", "lmctl", *map(str, args)],
        cwd=cwd,
        env=full_env,
        stdout=subprocess.PIPE,
        stderr=subprocess.PIPE,
        text=True,
    )


def _until(
    condition: Callable[[], bool], proc: subprocess.Popen[str], timeout: float = 300
) -> None:
    """Poll ``condition`` every 20 ms while ``proc`` runs."""
    deadline = time.monotonic() + timeout
    while not condition():
        if proc.poll() is not None:
            _, err = proc.communicate()
            pytest.fail(f"lmctl ended early ({proc.returncode}):\n{err}")
        assert time.monotonic() < deadline, "the run never got there"
        time.sleep(0.02)


def _finish(proc: subprocess.Popen[str], timeout: float) -> subprocess.CompletedProcess[str]:
    out, err = proc.communicate(timeout=timeout)
    return subprocess.CompletedProcess(proc.args, proc.returncode, out, err)


def _run(
    store: StoppableStore,
    tmp_path: Path,
    tokenizer: Path,
    texts: tuple[Path, Path],
    env: dict[str, str],
) -> tuple[subprocess.Popen[str], str, Path]:
    url = f"s3://{store.bucket}/{tmp_path.name}/run"
    staging = tmp_path / "staging"
    args = tiny_clm_args(
        tokenizer, (texts[0], None), "-o", url, "--staging-dir", staging, *STEPS, steps=None
    )
    return _start(args, {**store.env(), **env}, tmp_path), url, staging


def _complete_locally(staging: Path, *names: str) -> None:
    for name in names:
        assert (staging / name / "trainer_state.json").is_file(), name


def test_a_store_that_hangs_for_15_s(
    store: StoppableStore, tmp_path: Path, bpe_tokenizer: Path, text_files: tuple[Path, Path]
) -> None:
    """Stopped when the first checkpoint is committed, continued 15 s later: the run ends
    normally with every checkpoint and its final model in the store."""
    proc, _, staging = _run(store, tmp_path, bpe_tokenizer, text_files, {})
    _until((staging / "checkpoint-2").is_dir, proc)
    store.stop()
    time.sleep(15)
    store.go_on()
    done = _finish(proc, 300)
    assert done.returncode == 0, done.stderr
    prefix = f"{tmp_path.name}/run/"
    keys = {key[len(prefix) :] for key in store.keys(prefix)}
    for name in ("checkpoint-2/", "checkpoint-4/", "checkpoint-6/", ""):
        manifest = json.loads(store.read(f"{prefix}{name}{MANIFEST}"))
        for item in manifest["files"]:
            assert f"{name}{item['path']}" in keys
            assert (
                store.read(f"{prefix}{name}{item['path']}")
                == (staging / name / item["path"]).read_bytes()
            )
    assert "model.safetensors" in {item["path"] for item in manifest["files"]}


def test_a_store_that_hangs_for_good(
    store: StoppableStore, tmp_path: Path, bpe_tokenizer: Path, text_files: tuple[Path, Path]
) -> None:
    """Stopped for good at the first checkpoint: training goes on to its last step (three
    checkpoints may wait), then the run ends with exit code 6 once the store has been silent
    for the retry budget, with its local copy complete and the command that finishes the
    upload."""
    budget = 15
    proc, url, staging = _run(
        store, tmp_path, bpe_tokenizer, text_files, {"LMCTL_STORE_RETRY_BUDGET": str(budget)}
    )
    _until((staging / "checkpoint-2").is_dir, proc)
    store.stop()
    stopped = time.monotonic()
    done = _finish(proc, 120)
    took = time.monotonic() - stopped
    assert_clean_failure(
        done, 6, f"the store at {url} has not answered", "LMCTL_STORE_RETRY_BUDGET=15",
        f"lmctl push {staging} --to {url}",
    )  # fmt: skip
    # The budget and its few seconds of slack, and the run's end (CPU-bound machines: 60 s).
    assert took < budget + 60, took
    _complete_locally(staging, "checkpoint-2", "checkpoint-4", "checkpoint-6")
    assert (staging / "model.safetensors").is_file()
    assert json.loads((staging / "all_results.json").read_text())["train_loss"] > 0


def test_sigterm_during_a_stalled_upload(
    store: StoppableStore, tmp_path: Path, bpe_tokenizer: Path, text_files: tuple[Path, Path]
) -> None:
    """One checkpoint may wait: training waits at the second one while the store hangs.
    SIGTERM then ends the run within 30 s (exit 130), its checkpoints kept locally and the
    command that continues it printed."""
    proc, url, staging = _run(
        store, tmp_path, bpe_tokenizer, text_files, {"LMCTL_UPLOAD_QUEUE": "1"}
    )
    _until((staging / "checkpoint-2").is_dir, proc)
    store.stop()
    _until((staging / "checkpoint-4").is_dir, proc)
    time.sleep(2)  # waiting for checkpoint-2's upload now
    proc.send_signal(signal.SIGTERM)
    signalled = time.monotonic()
    done = _finish(proc, 60)
    assert time.monotonic() - signalled < 30
    assert_clean_failure(
        done, 130, "interrupted by SIGTERM while the upload of checkpoint-2",
        f"lmctl resume {url} --staging-dir {staging}",
    )  # fmt: skip
    assert "training waits: the upload of checkpoint-2 to" in done.stderr
    _complete_locally(staging, "checkpoint-2", "checkpoint-4")
    assert not (staging / "checkpoint-6").exists()


def test_a_bucket_run_that_lost_objects(
    s3_store: S3Store, tmp_path: Path, bpe_tokenizer: Path, text_files: tuple[Path, Path]
) -> None:
    """The final model and checkpoint-4's weights deleted from the bucket (a lifecycle rule):
    ``lmctl eval URL`` names the missing key; on a machine without the run, ``lmctl resume
    URL --max-steps 6`` names both, passes over checkpoint-4 and continues from checkpoint-2,
    the newest checkpoint complete in the store, and uploads a final model again."""
    prefix = f"{tmp_path.name}/run"
    url = f"s3://{s3_store.bucket}/{prefix}"
    env = {**s3_store.env(), "LMCTL_CACHE_DIR": str(tmp_path / "cache")}
    args = tiny_clm_args(
        bpe_tokenizer, (text_files[0], None), "-o", url, "--staging-dir", tmp_path / "first",
        "--max-steps", "4", "--save-steps", "2", "--no-eval", steps=None,
    )  # fmt: skip
    assert lmctl(*args, cwd=tmp_path, env=env).returncode == 0
    client = s3_store.client()
    for key in ("model.safetensors", "checkpoint-4/model.safetensors"):
        client.delete_object(Bucket=s3_store.bucket, Key=f"{prefix}/{key}")

    evaluated = lmctl("eval", url, "--validation-file", text_files[1], cwd=tmp_path, env=env)
    assert_clean_failure(
        evaluated, 2, f"{url}/model.safetensors: listed in {url}/{MANIFEST} but not in the store"
    )

    staging = tmp_path / "second"
    resumed = lmctl(
        "resume", url, "--max-steps", "6", "--staging-dir", staging, cwd=tmp_path, env=env
    )
    assert resumed.returncode == 0, resumed.stderr
    assert f"{url}/model.safetensors: listed in {url}/{MANIFEST}" in resumed.stderr
    assert f"{url}/checkpoint-4/model.safetensors: listed in" in resumed.stderr
    assert "checkpoint-4 is not complete, an older checkpoint is used" in resumed.stderr
    assert "fetched checkpoint-2" in resumed.stderr
    assert "from checkpoint-2 (step 2)" in resumed.stderr
    manifest = json.loads(s3_store.read(f"{prefix}/{MANIFEST}"))
    assert "model.safetensors" in {item["path"] for item in manifest["files"]}
    assert (
        s3_store.read(f"{prefix}/model.safetensors") == (staging / "model.safetensors").read_bytes()
    )
