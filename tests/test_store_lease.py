"""A run directory in a bucket has one writer across machines: a lease object in the store.

A second writer from another local copy (as another machine would be: another
``--staging-dir``) is refused with exit code 2 naming the holder while the first run lives;
the first run finishes with only its own checkpoints in the store and deletes its lease. A
lease whose holder is gone is taken over with a line that says so."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import threading
import time
from pathlib import Path

import pytest

from lmctl.run.lease import LEASE_FILE
from lmctl.storage import atomic
from tests.conftest import S3Store, assert_clean_failure, lmctl, tiny_clm_args

pytestmark = [pytest.mark.e2e, pytest.mark.faults]


def _lease(host: str, pid: int, expires_in: float) -> bytes:
    now = time.time()
    record = {
        "token": "elsewhere",
        "pid": pid,
        "host": host,
        "started": now - 60,
        "command": "lmctl train clm",
        "expires": now + expires_in,
    }
    return json.dumps(record).encode()


def test_a_second_machine_is_refused_while_the_lease_lives(
    s3_store: S3Store, tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    prefix = f"{tmp_path.name}/run"
    url = f"s3://{s3_store.bucket}/{prefix}"
    env = {**s3_store.env(), "LMCTL_CACHE": str(tmp_path / "cache")}
    args = tiny_clm_args(bpe_tokenizer, text_files, "--save-steps", "2", block_size=32, steps=6)
    first = subprocess.Popen(
        [sys.executable, "-m", "lmctl", *map(str, args), "-o", url],
        cwd=tmp_path,
        env={**os.environ, **env, "CI": "1", atomic.TEST_PAUSE_ENV: "checkpoint-4:3"},
        stdout=subprocess.DEVNULL,
        stderr=subprocess.PIPE,
        text=True,
    )
    lines: list[str] = []
    paused = threading.Event()

    def read() -> None:
        assert first.stderr is not None
        for line in first.stderr:
            lines.append(line)
            if "pausing 3s before committing checkpoint-4" in line:
                first.send_signal(signal.SIGSTOP)
                paused.set()
        paused.set()

    reader = threading.Thread(target=read, daemon=True)
    reader.start()
    try:
        assert paused.wait(timeout=300) and first.poll() is None, "".join(lines)
        lease = json.loads(s3_store.read(f"{prefix}/{LEASE_FILE}"))
        assert lease["pid"] == first.pid and lease["expires"] > time.time()

        # Another machine: its own local copy of the run, so only the lease can refuse it.
        other = ("--staging-dir", tmp_path / "other-machine")
        second = lmctl(*args, "-o", url, *other, cwd=tmp_path, env=env)
        assert_clean_failure(second, 2, "in use by another run", f"pid {first.pid} on ")
        resumed = lmctl("resume", url, *other, cwd=tmp_path, env=env)
        assert resumed.returncode == 2, resumed.stderr
        assert "in use by another run" in resumed.stderr
        assert not (tmp_path / "other-machine" / "checkpoint-2").exists()
    finally:
        first.send_signal(signal.SIGCONT)
    first.wait(timeout=300)
    reader.join(timeout=30)
    assert first.returncode == 0, "".join(lines)
    keys = s3_store.keys(prefix + "/")
    checkpoints = sorted({key.split("/")[2] for key in keys if "/checkpoint-" in key})
    assert checkpoints == ["checkpoint-2", "checkpoint-4", "checkpoint-6"]
    assert f"{prefix}/{LEASE_FILE}" not in keys  # let go when the run ended


def test_a_lease_of_a_gone_holder_is_taken_over_and_a_live_one_refuses(
    s3_store: S3Store, tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    client = s3_store.client()
    env = {**s3_store.env(), "LMCTL_CACHE": str(tmp_path / "cache")}
    args = tiny_clm_args(bpe_tokenizer, text_files, "--no-eval", block_size=32, steps=2)

    live = f"{tmp_path.name}/live"
    client.put_object(
        Bucket=s3_store.bucket, Key=f"{live}/{LEASE_FILE}", Body=_lease("gpu-7", 4242, 90)
    )
    started = time.monotonic()
    refused = lmctl(*args, "-o", f"s3://{s3_store.bucket}/{live}", cwd=tmp_path, env=env)
    assert_clean_failure(refused, 2, "pid 4242 on gpu-7", "lmctl train clm", "LMCTL_LEASE_SECONDS")
    assert time.monotonic() - started < 60
    assert s3_store.keys(f"{live}/") == [f"{live}/{LEASE_FILE}"]  # nothing of it was touched

    expired = f"{tmp_path.name}/expired"
    client.put_object(
        Bucket=s3_store.bucket, Key=f"{expired}/{LEASE_FILE}", Body=_lease("gpu-7", 4242, -5)
    )
    taken = lmctl(*args, "-o", f"s3://{s3_store.bucket}/{expired}", cwd=tmp_path, env=env)
    assert taken.returncode == 0, taken.stderr
    assert "taking over the run directory from pid 4242 on gpu-7" in taken.stderr
    keys = s3_store.keys(f"{expired}/")
    assert f"{expired}/model.safetensors" in keys and f"{expired}/{LEASE_FILE}" not in keys
