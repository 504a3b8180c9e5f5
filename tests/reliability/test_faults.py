"""Faults: SIGKILL at random moments of training, of a checkpoint save, of the final save and
of a push; a full disk during a save.

Every kill is drawn from one seeded generator (``LMCTL_TEST_SEED`` replays a run; the seed
and the moments are printed in the tier's summary). After the kills, ``lmctl resume`` (or
the re-run push) must succeed and the final artefacts must equal the uninterrupted run's.
Processes are forked from a server that has imported everything once, so a trial costs the
training steps it runs, not the imports.
"""

from __future__ import annotations

import hashlib
import json
import os
import random
import shutil
import subprocess
import sys
import time
from pathlib import Path

import pytest

from lmctl.run import checkpoints
from lmctl.storage import atomic
from lmctl.storage.locations import MANIFEST
from tests.conftest import S3Store
from tests.reliability.conftest import FAULT_SAVE_STEPS, FAULT_STEPS, fault_args
from tests.reliability.harness import TALLY, Forked, Outcome, forked, record

TRIALS = 10
SEED = int(os.environ.get("LMCTL_TEST_SEED", time.time_ns() % 10**6))


def rng_for(name: str) -> random.Random:
    return random.Random(f"{SEED}-{name}")


def note(text: str) -> None:
    TALLY.notes.append(f"faults (LMCTL_TEST_SEED={SEED}): {text}")


