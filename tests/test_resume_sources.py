"""Exact resume of named sources: a run killed with SIGKILL after a checkpoint and continued
with ``lmctl resume`` trains on exactly the examples, in the same order, that a run never
interrupted trains on: for a reader, a file and their weighted mixture, read into datasets or
streamed, on both engines. A mixture is continued the same way by torchrun's agent
(``--max-restarts``) and from an ``s3://`` run directory. Each process records the examples
it trains on (``tests/distributed/record_batches.py``)."""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import time
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
import yaml

from lmctl.run import checkpoints
from tests.conftest import TINY_GPT2, S3Store
from tests.distributed.conftest import (
    LAUNCH_TIMEOUT,
    RECORDER,
    finish,
    kill_rank_when,
    kill_tree,
    kill_when,
    lmctl_command,
    records,
    run,
    start,
)
from tests.test_sources import EXAMPLE, make_table

#: Three runs each (about a minute on a small CPU machine): the slow tier.
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BATCH = 4
MAX_STEPS = 12
SAVE_STEPS = 4
MANIFEST = "lmctl-manifest.json"

#: A reader that declares no version: read again by every run (never cached).
UNVERSIONED = """\
from readers import rows


def fresh_rows(db, partitions):
    yield from rows(db, partitions)
"""


@pytest.fixture(scope="module")
def folder(tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A table of 8 partitions, a text file and the readers, small enough that twelve steps
    read the file more than once."""
    where = tmp_path_factory.mktemp("sources-resume")
    make_table(where / "corpus.db", rows=160)
    (where / "readers.py").write_text((EXAMPLE / "readers.py").read_text(), encoding="utf-8")
    (where / "fresh.py").write_text(UNVERSIONED, encoding="utf-8")
    books = [f"line {n} of a book about the sea" for n in range(15)]
    (where / "books.txt").write_text("\n".join(books) + "\n", encoding="utf-8")
    return where


def _sources(kind: str, folder: Path) -> list[dict[str, Any]]:
    table = {
        "name": "table",
        "reader": f"{folder / 'fresh.py'}:fresh_rows",
        "args": {"db": str(folder / "corpus.db"), "partitions": list(range(8))},
        "weight": 0.6,
    }
    books = {"name": "books", "file": str(folder / "books.txt"), "weight": 0.4}
    chosen = {"reader": [table], "file": [books], "mixture": [table, books]}[kind]
    if len(chosen) == 1:
        chosen = [{key: value for key, value in chosen[0].items() if key != "weight"}]
    return chosen


def _args(config: Path, engine: str, tokenizer: Path, out: str | Path, *extra: str) -> list[str]:
    return lmctl_command(
        "train", "clm", "--config", config, *TINY_GPT2, "--tokenizer-name", tokenizer,
        "--block-size", "16", "--per-device-train-batch-size", str(BATCH), "--no-eval",
        "--max-steps", str(MAX_STEPS), "--save-steps", str(SAVE_STEPS), "--logging-steps", "1",
        "--engine", engine, "--import", str(RECORDER), "-o", out, *extra,
    )  # fmt: skip


@dataclass
class Continued:
    """A run interrupted after a checkpoint and continued from it: the log of the part that
    continued it, the checkpoint (a local copy of it), and the examples trained on before the
    interruption and after it."""

    log: str
    checkpoint: Path
    before: list[tuple[int, ...]]
    after: list[tuple[int, ...]]


#: Runs the training command that ``command(run_dir)`` gives, interrupts it after a
#: checkpoint and continues it, in the test's folder.
Interruption = Callable[[Callable[[str | Path], list[str]], Path], Continued]

#: Each training forward sleeps this long in a run that is to be killed, so that it is
#: killed before its next checkpoint.
SLOW = {"LMCTL_STEP_DELAY": "0.3"}


def _folders(tmp_path: Path, out: str, *seen: str) -> list[Path]:
    """The run directory ``out`` (not made) and the record folders ``seen`` (made)."""
    for name in seen:
        (tmp_path / name).mkdir()
    return [tmp_path / name for name in (out, *seen)]


def killed_then_resumed(command: Callable[[str | Path], list[str]], tmp_path: Path) -> Continued:
    """SIGKILL once the first checkpoint is saved, then ``lmctl resume RUN_DIR``."""
    killed, seen_killed, seen_resumed = _folders(tmp_path, "killed", "seen-killed", "seen-resumed")
    proc = start(command(killed), tmp_path, {"LMCTL_RECORD_DIR": str(seen_killed), **SLOW})
    kill_when(proc, (killed / f"checkpoint-{SAVE_STEPS}").is_dir)
    latest = checkpoints.latest_checkpoint(killed)
    assert latest is not None
    resumed = run(lmctl_command("resume", killed), tmp_path,
                  {"LMCTL_RECORD_DIR": str(seen_resumed)})  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    return Continued(resumed.stderr, latest, records(seen_killed, 0), records(seen_resumed, 0))


def check_exact_resume(
    kind: str,
    engine: str,
    folder: Path,
    tokenizer: Path,
    tmp_path: Path,
    *extra: str,
    interrupt: Interruption = killed_then_resumed,
) -> Continued:
    """Train uninterrupted, then interrupt a second run after a checkpoint and continue it
    (``interrupt``): the continued run trains on the examples the uninterrupted one trained
    on after that checkpoint, in the same order, and the interrupted one trained on those
    before it."""
    config = tmp_path / f"{kind}.yaml"
    config.write_text(yaml.safe_dump({"train_sources": _sources(kind, folder)}), encoding="utf-8")
    full, seen_full = _folders(tmp_path, "full", "seen-full")
    proc = run(_args(config, engine, tokenizer, full, *extra), tmp_path,
               {"LMCTL_RECORD_DIR": str(seen_full)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    reference = records(seen_full, 0)
    # Each pass of a stream may end on a short batch.
    assert MAX_STEPS * (BATCH - 1) < len(reference) <= MAX_STEPS * BATCH

    continued = interrupt(lambda out: _args(config, engine, tokenizer, out, *extra), tmp_path)
    step = checkpoints.checkpoint_step(continued.checkpoint)
    assert 0 < step < MAX_STEPS
    assert f"from {continued.checkpoint.name}" in continued.log
    # The run trained on the examples before the checkpoint, the continued run on the rest.
    done = len(reference) - len(continued.after)
    assert step * (BATCH - 1) < done <= step * BATCH
    assert continued.after == reference[done:]
    assert continued.before[:done] == reference[:done]
    return continued


@pytest.mark.parametrize("engine", ["trainer", "accelerate"])
@pytest.mark.parametrize("kind", ["mixture", "reader", "file"])
def test_sigkill_then_resume_trains_on_the_same_examples(
    kind: str, engine: str, folder: Path, bpe_tokenizer: Path, tmp_path: Path
) -> None:
    check_exact_resume(kind, engine, folder, bpe_tokenizer, tmp_path)


@pytest.mark.parametrize("engine", ["trainer", "accelerate"])
@pytest.mark.parametrize("kind", ["mixture", "mixture-repeating", "reader", "file"])
def test_sigkill_then_resume_of_a_stream_trains_on_the_same_examples(
    kind: str, engine: str, folder: Path, bpe_tokenizer: Path, tmp_path: Path
) -> None:
    """A stream seeks to the recorded position of each shard of each source; a mixture that
    repeats the sources that run out reads the consumed batches again, and says so."""
    sources, _, repeating = kind.partition("-")
    strategy = "all_exhausted" if repeating else "first_exhausted"
    continued = check_exact_resume(
        sources, engine, folder, bpe_tokenizer, tmp_path, "--streaming",
        "--shuffle-buffer-size", "8", "--mix-stopping-strategy", strategy,
    )  # fmt: skip
    again = "reads the batches trained on before the checkpoint again" in continued.log
    assert again == bool(repeating)
    # A mixture that repeats its sources records its counts, and no positions.
    position = json.loads((continued.checkpoint / "stream_position.json").read_text())
    assert ("readers" in position) == (not repeating)
    if sources == "mixture" and not repeating:
        # One plan for both sources: the shards of each are numbered apart.
        assert position["layout"]["shards"] == 8 + 1
        last = checkpoints.latest_checkpoint(tmp_path / "full")
        assert last is not None
        ended = json.loads((last / "stream_position.json").read_text())
        assert ended["epoch"] >= 1, "the test needs the mixture to have ended a pass"
    if sources == "mixture":
        # The examples of each source trained on: counted on from the checkpoint, as many
        # as the uninterrupted run's, which are every example it trained on.
        full, resumed = (
            json.loads((tmp_path / name / "all_results.json").read_text())
            for name in ("full", "killed")
        )
        counts = {name: full[f"train_{name}_examples"] for name in ("table", "books")}
        assert all(counts.values())
        assert sum(counts.values()) == len(records(tmp_path / "seen-full", 0))
        assert {name: resumed[f"train_{name}_examples"] for name in counts} == counts


def restarted_by_the_agent(command: Callable[[str | Path], list[str]], tmp_path: Path) -> Continued:
    """``--nproc 1 --max-restarts 1``: the training process SIGKILLed once the first
    checkpoint is saved; torchrun's agent starts it again, and it continues from the newest
    checkpoint with no command typed."""
    out, seen = _folders(tmp_path, "restarted", "seen-restarted")
    env = {"LMCTL_RECORD_DIR": str(seen), "LMCTL_CACHE": str(tmp_path / "cache"), **SLOW}
    proc = start([*command(out), "--nproc", "1", "--max-restarts", "1"], tmp_path, env)
    killed = kill_rank_when([proc], 0, (out / f"checkpoint-{SAVE_STEPS}").is_dir)
    done = finish(proc)
    assert done.returncode == 0, done.stderr[-4000:]
    assert f"restart 1 after rank 0 (pid {killed}) was killed" in done.stderr
    latest = checkpoints.latest_checkpoint(out)
    assert latest is not None and latest.name == f"checkpoint-{MAX_STEPS}"
    (restart,) = [r for r in map(json.loads, (out / "metrics.jsonl").open()) if "restart" in r]
    checkpoint = out / restart["checkpoint"]
    return Continued(done.stderr, checkpoint, records(seen, 0), records(seen, 0, restart=1))


def resumed_from_the_bucket(store: S3Store) -> Interruption:
    """``-o s3://...``: SIGKILL once a checkpoint is complete in the bucket, the local copy
    deleted (another machine), then ``lmctl resume s3://...``, which fetches the newest
    complete checkpoint."""

    def interrupt(command: Callable[[str | Path], list[str]], tmp_path: Path) -> Continued:
        _, seen_killed, seen_resumed = _folders(tmp_path, "", "seen-killed", "seen-resumed")
        prefix = f"{tmp_path.name}/run"
        url = f"s3://{store.bucket}/{prefix}"
        env = {**store.env(), "LMCTL_CACHE": str(tmp_path / "cache")}
        proc = start(command(url), tmp_path, {**env, "LMCTL_RECORD_DIR": str(seen_killed), **SLOW})
        step = _kill_once_complete(proc, store, prefix)
        shutil.rmtree(tmp_path / "cache")
        other = {**env, "LMCTL_CACHE": str(tmp_path / "other-cache")}
        resumed = run(lmctl_command("resume", url), tmp_path,
                      {**other, "LMCTL_RECORD_DIR": str(seen_resumed)})  # fmt: skip
        assert resumed.returncode == 0, resumed.stderr[-4000:]
        assert f"fetched checkpoint-{step}" in resumed.stderr
        # This machine's copy of the checkpoint.
        (checkpoint,) = (tmp_path / "other-cache").glob(f"runs/*/checkpoint-{step}")
        return Continued(resumed.stderr, checkpoint, records(seen_killed, 0),
                         records(seen_resumed, 0))  # fmt: skip

    return interrupt


def _kill_once_complete(proc: subprocess.Popen[str], store: S3Store, prefix: str) -> int:
    """SIGKILL the run writing to ``prefix`` at a moment the bucket holds a complete
    checkpoint and the run's own files with their manifest; returns the newest complete
    checkpoint's step. The run is stopped (SIGSTOP) while the bucket is read, and continued
    while its files are being replaced: killed then, the run is left without its manifest,
    which ``lmctl resume URL`` refuses (a gap of its own, not this test's). Uploads queue
    behind this slow store, so the next one starts as soon as a checkpoint is complete."""

    def complete() -> list[int]:
        keys = store.keys(f"{prefix}/")
        if f"{prefix}/{MANIFEST}" not in keys:  # none yet, or the run's files being replaced
            return []
        folders = [Path(key).parent for key in keys if key.endswith(f"/{MANIFEST}")]
        return sorted(checkpoints.checkpoint_step(folder) for folder in folders
                      if folder.name.startswith("checkpoint-"))  # fmt: skip

    deadline = time.monotonic() + LAUNCH_TIMEOUT
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            _, stderr = proc.communicate()
            pytest.fail(f"the run ended before it could be killed:\n{stderr[-4000:]}")
        if complete():
            os.killpg(proc.pid, signal.SIGSTOP)
            steps = complete()
            if steps:
                kill_tree(proc)
                proc.communicate()
                return steps[-1]
            os.killpg(proc.pid, signal.SIGCONT)
        time.sleep(0.05)
    kill_tree(proc)
    pytest.fail("the run never completed a checkpoint in the bucket")


def test_a_mixed_stream_restarted_by_the_agent_trains_on_the_same_examples(
    folder: Path, bpe_tokenizer: Path, tmp_path: Path
) -> None:
    """A reader and a file mixed and streamed, the training process SIGKILLed after a
    checkpoint under --max-restarts (accelerate engine): the restarted process seeks each
    source to where the checkpoint left it."""
    continued = check_exact_resume(
        "mixture", "accelerate", folder, bpe_tokenizer, tmp_path, "--streaming",
        "--shuffle-buffer-size", "8", "--mix-stopping-strategy", "first_exhausted",
        interrupt=restarted_by_the_agent,
    )  # fmt: skip
    assert "readers" in json.loads((continued.checkpoint / "stream_position.json").read_text())
    # The restarted process counted on from the checkpoint: the shares of the whole run.
    full, restarted = (
        json.loads((tmp_path / name / "all_results.json").read_text())
        for name in ("full", "restarted")
    )
    for name in ("table", "books"):
        assert restarted[f"train_{name}_examples"] == full[f"train_{name}_examples"] > 0


def test_a_mixture_resumed_from_a_bucket_trains_on_the_same_examples(
    s3_store: S3Store, folder: Path, bpe_tokenizer: Path, tmp_path: Path
) -> None:
    """A reader and a file mixed (read into datasets, trainer engine) into an s3:// run
    directory, SIGKILLed after a checkpoint and resumed from the bucket on a machine with
    nothing of the run on its disk."""
    check_exact_resume(
        "mixture", "trainer", folder, bpe_tokenizer, tmp_path,
        interrupt=resumed_from_the_bucket(s3_store),
    )  # fmt: skip
