"""Several machines played on this one: two launchers with --nnodes 2 and --node-rank 0|1,
one process each, gloo on 127.0.0.1, writing one remote run directory (both engines, and
DeepSpeed ZeRO-2); restarts by torchrun's elastic agent (--max-restarts) after a rank is
SIGKILLed, from the newest complete checkpoint, local or in the store; a pre-emption under
the agent. Every run's final weights are compared with one machine's uninterrupted run of
two processes."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest

from lmctl.run import checkpoints
from tests.conftest import S3Store, free_port
from tests.distributed.conftest import (
    RECORDER,
    TINY_GPT2,
    descendants,
    finish,
    kill_rank_when,
    kill_tree,
    kill_when,
    lmctl_command,
    max_difference,
    rank_of,
    records,
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
    args: list[str], cwd: Path, env: dict[str, str], *extra: str, nnodes: str = "2"
) -> list[subprocess.Popen[str]]:
    """The same command on two 'machines': one launcher each, --node-rank 0 first."""
    port = str(free_port())
    machines = ("--nproc", "1", "--nnodes", nnodes, "--master-addr", "127.0.0.1")
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
        match = checkpoints.RNG_STATE_FILE.match(rel.rsplit("/", 1)[-1])
        if match:
            found.add(int(match.group(1) or match.group(2) or 0))
    return found


def _metrics(lines: str) -> list[dict[str, Any]]:
    return [json.loads(line) for line in lines.splitlines() if line.strip()]


@pytest.fixture
def store_env(tmp_path: Path) -> dict[str, str]:
    """This test's own cache: the local copies of remote runs, the processes' notes."""
    return {"LMCTL_CACHE": str(tmp_path / "cache")}


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


def test_a_run_of_two_machines_resumes_on_two_machines_from_the_store(
    uninterrupted: Callable[[str], Path],
    bpe_tokenizer: Path,
    unique_lines: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    """Both machines SIGKILLed once checkpoint-5 is complete in the store; `lmctl resume URL`
    on two machines with nothing on their disks: each takes checkpoint-5 whole (what both
    machines wrote), and the run ends with the uninterrupted run's weights."""
    root = tmp_path / "store" / "run"
    url = f"file://{root}"
    args = _args(bpe_tokenizer, unique_lines, url, *OPTIONS["trainer"])
    env = {"LMCTL_CACHE": str(tmp_path / "cache"), "LMCTL_STEP_DELAY": "0.3"}
    procs = _two_machines(args, tmp_path, env)
    kill_when(procs[0], (root / "checkpoint-5" / MANIFEST).is_file)
    kill_tree(procs[1])
    procs[1].communicate()
    assert not (root / "model.safetensors").exists()
    fresh = {"LMCTL_CACHE": str(tmp_path / "other-cache")}  # other machines, empty disks
    done = _finish_all(_two_machines(["resume", url], tmp_path, fresh))
    for proc in done:
        assert "files of checkpoint-5 from" in proc.stderr, proc.stderr[-4000:]
    assert max_difference(weights(root), weights(uninterrupted("trainer"))) < 1e-5


@pytest.mark.parametrize("engine", ["trainer", "accelerate"])
def test_a_killed_rank_restarts_every_process_from_the_newest_checkpoint(
    engine: str,
    *,
    uninterrupted: Callable[[str], Path],
    bpe_tokenizer: Path,
    unique_lines: tuple[Path, Path],
    tmp_path: Path,
    store_env: dict[str, str],
) -> None:
    """--max-restarts 1, rank 1 SIGKILLed once checkpoint-5 is complete: the agent restarts
    both processes, which continue from checkpoint-5 with no command typed; the restart (step
    and cause) is in the log, the metrics and `lmctl runs`."""
    out = tmp_path / "run"
    args = _args(bpe_tokenizer, unique_lines, out, *OPTIONS[engine], "--nproc", "2")
    env = {**store_env, "LMCTL_STEP_DELAY": "0.3"}
    proc = start(lmctl_command(*args, "--max-restarts", "1"), tmp_path, env)
    killed = kill_rank_when([proc], 1, (out / "checkpoint-5").is_dir)
    done = finish(proc)
    assert done.returncode == 0, done.stderr[-4000:]
    assert max_difference(weights(out), weights(uninterrupted(engine))) < 1e-5

    (restart,) = [r for r in _metrics((out / "metrics.jsonl").read_text()) if "restart" in r]
    assert restart["step"] == 5 and restart["checkpoint"] == "checkpoint-5"
    assert f"rank 1 (pid {killed}) was killed" in restart["cause"]
    assert f"restart 1 after rank 1 (pid {killed}) was killed" in done.stderr
    assert "continuing from checkpoint-5 (step 5)" in done.stderr
    listed = run(lmctl_command("runs", tmp_path, "--json"), tmp_path)
    (summary,) = json.loads(listed.stdout)["runs"]
    assert summary["status"] == "finished"
    assert summary["restarts"] == [{"restart": 1, "step": 5, "cause": restart["cause"]}]
    table = run(lmctl_command("runs", tmp_path), tmp_path).stdout
    assert f"run: restart 1 from step 5 after rank 1 (pid {killed}) was killed" in table