def weights(path: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    return load_file(path / "model.safetensors")


def assert_same_model(reference: Path, run: Path, context: str) -> None:
    ref, got = weights(reference), weights(run)
    assert ref.keys() == got.keys(), context
    diff = max(float((ref[k] - got[k]).abs().max()) for k in ref)  # type: ignore[operator]
    assert diff < 1e-5, f"{context}: max abs weight difference {diff}"
    for name in ("config.json", "tokenizer.json"):
        assert (run / name).read_bytes() == (reference / name).read_bytes(), f"{context}: {name}"


def top_level(path: Path) -> set[str]:
    return {child.name for child in path.iterdir() if not child.name.startswith(".")}


def recover(run: Path, log: Path, context: str, *, finished_ok: bool = False) -> Outcome:
    """``lmctl resume`` after a kill: it must finish the run, or, with ``finished_ok``, may
    rightly say that the run has finished (a kill that came after the final state was
    written; the run must then be complete already)."""
    outcome = forked(["resume", str(run)], log)
    finished = (
        finished_ok
        and outcome.code == 2
        and "nothing to resume: the run finished" in outcome.stderr
    )
    record(outcome, expected=2 if finished else 0)
    assert outcome.code == 0 or finished, f"{context}: resume failed\n{outcome.stderr[-3000:]}"
    return outcome


def assert_resumable(run: Path, context: str) -> None:
    latest = checkpoints.latest_checkpoint(run)
    assert latest is not None, f"{context}: no complete checkpoint left"
    for checkpoint in checkpoints.checkpoints(run):
        assert checkpoints.checkpoint_problem(checkpoint) is None, f"{context}: {checkpoint.name}"


def _step_line(step: int) -> str:
    return f"step {step}/{FAULT_STEPS} "


def test_sigkill_during_training(
    reference_run: Path, bpe_tokenizer: Path, corpus: Path, tmp_path: Path
) -> None:
    """Ten kills in a row, each at a random step and moment after the newest checkpoint; the
    run is resumed after each one, and finally finished. A kill lands a moment after its step
    is logged, so a fast run can have saved a later checkpoint first; where that leaves no
    step to kill before the last one, that run is finished and checked, and the next kills
    go to a fresh run."""
    rng = rng_for("training")
    run = tmp_path / "run"
    moments = []
    for trial in range(TRIALS):
        latest = checkpoints.latest_checkpoint(run)
        start = checkpoints.checkpoint_step(latest) if latest else 0
        if max(start, FAULT_SAVE_STEPS) + 1 > FAULT_STEPS - 2:
            recover(
                run, tmp_path / f"recover-{trial}", f"after kills at {moments}", finished_ok=True
            )
            assert_same_model(reference_run, run, f"killed during training at {moments}")
            run, latest, start = tmp_path / f"run-{trial}", None, 0
        step = rng.randint(max(start, FAULT_SAVE_STEPS) + 1, FAULT_STEPS - 2)
        delay = rng.uniform(0, 0.02)
        argv = ["resume", str(run)] if latest else fault_args(bpe_tokenizer, corpus, run)
        process = Forked(argv, tmp_path / f"kill-{trial}")
        process.wait_for(lambda p=process, s=step: _step_line(s) in p.stderr)
        time.sleep(delay)
        killed = process.kill()
        moments.append(f"{step}+{delay:.3f}s" + ("" if killed else "(ended)"))
        assert_resumable(run, f"training kill {trial} at step {step}")
    recover(run, tmp_path / "recover", f"after kills at {moments}")
    note(f"{TRIALS} kills during training at steps {', '.join(moments)}")
    assert_same_model(reference_run, run, f"killed during training at {moments}")
    assert top_level(run) == top_level(reference_run)


def test_sigkill_during_checkpoint_save(
    reference_run: Path, bpe_tokenizer: Path, corpus: Path, tmp_path: Path
) -> None:
    """Ten kills inside checkpoint saves (held open by LMCTL_TEST_PAUSE_IN_SAVE after the
    files are written, before the rename), at a random checkpoint and moment."""
    rng = rng_for("checkpoint")
    run = tmp_path / "run"
    moments = []
    for trial in range(TRIALS):
        latest = checkpoints.latest_checkpoint(run)
        # A fresh run is killed in its second save or later: killed in its first, it would
        # have no checkpoint to resume from.
        start = checkpoints.checkpoint_step(latest) if latest else FAULT_SAVE_STEPS
        target = rng.choice(range(start + FAULT_SAVE_STEPS, FAULT_STEPS + 1, FAULT_SAVE_STEPS))
        delay = rng.uniform(0, 0.2)
        name = f"checkpoint-{target}"
        argv = ["resume", str(run)] if latest else fault_args(bpe_tokenizer, corpus, run)
        process = Forked(
            argv, tmp_path / f"kill-{trial}", env={atomic.TEST_PAUSE_ENV: f"{name}:60"}
        )
        process.wait_for(lambda p=process, n=name: f"before committing {n}" in p.stderr)
        time.sleep(delay)
        assert process.kill(), f"save of {name} ended before the kill"
        moments.append(f"{name}+{delay:.3f}s")
        assert not (run / name).exists(), f"half-written {name} is visible"
        assert_resumable(run, f"kill in the save of {name}")
    outcome = recover(run, tmp_path / "recover", f"after kills at {moments}")
    assert "removed .tmp-checkpoint-" in outcome.stderr
    note(f"{TRIALS} kills inside checkpoint saves: {', '.join(moments)}")
    assert_same_model(reference_run, run, f"killed during checkpoint saves at {moments}")
    assert not [child for child in run.iterdir() if child.name.startswith(".tmp-")]


@pytest.fixture(scope="module")
def before_final_save(
    bpe_tokenizer: Path, corpus: Path, tmp_path_factory: pytest.TempPathFactory
) -> Path:
    """A run killed inside its last checkpoint save: resuming it trains the last steps and
    then makes the final save."""
    folder = tmp_path_factory.mktemp("before-final")
    run = folder / "run"
    name = f"checkpoint-{FAULT_STEPS}"
    process = Forked(
        fault_args(bpe_tokenizer, corpus, run),
        folder / "train",
        env={atomic.TEST_PAUSE_ENV: f"{name}:60"},
    )
    process.wait_for(lambda: f"before committing {name}" in process.stderr)
    process.kill()
    atomic.discard_staging(run)
    return run


def test_sigkill_during_final_save(
    reference_run: Path, before_final_save: Path, tmp_path: Path
) -> None:
    """Ten kills at random moments between the last checkpoint's commit and the end of the
    process: the final save of the model, its state, results and model card."""
    rng = rng_for("final")
    last = f"checkpoint-{FAULT_STEPS}"
    calibration = tmp_path / "calibration"
    shutil.copytree(before_final_save, calibration)
    process = Forked(["resume", str(calibration)], tmp_path / "calibration")
    process.wait_for((calibration / last).is_dir)
    committed = time.monotonic()
    assert process.wait().code == 0, process.stderr
    window = time.monotonic() - committed
    moments = []
    landed = 0
    for trial in range(TRIALS):
        run = tmp_path / f"trial-{trial}"
        shutil.copytree(before_final_save, run)
        delay = rng.uniform(0, window)
        process = Forked(["resume", str(run)], tmp_path / f"kill-{trial}")
        process.wait_for(lambda r=run: (r / last).is_dir())
        time.sleep(delay)
        killed = process.kill()
        landed += killed
        moments.append(f"{delay:.3f}s" + ("" if killed else "(ended)"))
        context = f"killed {delay:.3f}s after {last} (window {window:.3f}s)"
        recover(run, tmp_path / f"recover-{trial}", context, finished_ok=True)
        assert_same_model(reference_run, run, context)
        assert top_level(run) == top_level(reference_run), context
    note(
        f"{TRIALS} kills in the final save ({landed} while running, window {window:.3f}s): "
        + ", ".join(moments)
    )


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def publication(store: S3Store, prefix: str) -> dict[str, str]:
    """What a reader sees under ``prefix``: each object's sha256 (the manifest's, without
    the time it was written)."""
    out = {}
    for key in store.keys(prefix + "/"):
        data = store.read(key)
        name = key[len(prefix) + 1 :]
        if name == MANIFEST:
            manifest = json.loads(data)
            manifest.pop("created", None)
            data = json.dumps(manifest, sort_keys=True).encode()
        out[name] = _sha256(data)
    return out


def test_sigkill_during_push(reference_run: Path, s3_store: S3Store, tmp_path: Path) -> None:
    """Ten pushes killed after a random number of written objects (uploads and moves into
    place); the re-run push succeeds and the publication equals an uninterrupted one."""
    rng = rng_for("push")
    env = s3_store.env()
    clean = forked(
        ["push", str(reference_run), "--to", "s3://models/fault/clean"], tmp_path / "clean", env
    )
    assert clean.code == 0, clean.stderr
    expected = publication(s3_store, "fault/clean")
    files = len([p for p in reference_run.iterdir() if p.is_file()])
    moments = []
    for trial in range(TRIALS):
        prefix = f"fault/trial-{trial}"
        writes = rng.randint(1, 2 * files)
        moments.append(str(writes))
        url = f"s3://models/{prefix}"
        killed = forked(
            ["push", str(reference_run), "--to", url],
            tmp_path / f"kill-{trial}",
            {**env, "LMCTL_TEST_PUSH_KILL_AFTER": str(writes)},
        )
        outcome = forked(
            ["push", str(reference_run), "--to", url], tmp_path / f"rerun-{trial}", env
        )
        record(outcome, expected=0)
        context = f"push killed after {writes} writes (exit {killed.code})"
        assert outcome.code == 0, f"{context}\n{outcome.stderr[-3000:]}"
        got = publication(s3_store, prefix)
        assert got == expected, context
        staging = s3_store.keys(f"fault/.trial-{trial}.lmctl-staging")
        assert not staging, f"{context}: staging left behind: {staging}"
    assert MANIFEST in expected
    note(f"{TRIALS} pushes killed after N written objects, N = {', '.join(moments)}")


# A full disk ------------------------------------------------------------------------------


def _can_mount_tmpfs() -> bool:
    if not shutil.which("unshare"):
        return False
    try:
        probe = subprocess.run(
            ["unshare", "-rm", "sh", "-c", "mount -t tmpfs -o size=64k tmpfs /mnt && echo ok"],
            capture_output=True,
            text=True,
            timeout=30,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return False
    return probe.stdout.strip() == "ok"


def test_full_disk_during_a_checkpoint_save(
    reference_run: Path, bpe_tokenizer: Path, corpus: Path, tmp_path: Path
) -> None:
    """The run directory on a file system with room for one checkpoint only: the second
    save fails with a clear message and its exit code, and the first checkpoint is intact."""
    if not _can_mount_tmpfs():
        pytest.skip("no mount namespace here to give the run a small file system")
    first = reference_run / f"checkpoint-{FAULT_SAVE_STEPS}"
    checkpoint_bytes = sum(p.stat().st_size for p in first.rglob("*") if p.is_file())
    size = (int(checkpoint_bytes * 1.6) // 4096 + 4) * 4096
    disk = tmp_path / "disk"
    disk.mkdir()
    kept = tmp_path / "kept"
    run = disk / "run"
    argv = fault_args(bpe_tokenizer, corpus, run)
    command = " ".join(
        [
            sys.executable,
            "-m",
            "lmctl",
            *(f"'{arg}'" for arg in argv),
            f"> {tmp_path}/out 2> {tmp_path}/err",
        ]
    )
    script = (
        f"mount -t tmpfs -o size={size} tmpfs {disk} && {{ {command}; echo $? > {tmp_path}/rc; "
        f"cp -a {disk}/. {kept}/; }}"
    )
    env = {**os.environ, "CI": "1"}
    env.pop("LMCTL_DEBUG", None)
    subprocess.run(["unshare", "-rm", "sh", "-c", script], env=env, timeout=600, check=False)
    code = int((tmp_path / "rc").read_text())
    stderr = (tmp_path / "err").read_text()
    outcome = Outcome(argv, code, (tmp_path / "out").read_text(), stderr)
    record(outcome, expected=4)
    assert not outcome.traceback, stderr
    assert code == 4, stderr
    errors = outcome.errors()
    assert len(errors) == 1, stderr
    assert "no space left" in errors[0].lower() and "(hint: " in errors[0], errors[0]
    saved = kept / "run"
    latest = checkpoints.latest_checkpoint(saved)
    assert latest is not None and latest.name == first.name, sorted(os.listdir(saved))
    assert checkpoints.checkpoint_problem(latest) is None
    assert first.name in errors[0]
    note(f"full disk: a {size // 1024} KiB file system, exit {code}: {errors[0][20:200]}")
