"""A stream saved by N processes goes on with M: the positions of every process are gathered
per shard, each shard goes on from its position wherever it is read now, and shards that
the new readers cannot share evenly are refused."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
import torch

from lmctl.config.loader import build_config
from lmctl.config.slices import Access, DataSpec, take
from lmctl.data.stream import readers
from lmctl.data.stream.mixture import MixedSource, stream_named_sources
from lmctl.data.stream.positions import (
    POSITION_COLUMN,
    ReadPoint,
    StreamCursor,
    StreamPlan,
    StreamRecord,
    check_split,
    merge_readers,
    positioned,
    strip_positions,
)
from lmctl.data.stream.sources import Readers
from lmctl.errors import ConfigError
from lmctl.objectives.clm import ClmConfig

SHARDS, PER_SHARD, WINDOW = 8, 11, 3


def _examples(shard: int, point: ReadPoint) -> Iterator[tuple[dict[str, Any], ReadPoint]]:
    first = 0 if point[0] < 0 else point[1]
    for index in range(first, PER_SHARD):
        yield {"id": shard * 100 + index}, (0, index + 1, 0)


def _read(
    world: int, rank: int, plan: StreamPlan, cursor: StreamCursor, limit: int | None
) -> list[int]:
    """What one rank reads of its shares (every ``world``-th shard), in batches of 2 that
    its cursor takes; ``limit``: stop after so many examples (None: to the end)."""
    stream = positioned(list(range(SHARDS))[rank::world], plan, _examples)
    seen: list[int] = []
    while limit is None or len(seen) < limit:
        batch = [example for _, example in zip(range(2), stream, strict=False)]
        if not batch:
            break
        clean, mark, placeholders = strip_positions(batch)
        assert not placeholders and mark is not None
        cursor.take({POSITION_COLUMN: torch.tensor([mark])})
        seen.extend(example["id"] for example in clean)
    return seen


def _plan() -> StreamPlan:
    return StreamPlan(seed=3, window=WINDOW, shards=list(range(SHARDS)))


@pytest.mark.parametrize(("saved", "resumed"), [(2, 1), (1, 2), (2, 4), (4, 2)])
def test_positions_of_every_rank_go_on_with_another_number(
    tmp_path: Path, saved: int, resumed: int
) -> None:
    read: list[int] = []
    for rank in range(saved):
        plan = _plan()
        cursor = StreamCursor(plan)
        read += _read(saved, rank, plan, cursor, limit=14 + 6 * rank)
        StreamRecord.of(0, 7, cursor).write(tmp_path, rank)
    for rank in range(resumed):
        record = StreamRecord.gather(tmp_path, rank, resumed)
        assert record is not None and record.merged and record.skipped() == 0
        plan = _plan()
        cursor = StreamCursor(plan)
        record.continue_in(cursor)
        cursor.begin_pass(0)
        read += _read(resumed, rank, plan, cursor, limit=None)
    # Nothing read twice, nothing skipped.
    assert sorted(read) == [shard * 100 + n for shard in range(SHARDS) for n in range(PER_SHARD)]


def test_a_second_resume_in_the_pass_gathers_again(tmp_path: Path) -> None:
    """After a change of world, every process carries every shard's position; the one that
    read on in a shard has given more of it, and wins when they are gathered again."""
    first = {"-1:0": [4, 0, 4, 0, 0], "-1:1": [2, 0, 2, 0, 0]}
    second = {"-1:0": [2, 0, 2, 0, 0], "-1:1": [6, 0, 6, 0, 0]}
    assert merge_readers([first, second]) == {"-1:0": first["-1:0"], "-1:1": second["-1:1"]}
    for rank, readers_ in enumerate((first, second)):
        StreamRecord(0, 3, readers_, {"workers": 0, "window": 1, "shards": 2}).write(tmp_path, rank)
    record = StreamRecord.gather(tmp_path, 0, 2)  # the same world: gathered all the same
    assert record is not None and record.readers == merge_readers([first, second])


def test_the_same_number_of_processes_reads_its_own_record(tmp_path: Path) -> None:
    own = StreamRecord(0, 3, {"1:2": [5, 0, 9, 0, 1]}, {"workers": 2, "window": 1, "shards": 4})
    own.write(tmp_path, 1)
    StreamRecord(0, 3, {"0:1": [5, 0, 9, 0, 1]}, own.layout).write(tmp_path, 0)
    record = StreamRecord.gather(tmp_path, 1, 2)
    assert record == own and not record.merged and record.skipped() == 3


def test_shards_that_do_not_split_evenly_are_refused() -> None:
    check_split(8, 0, 4, "checkpoint-4")
    check_split(8, 2, 2, "checkpoint-4")
    with pytest.raises(ConfigError) as caught:
        check_split(8, 2, 3, "checkpoint-4")
    assert "8 shards" in str(caught.value)
    assert caught.value.hint is not None and caught.value.hint.endswith(": 1, 2, 4")


def test_large_data_is_cut_into_several_shards_and_a_recorded_count_is_kept() -> None:
    files = [("big.txt", 9 << 20)]
    assert len(readers.plan_shards(files, (0, 9 << 20), readers=1)) == readers.MIN_SHARDS
    assert len(readers.plan_shards(files, (0, 9 << 20), readers=3)) == 9
    assert len(readers.plan_shards([("small.txt", 5000)], (0, 5000), readers=2)) == 2
    assert len(readers.plan_shards([("mid.txt", 3 << 20)], (0, 3 << 20), readers=1)) == 1
    assert len(readers.plan_shards(files, (0, 9 << 20), readers=2, count=2)) == 2


def test_a_mixture_counts_the_examples_of_each_source_over_passes_and_worlds(
    tmp_path: Path,
) -> None:
    """A streamed mixture's shards are numbered ``(source, shard)``: each process counts the
    examples of each source it trained on, over every pass; a checkpoint keeps the counts,
    each process goes on from its own, and from another number of processes the first goes
    on from their sum."""
    shards = [(0, 0), (0, 1), (1, 0), (1, 1)]

    def cursor_of() -> StreamCursor:
        return StreamCursor(StreamPlan(seed=3, window=1, shards=shards, parts=["web", "code"]))

    def take(cursor: StreamCursor, shard: int, count: int) -> None:
        cursor.take({POSITION_COLUMN: torch.tensor([[0, shard, count, 0, count, 0, 0]])})

    ranks = [cursor_of(), cursor_of()]
    take(ranks[0], 0, 5)
    take(ranks[0], 2, 2)
    take(ranks[1], 1, 3)
    take(ranks[1], 3, 4)
    ranks[0].begin_pass(1)  # a new pass starts its positions again, not its counts
    take(ranks[0], 0, 1)
    assert ranks[0].source_counts() == {"web": 6, "code": 2}
    assert ranks[1].source_counts() == {"web": 3, "code": 4}
    for rank, cursor in enumerate(ranks):
        StreamRecord.of(1, 3, cursor).write(tmp_path, rank)
    for rank, cursor in enumerate(ranks):
        again = cursor_of()
        record = StreamRecord.gather(tmp_path, rank, 2)
        assert record is not None
        record.continue_in(again)
        assert again.source_counts() == cursor.source_counts()
    total, none = {"web": 9, "code": 6}, {"web": 0, "code": 0}
    for rank, processes, expected in ((0, 1, total), (0, 4, total), (3, 4, none)):
        elsewhere = cursor_of()
        record = StreamRecord.gather(tmp_path, rank, processes)
        assert record is not None
        record.continue_in(elsewhere)
        assert elsewhere.source_counts() == expected
    assert StreamCursor(_plan()).source_counts() == {}


def test_a_mixture_resumed_on_other_readers_cuts_its_files_as_before(tmp_path: Path) -> None:
    """Each file of a streamed mixture is cut into shards for the readers that read it; a
    run going on with other readers cuts every file as the checkpoint's readers had it, so
    that every recorded position finds its shard (the checkpoint records the shard count of
    the whole mixture, not of each source)."""
    for name in ("web", "code"):
        (tmp_path / f"{name}.txt").write_text("".join(f"{name} {n}\n" for n in range(500)))
    sources = [{"name": name, "file": str(tmp_path / f"{name}.txt")} for name in ("web", "code")]
    config = build_config(
        ClmConfig,
        cli_values={"train_sources": sources, "model_type": "gpt2", "tokenizer_name": "t",
                    "streaming": True, "max_steps": 1, "do_eval": False},
    )  # fmt: skip

    def shards(readers_: Readers) -> list[list[Any]]:
        splits = stream_named_sources(
            take(DataSpec, config), take(Access, config), readers_,
            need_train=True, need_eval=False, text_options={},
        )  # fmt: skip
        mixed = splits["train"]
        assert isinstance(mixed, MixedSource)
        return [part.shards for part in mixed.parts]

    saved = shards(Readers(2, 2))
    assert [len(part) for part in saved] == [4, 4]
    assert [len(part) for part in shards(Readers(1, 2))] == [2, 2]
    assert shards(Readers(1, 2, shards=8, cut_for=4)) == saved
    assert shards(Readers(4, 2, shards=8, cut_for=4)) == saved


def test_a_local_file_is_read_by_its_absolute_path(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """A stream's shards, and the order each is shuffled in, are keyed by the file's path: a
    run given a relative path and its resume (whose config holds it absolute) read the same."""
    (tmp_path / "a.txt").write_text("one\n")
    monkeypatch.chdir(tmp_path)
    assert (
        readers.expand("a.txt")
        == readers.expand(str(tmp_path / "a.txt"))
        == [str(tmp_path / "a.txt")]
    )
