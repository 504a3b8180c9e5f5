"""Exact resume of named sources: a run killed with SIGKILL after a checkpoint and continued
with ``lmctl resume`` trains on exactly the examples, in the same order, that a run never
interrupted trains on: for a reader, a file and their weighted mixture, read into datasets or
streamed, on both engines. Each process records the examples it trains on
(``tests/distributed/record_batches.py``)."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from lmctl.run import checkpoints
from tests.conftest import TINY_GPT2
from tests.distributed.conftest import RECORDER, kill_when, lmctl_command, records, run, start
from tests.test_sources import EXAMPLE, make_table

#: Three runs each (about a minute on a small CPU machine): the slow tier.
pytestmark = [pytest.mark.e2e, pytest.mark.slow]

BATCH = 4
MAX_STEPS = 12
SAVE_STEPS = 4

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


def _args(
    kind: str, engine: str, folder: Path, tokenizer: Path, out: Path, *extra: str
) -> list[str]:
    config = out.parent / f"{out.name}.yaml"
    config.write_text(yaml.safe_dump({"train_sources": _sources(kind, folder)}), encoding="utf-8")
    return lmctl_command(
        "train", "clm", "--config", config, *TINY_GPT2, "--tokenizer-name", tokenizer,
        "--block-size", "16", "--per-device-train-batch-size", str(BATCH), "--no-eval",
        "--max-steps", str(MAX_STEPS), "--save-steps", str(SAVE_STEPS), "--logging-steps", "1",
        "--engine", engine, "--import", str(RECORDER), "-o", out, *extra,
    )  # fmt: skip


def check_exact_resume(
    kind: str, engine: str, folder: Path, tokenizer: Path, tmp_path: Path, *extra: str
) -> tuple[str, Path]:
    """Train uninterrupted, then kill a second run after its first checkpoint and resume it:
    the resumed run trains on the examples the uninterrupted one trained on after that
    checkpoint, in the same order. Returns the resumed run's log and the checkpoint."""
    full, seen_full = tmp_path / "full", tmp_path / "seen-full"
    seen_full.mkdir()
    proc = run(_args(kind, engine, folder, tokenizer, full, *extra), tmp_path,
               {"LMCTL_RECORD_DIR": str(seen_full)})  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-4000:]
    reference = records(seen_full, 0)
    # Each pass of a stream may end on a short batch.
    assert MAX_STEPS * (BATCH - 1) < len(reference) <= MAX_STEPS * BATCH

    killed, seen_killed = tmp_path / "killed", tmp_path / "seen-killed"
    seen_killed.mkdir()
    slow = {"LMCTL_RECORD_DIR": str(seen_killed), "LMCTL_STEP_DELAY": "0.3"}
    proc = start(_args(kind, engine, folder, tokenizer, killed, *extra), tmp_path, slow)
    kill_when(proc, (killed / f"checkpoint-{SAVE_STEPS}").is_dir)
    latest = checkpoints.latest_checkpoint(killed)
    assert latest is not None
    step = checkpoints.checkpoint_step(latest)
    assert step < MAX_STEPS

    seen_resumed = tmp_path / "seen-resumed"
    seen_resumed.mkdir()
    resumed = run(lmctl_command("resume", killed), tmp_path,
                  {"LMCTL_RECORD_DIR": str(seen_resumed)})  # fmt: skip
    assert resumed.returncode == 0, resumed.stderr[-4000:]
    assert f"from {latest.name}" in resumed.stderr
    # The run trained on the examples before the checkpoint, the resumed run on the rest.
    rest = records(seen_resumed, 0)
    done = len(reference) - len(rest)
    assert step * (BATCH - 1) < done <= step * BATCH
    assert rest == reference[done:]
    assert records(seen_killed, 0)[:done] == reference[:done]
    return resumed.stderr, latest


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
    log, checkpoint = check_exact_resume(
        sources, engine, folder, bpe_tokenizer, tmp_path, "--streaming",
        "--shuffle-buffer-size", "8", "--mix-stopping-strategy", strategy,
    )  # fmt: skip
    assert ("reads the batches trained on before the checkpoint again" in log) == bool(repeating)
    # A mixture that repeats its sources records its counts, and no positions.
    position = json.loads((checkpoint / "stream_position.json").read_text())
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