def test_two_machines_restart_from_the_newest_checkpoint_in_the_store(
    uninterrupted: Callable[[str], Path],
    bpe_tokenizer: Path,
    unique_lines: tuple[Path, Path],
    tmp_path: Path,
    store_env: dict[str, str],
) -> None:
    """Two machines, a file:// run directory, --max-restarts 1, machine 1's rank SIGKILLed
    once checkpoint-5 is complete in the store: both machines' processes restart, each
    machine takes checkpoint-5 whole from the store (its own copy holds only its part), and
    the run ends with the uninterrupted run's weights."""
    root = tmp_path / "store" / "run"
    args = _args(bpe_tokenizer, unique_lines, f"file://{root}", *OPTIONS["trainer"])
    env = {**store_env, "LMCTL_STEP_DELAY": "0.3"}
    procs = _two_machines(args, tmp_path, env, "--max-restarts", "1")
    killed = kill_rank_when(procs, 1, (root / "checkpoint-5" / MANIFEST).is_file)
    done = _finish_all(procs)
    logs = "".join(proc.stderr for proc in done)
    assert f"rank 1 (pid {killed}) was killed" in logs
    assert "continuing from checkpoint-5 (step 5)" in logs
    for step in (5, 10):
        manifest = json.loads((root / f"checkpoint-{step}" / MANIFEST).read_text())
        assert _ranks_in([item["path"] for item in manifest["files"]]) == {0, 1}
    restarts = [r for r in _metrics((root / "metrics.jsonl").read_text()) if "restart" in r]
    assert [r["step"] for r in restarts] == [5]
    assert max_difference(weights(root), weights(uninterrupted("trainer"))) < 1e-5


def test_a_machine_lost_for_good_leaves_the_run_to_the_others(
    uninterrupted: Callable[[str], Path],
    bpe_tokenizer: Path,
    unique_lines: tuple[Path, Path],
    tmp_path: Path,
    store_env: dict[str, str],
) -> None:
    """--nnodes 1:2 --max-restarts 2 into a directory both machines share: once checkpoint-5
    is complete, machine 1 (its launcher and its process) is killed for good. Machine 0's
    agent restarts with the one machine left, which continues from checkpoint-5 with the
    same global batch (4 per device x 1 process x 2 accumulation steps) and finishes with
    the uninterrupted two-process run's eval loss within 1%; the change is in the log,
    metrics.jsonl and `lmctl runs`."""
    out = tmp_path / "run"
    args = _args(bpe_tokenizer, unique_lines, out, *OPTIONS["trainer"])
    env = {**store_env, "LMCTL_STEP_DELAY": "0.3"}
    first, second = _two_machines(args, tmp_path, env, "--max-restarts", "2", nnodes="1:2")
    kill_when(second, (out / "checkpoint-5").is_dir)  # its launcher too: for good
    done = finish(first)
    assert done.returncode == 0, done.stderr[-4000:]
    assert "--nnodes 1:2" in done.stderr  # the launcher command shown
    assert (
        "checkpoint-5 was saved by 2 process(es); continuing on 1 with the same global "
        "batch of 8 = 4 per device x 1 process(es) x 2 accumulation step(s)" in done.stderr
    )
    (restart,) = [r for r in _metrics((out / "metrics.jsonl").read_text()) if "restart" in r]
    assert restart["step"] == 5 and restart["checkpoint"] == "checkpoint-5"
    assert (restart["processes"], restart["processes_before"]) == (1, 2)
    latest = checkpoints.latest_checkpoint(out)
    assert latest is not None and latest.name == "checkpoint-10"
    assert checkpoints.checkpoint_world_size(latest) == 1
    # Dropout draws after the restart come from the seed and the step, not the lost
    # machine's random state: the weights differ a little, the model does not.
    final = json.loads((out / "all_results.json").read_text())["eval_loss"]
    expected = json.loads((uninterrupted("trainer") / "all_results.json").read_text())["eval_loss"]
    assert abs(final - expected) <= 0.01 * expected, (final, expected)
    listed = run(lmctl_command("runs", tmp_path, "--json"), tmp_path)
    (summary,) = json.loads(listed.stdout)["runs"]
    assert summary["status"] == "finished"
    assert summary["restarts"][0]["processes"] == 1
    table = run(lmctl_command("runs", tmp_path), tmp_path).stdout
    assert "on 1 process(es) instead of 2" in table


