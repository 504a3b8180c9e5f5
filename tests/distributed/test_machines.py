"""Several machines played on this one: two launchers with --nnodes 2 and --node-rank 0|1,
one process each, gloo on 127.0.0.1, writing one remote run directory (both engines, and
DeepSpeed ZeRO-2). Every run's final weights are compared with one machine's uninterrupted
run of two processes."""

from __future__ import annotations

import json
import subprocess
from collections.abc import Callable
from pathlib import Path

import pytest

from lmctl.run import rundir
from tests.conftest import S3Store, free_port
from tests.distributed.conftest import (
    RECORDER,
    TINY_GPT2,
    finish,
    lmctl_command,
    max_difference,
    run,
    start,
    weights,
)

pytestmark = pytest.mark.distributed

MANIFEST = "lmctl-manifest.json"
#: How each run differs: the engine, and the launcher that --nproc runs.
OPTIONS = {
    "trainer": ("--engine", "trainer", "--launcher", "torchrun"),
    "accelerate": ("--engine", "accelerate", "--launcher", "accelerate"),
    "zero2": ("--deepspeed", "2"),
}


def _args(tokenizer: Path, data: tuple[Path, Path], out: str | Path, *extra: str) -> list[str]:
    train, valid = data
    return [
        "train", "clm", *TINY_GPT2, "--tokenizer", str(tokenizer), "--train-file", str(train),
        "--validation-file", str(valid), "--block-size", "32", "--max-steps", "10",
        "--per-device-train-batch-size", "4", "--learning-rate", "1e-3", "--save-steps", "5",
        "--import", str(RECORDER), "-o", str(out), *extra,
    ]  # fmt: skip


@pytest.fixture(scope="module")
def uninterrupted(
    tmp_path_factory: pytest.TempPathFactory,
    bpe_tokenizer: Path,
    unique_lines: tuple[Path, Path],
) -> Callable[[str], Path]:
    """One machine's uninterrupted run of two processes with the options of ``name``, the
    same for every test that compares with it (run once)."""
    done: dict[str, Path] = {}

    def get(name: str) -> Path:
        if name not in done:
            out = tmp_path_factory.mktemp("uninterrupted") / name
            args = _args(bpe_tokenizer, unique_lines, out, *OPTIONS[name], "--nproc", "2")
            proc = run(lmctl_command(*args), out.parent)
            assert proc.returncode == 0, proc.stderr[-4000:]
            done[name] = out
        return done[name]

    return get


def _two_machines(
    args: list[str], cwd: Path, env: dict[str, str], *extra: str
) -> list[subprocess.Popen[str]]:
    """The same command on two 'machines': one launcher each, --node-rank 0 first."""
    port = str(free_port())
    machines = ("--nproc", "1", "--nnodes", "2", "--master-addr", "127.0.0.1")
    return [
        start(
            lmctl_command(
                *args, *machines, "--master-port", port, "--node-rank", str(node), *extra
            ),
            cwd,
            env,
        )
        for node in (0, 1)
    ]


def _finish_all(procs: list[subprocess.Popen[str]]) -> list[subprocess.CompletedProcess[str]]:
    done = [finish(proc) for proc in procs]
    for node, proc in enumerate(done):
        assert proc.returncode == 0, f"machine {node}:\n{proc.stderr[-4000:]}"
    return done


def _ranks_in(listed: list[str]) -> set[int]:
    """The ranks whose RNG state a checkpoint's files hold."""
    found = set()
    for rel in listed:
        match = rundir.RNG_STATE_FILE.match(rel.rsplit("/", 1)[-1])
        if match:
            found.add(int(match.group(1) or match.group(2) or 0))
    return found


@pytest.fixture
def store_env(tmp_path: Path) -> dict[str, str]:
    """This test's own cache: the local copies of remote runs."""
    return {"LMCTL_CACHE_DIR": str(tmp_path / "cache")}


@pytest.mark.parametrize("name", list(OPTIONS))
def test_two_machines_write_one_run_to_the_store(
    name: str,
    *,
    s3_store: S3Store,
    uninterrupted: Callable[[str], Path],
    bpe_tokenizer: Path,
    unique_lines: tuple[Path, Path],
    tmp_path: Path,
    store_env: dict[str, str],
) -> None:
    """Each machine uploads its part of every checkpoint (its process's RNG state, its ZeRO
    shard); the checkpoint's manifest lists both, and the final weights are one machine's."""
    if name == "zero2":
        pytest.importorskip("deepspeed")
    prefix = f"{tmp_path.name}/run"
    url = f"s3://{s3_store.bucket}/{prefix}"
    env = {**s3_store.env(), **store_env, "DS_ACCELERATOR": "cpu"}
    args = _args(bpe_tokenizer, unique_lines, url, *OPTIONS[name])
    done = _finish_all(_two_machines(args, tmp_path, env))
    assert done[0].stdout.count("lmctl train clm:") == 1  # the main process, on machine 0
    assert not done[1].stdout.strip()

    keys = s3_store.keys(f"{tmp_path.name}/")
    assert not [key for key in keys if "lmctl-staging" in key or ".lmctl-parts" in key], keys
    for step in (5, 10):
        manifest = json.loads(s3_store.read(f"{prefix}/checkpoint-{step}/{MANIFEST}"))
        listed = [item["path"] for item in manifest["files"]]
        assert _ranks_in(listed) == {0, 1}, listed
        assert len(listed) == len(set(listed))
        if name == "zero2":
            shards = [rel for rel in listed if "zero_pp_rank_" in rel]
            assert len(shards) == 2, listed
    copies = sorted(path.name.rsplit("-", 1)[-1] for path in (tmp_path / "cache/runs").iterdir())
    assert copies == ["node0", "node1"]  # one local copy per machine

    from safetensors.torch import load

    final = load(s3_store.read(f"{prefix}/model.safetensors"))
    assert max_difference(final, weights(uninterrupted(name))) < 1e-5