def test_a_bucket_run_resumes_on_another_number_of_processes(
    uninterrupted: Callable[[str], Path],
    bpe_tokenizer: Path,
    unique_lines: tuple[Path, Path],
    tmp_path: Path,
    store_env: dict[str, str],
) -> None:
    """A run of two processes into a file:// run directory, SIGKILLed once checkpoint-5 is
    complete in the store, then `lmctl resume URL --nproc 1` from another working copy: one
    process continues with the same global batch, its checkpoints are uploaded, and the final
    eval loss is the uninterrupted run's within 1%."""
    root = tmp_path / "store" / "run"
    args = _args(bpe_tokenizer, unique_lines, f"file://{root}", *OPTIONS["trainer"])
    env = {**store_env, "LMCTL_STEP_DELAY": "0.3"}
    kill_when(
        start(lmctl_command(*args, "--nproc", "2"), tmp_path, env),
        (root / "checkpoint-5" / MANIFEST).is_file,
    )
    elsewhere = {"LMCTL_CACHE": str(tmp_path / "another-cache")}
    resumed = run(lmctl_command("resume", f"file://{root}", "--nproc", "1"), tmp_path, elsewhere)
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert "continuing on 1 with the same global batch of 8" in resumed.stderr
    manifest = json.loads((root / "checkpoint-10" / MANIFEST).read_text())
    assert _ranks_in([item["path"] for item in manifest["files"]]) == {0}
    final = json.loads((root / "all_results.json").read_text())["eval_loss"]
    expected = json.loads((uninterrupted("trainer") / "all_results.json").read_text())["eval_loss"]
    assert abs(final - expected) <= 0.01 * expected, (final, expected)


@pytest.mark.parametrize("who", ["ranks", "job"])
def test_a_pre_emption_under_the_agent_saves_first(
    who: str,
    *,
    uninterrupted: Callable[[str], Path],
    bpe_tokenizer: Path,
    unique_lines: tuple[Path, Path],
    tmp_path: Path,
    store_env: dict[str, str],
) -> None:
    """SIGTERM to every rank (``ranks``) with --max-restarts 1: each saves a checkpoint at the
    same step, the agent restarts them from it and the run ends with the uninterrupted run's
    weights. SIGTERM to every process of the job, launcher included (``job``, as a cluster
    pre-empts): the checkpoint is saved (the ranks hear it twice, from the cluster and from
    their launcher) and the run stops with exit code 130."""
    out, seen = tmp_path / "run", tmp_path / "seen"
    seen.mkdir()
    args = _args(bpe_tokenizer, unique_lines, out, *OPTIONS["trainer"], "--nproc", "2")
    env = {**store_env, "LMCTL_STEP_DELAY": "0.3", "LMCTL_RECORD_DIR": str(seen)}
    proc = start(lmctl_command(*args, "--max-restarts", "1"), tmp_path, env)
    deadline = time.monotonic() + 300
    while len(records(seen, 1)) < 2 * 4 and time.monotonic() < deadline and proc.poll() is None:
        time.sleep(0.05)
    processes = [proc.pid, *descendants(proc.pid)]
    for pid in processes if who == "job" else [p for p in processes if rank_of(p) is not None]:
        os.kill(pid, signal.SIGTERM)
    done = finish(proc)
    saved = [checkpoints.checkpoint_step(path) for path in checkpoints.checkpoints(out)]
    step = next(s for s in saved if s not in (5, 10))
    assert 0 < step < 5, saved
    assert f"checkpoint saved at step {step}" in done.stderr
    events = [r for r in _metrics((out / "metrics.jsonl").read_text()) if "event" in r]
    if who == "job":
        assert done.returncode == 130, done.stderr[-4000:]
        assert not [e for e in events if e["event"] == "restart"]
        return
    assert done.returncode == 0, done.stderr[-4000:]
    (restart,) = [e for e in events if e["event"] == "restart"]
    assert restart["step"] == step
    assert "exited with code 130: interrupted by SIGTERM" in restart["cause"]
    assert max_difference(weights(out), weights(uninterrupted("trainer"))) < 1e-5
