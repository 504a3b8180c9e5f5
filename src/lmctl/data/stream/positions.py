"""Where the training stream is, so that a resumed run reads on from there: each example's
position, the plan that a resumed reader seeks by (:class:`StreamPlan`) and the cursor that
the engine keeps in every checkpoint (:class:`StreamCursor`). The training stream shuffles
the examples of each shard in windows that a resumed reader can find again."""

from __future__ import annotations

import json
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass, replace
from itertools import islice
from pathlib import Path
from typing import Any

from lmctl.errors import ConfigError

#: The column that carries each training example's stream position (see
#: :class:`StreamPlan`); the training collator moves it from the examples to the batch.
POSITION_COLUMN = "lmctl_stream_position"
#: A point of a shard's reading order: the chunk that the reader starts again at with key
#: ``(piece, offset)`` (piece -1: the shard's start), and the tokens or examples of that chunk
#: consumed before the point.
ReadPoint = tuple[int, int, int]
START: ReadPoint = (-1, 0, 0)


@dataclass
class StreamPlan:
    """What the training stream's generator needs beyond its shard, shared with the engine
    that sets it before each pass: the pass (``epoch``) and, in the pass a run resumes in,
    where each shard read by each dataloader worker stopped.

    Every example of the training stream carries its position, ``[worker, shard, piece,
    offset, consumed, emitted]``: a point of the shard's reading order (see
    :data:`ReadPoint`) where a window of ``window`` examples begins, and how many of that
    window (in its shuffled order) come before the position. A resumed reader seeks there:
    it reads at most one chunk and one window again, however far into the stream the run
    was. It first yields one placeholder per example the shard had given before, so that
    ``datasets`` interleaves shards and the dataloader forms and interleaves batches exactly
    as in the uninterrupted run; the engine skips those batches without collating them.

    Positions gathered from every process of a run saved by another number of processes are
    kept per shard alone (worker :data:`MERGED`): whichever reader now holds a shard reads on
    from its position, with no placeholders (see :func:`merge_readers`).
    """

    seed: int
    #: Examples shuffled together (1: reading order).
    window: int
    #: Every shard of the source, to number them.
    shards: list[Any]
    #: Dataloader workers per process (0: the process itself reads).
    workers: int = 0
    #: The readers (processes x workers) that the files were cut into shards for.
    cut_for: int = 1
    epoch: int = 0
    #: The pass that ``resume`` belongs to; other passes read from the start.
    resume_epoch: int = -1
    #: (worker, shard) -> [examples given, *position after the last of them]
    resume: dict[tuple[int, int], list[int]] | None = None
    #: The names of a mixture's sources, whose shards are numbered ``(part, shard)``.
    parts: list[str] | None = None
    #: Whether checkpoints record positions that a resumed reader seeks to: a mixture that
    #: repeats the sources that run out reads a shard again inside one pass, which positions
    #: per pass cannot tell apart; it records its counts only, and a resumed run reads the
    #: consumed batches again.
    seeks: bool = True

    def __deepcopy__(self, memo: dict[int, Any]) -> StreamPlan:
        """The plan itself: the engine sets it for the stream's generators, and ``datasets``
        deep-copies the sources it interleaves (a mixture's), which would leave them a copy
        that a resume or a new pass never reaches. (Dataloader workers get a copy pickled
        when each pass starts, after the engine set it.)"""
        return self

    def seek(self, worker: int, shard: int) -> tuple[int, list[int] | None]:
        """Placeholders to yield first, and the position to read on from (None: the
        shard's start)."""
        resume = self.resume or {}
        if self.epoch != self.resume_epoch:
            return 0, None
        if (MERGED, shard) in resume:
            return 0, resume[(MERGED, shard)][1:]
        record = resume.get((worker, shard))
        return (0, None) if record is None else (record[0], record[1:])


#: The worker of a shard's position gathered from the processes of another world size: any
#: reader that holds the shard now goes on from it.
MERGED = -1


def merge_readers(records: list[dict[str, list[int]]]) -> dict[str, list[int]]:
    """The positions recorded by every process of a run, per shard alone (``"-1:<shard>"``).
    Processes read disjoint shards; a shard found in several records (positions gathered
    before, carried by every process) keeps the one that gave the most examples: the
    process that read on in it."""
    merged: dict[int, list[int]] = {}
    for readers in records:
        for key, record in readers.items():
            shard = int(key.split(":")[1])
            if shard not in merged or record[0] > merged[shard][0]:
                merged[shard] = [int(value) for value in record]
    return {f"{MERGED}:{shard}": merged[shard] for shard in sorted(merged)}


def check_split(shards: int, workers: int, processes: int, where: str) -> None:
    """Refuse a stream of ``shards`` recorded shards that ``processes`` processes of
    ``workers`` dataloader workers each cannot share evenly (``where``: the checkpoint)."""
    per_process = max(1, workers)
    if shards % (processes * per_process) == 0:
        return
    fits = [n for n in range(1, shards // per_process + 1) if shards % (n * per_process) == 0]
    raise ConfigError(
        f"{where}: its stream was read in {shards} shards, which {processes} processes of "
        f"{per_process} reader(s) each (--dataloader-num-workers) cannot share evenly",
        "resume on a number of processes that shares them: " + ", ".join(map(str, fits[:16])),
    )


#: A batch's stream mark: one row per (worker, shard) of its examples: the worker, the
#: shard, the examples of it in the batch and the position after the last of them.
MARK_WIDTH = 7


class StreamCursor:
    """This process's place in the training stream, for checkpoints: for each shard read by
    each dataloader worker, the examples it gave to training in this pass and the position
    after the last one (taken from each batch before the model sees it)."""

    def __init__(self, plan: StreamPlan) -> None:
        self.plan = plan
        self.readers: dict[tuple[int, int], list[int]] = {}
        #: Shard -> examples of it trained on in every pass so far (resumes included).
        self.trained: dict[int, int] = {}

    def begin_pass(self, epoch: int) -> None:
        """Called before the pass's dataloader iterator is made."""
        self.plan.epoch = epoch
        if epoch != self.plan.resume_epoch:
            self.plan.resume = None
            self.readers = {}

    @property
    def merged(self) -> bool:
        """Whether this pass goes on from positions gathered per shard (see ``MERGED``): no
        placeholders, so the engine skips no batches."""
        return any(worker == MERGED for worker, _ in self.plan.resume or {})

    def skipped(self, batches: int) -> int:
        """The batches of a resumed pass that are placeholders to skip."""
        return 0 if self.merged else batches

    def take(self, batch: Any) -> None:
        """Remove the mark from a training batch and remember its positions."""
        mark = batch.pop(POSITION_COLUMN, None) if hasattr(batch, "pop") else None
        if mark is None:
            return
        values = [int(value) for value in mark.flatten().tolist()]
        if values[0] < 0:
            raise RuntimeError("a placeholder batch of a resumed stream reached training")
        for begin in range(0, len(values), MARK_WIDTH):
            worker, shard, count, *position = values[begin : begin + MARK_WIDTH]
            worker = MERGED if self.merged else worker
            given = self.readers.get((worker, shard), [0])[0]
            self.readers[(worker, shard)] = [given + count, *position]
            self.trained[shard] = self.trained.get(shard, 0) + count

    def source_counts(self) -> dict[str, int]:
        """A mixture's examples trained on so far by this process, per source (empty for
        one source)."""
        names = self.plan.parts
        if not names:
            return {}
        counts = dict.fromkeys(names, 0)
        for shard, count in self.trained.items():
            counts[names[self.plan.shards[shard][0]]] += count
        return counts

    def state(self) -> dict[str, list[int]]:
        """JSON-ready: ``"<worker>:<shard>"`` -> [examples given, *position]."""
        return {
            f"{worker}:{shard}": list(value)
            for (worker, shard), value in sorted(self.readers.items())
        }

    def layout(self) -> dict[str, int]:
        """What positions only mean the same under: recorded with them, checked on resume."""
        plan = self.plan
        return {
            "workers": plan.workers,
            "window": plan.window,
            "shards": len(plan.shards),
            "readers": plan.cut_for,
        }

    def restore(
        self, epoch: int, readers: dict[str, list[int]], layout: dict[str, int] | None = None
    ) -> None:
        """Continue from recorded positions (in pass ``epoch``); refuses a stream laid out
        otherwise than the one they were recorded in."""
        _check_layout(layout or {}, self.layout())
        resume = {}
        for key, record in readers.items():
            worker, shard = (int(part) for part in key.split(":"))
            resume[(worker, shard)] = [int(value) for value in record]
        self.plan.resume_epoch, self.plan.resume = epoch, resume
        self.readers = {key: list(record) for key, record in resume.items()}


#: For each part of a stream's layout: the problem and the fix when a resume changes it.
_LAYOUT_CHANGES: dict[str, Callable[[int, int], tuple[str, str]]] = {
    "workers": lambda was, now: (
        f"the checkpoint's stream was read by {was} dataloader workers per process, this run "
        f"has {now}",
        f"resume with --dataloader-num-workers {was}",
    ),
    "window": lambda was, now: (
        f"the checkpoint's stream was shuffled in windows of {was} examples, this run's are {now}",
        f"resume with --shuffle-buffer-size {was if was > 1 else 0}",
    ),
    "shards": lambda was, now: (
        f"the training stream has {now} shards, the checkpoint's had {was}: the data or the "
        "number of processes changed",
        "resume with the same training data and processes, or start a new run",
    ),
}


def _check_layout(recorded: dict[str, int], current: dict[str, int]) -> None:
    for name, change in _LAYOUT_CHANGES.items():
        was, now = recorded.get(name, current[name]), current[name]
        if was != now:
            raise ConfigError(*change(was, now))


def stream_cursor(dataset: Any) -> StreamCursor | None:
    """The cursor of a training stream made by this module (None for any other data)."""
    plan = getattr(dataset, "lmctl_plan", None)
    return StreamCursor(plan) if isinstance(plan, StreamPlan) else None


def strip_positions(features: list[Any]) -> tuple[list[Any], list[int] | None, bool]:
    """A batch's examples without their positions, the batch's mark (see
    :data:`MARK_WIDTH`; None when the examples carry no positions) and whether the batch is
    placeholders of a resumed stream."""
    if not features or not isinstance(features[0], dict) or POSITION_COLUMN not in features[0]:
        return features, None, False
    if features[0][POSITION_COLUMN][0] < 0:
        return features, None, True
    readers: dict[tuple[int, int], list[int]] = {}
    clean = []
    for feature in features:
        worker, shard, *position = feature[POSITION_COLUMN]
        count = readers.get((worker, shard), [0])[0]
        readers[(worker, shard)] = [count + 1, *position]
        clean.append({key: value for key, value in feature.items() if key != POSITION_COLUMN})
    mark = [
        value for (worker, shard), record in readers.items() for value in (worker, shard, *record)
    ]
    return clean, mark, False


def _worker_id() -> int:
    from torch.utils.data import get_worker_info

    info = get_worker_info()
    return 0 if info is None else int(info.id)


def _window_order(
    seed: int, epoch: int, shard: Any, start: tuple[int, ...], size: int
) -> list[int]:
    import hashlib
    import random

    order = list(range(size))
    if size > 1:
        digest = hashlib.blake2b(f"{seed}:{epoch}:{shard!r}:{start}".encode(), digest_size=8)
        random.Random(int.from_bytes(digest.digest(), "little")).shuffle(order)
    return order


def positioned(
    shards: list[Any],
    plan: StreamPlan | None,
    examples_from: Callable[[Any, ReadPoint], Iterator[tuple[dict[str, Any], ReadPoint]]],
) -> Generator[dict[str, Any], None, None]:
    """The examples of ``shards`` (``examples_from(shard, point)`` reads a shard from a
    point, each example with the point after it); for a training stream shuffled in windows
    and marked with positions, from where the plan says this worker stopped."""
    if plan is None:
        for shard in shards:
            for example, _ in examples_from(shard, START):
                yield example
        return
    worker, epoch = _worker_id(), plan.epoch
    for shard in shards:
        number = plan.shards.index(shard)
        given, position = plan.seek(worker, number)
        for _ in range(given):
            yield {POSITION_COLUMN: [-1]}
        start: ReadPoint = START if position is None else (position[0], position[1], position[2])
        skip = 0 if position is None else position[3]
        examples = examples_from(shard, start)
        while window := list(islice(examples, max(1, plan.window))):
            order = _window_order(plan.seed, epoch, shard, start, len(window))
            end = window[-1][1]
            for emitted in range(skip, len(window)):
                example = window[order[emitted]][0]
                last = emitted + 1 == len(window)
                example[POSITION_COLUMN] = [
                    worker,
                    number,
                    *(end if last else start),
                    0 if last else emitted + 1,
                ]
                yield example
            start, skip = end, 0


STREAM_POSITION_FILE = "stream_position.json"


@dataclass
class StreamRecord:
    """One process's place in a training stream, as a checkpoint records it: the pass, the
    batches of it consumed, and for each shard read by each dataloader worker the examples
    given and the position (see :class:`lmctl.data.stream.positions.StreamPlan`; None in
    checkpoints written before positions were recorded, which resume by reading the consumed
    batches again)."""

    epoch: int
    batches: int
    readers: dict[str, list[int]] | None = None
    #: What the readers' positions depend on (see ``StreamCursor.layout``).
    layout: dict[str, int] | None = None
    #: Shard -> examples of it this process trained on over every pass (``"<shard>"`` keys).
    trained: dict[str, int] | None = None

    @classmethod
    def of(cls, epoch: int, batches: int, cursor: StreamCursor | None) -> StreamRecord:
        if cursor is None:
            return cls(epoch, batches)
        # At a pass's start (a save after the pass ended) no reader has given anything yet.
        trained = {str(shard): count for shard, count in sorted(cursor.trained.items())}
        if not cursor.plan.seeks:
            return cls(epoch, batches, trained=trained)
        return cls(epoch, batches, cursor.state() if batches else {}, cursor.layout(), trained)

    def continue_in(self, cursor: StreamCursor | None) -> None:
        """Make ``cursor`` count on from the recorded counts, and its stream seek to the
        recorded positions (if any were recorded)."""
        if cursor is None:
            return
        cursor.trained = {int(shard): count for shard, count in (self.trained or {}).items()}
        if self.readers is not None:
            cursor.restore(self.epoch, self.readers, self.layout)

    @property
    def merged(self) -> bool:
        """Whether the positions were gathered per shard (see :func:`merge_readers`)."""
        return any(key.startswith(f"{MERGED}:") for key in self.readers or {})

    def skipped(self) -> int:
        """The batches of the pass that a resumed reader yields as placeholders."""
        return 0 if self.merged else self.batches

    @classmethod
    def gather(cls, checkpoint: Path, rank: int, processes: int) -> StreamRecord | None:
        """The position that process ``rank`` of ``processes`` goes on from: its own record
        when the checkpoint was saved by as many processes, else the records of all of them
        merged per shard (the shard layout stays the one recorded)."""
        own = cls.read(checkpoint, rank)
        saved = len(list(checkpoint.glob("stream_position*.json")))
        if saved == processes and (own is None or not own.merged):
            return own
        records = [cls.read(checkpoint, index) for index in range(saved)]
        # Each process counts on from its own count; from another number of processes, the
        # first goes on from the sum of them all, so that the total holds.
        trained = dict((own and own.trained) or {}) if saved == processes else {}
        for record in records if rank == 0 and saved != processes else []:
            for shard, count in ((record and record.trained) or {}).items():
                trained[shard] = trained.get(shard, 0) + count
        if not records or any(r is None or r.readers is None for r in records):
            return None if own is None else replace(own, trained=trained)
        first = records[0]
        assert first is not None
        readers = merge_readers([r.readers for r in records if r is not None and r.readers])
        return cls(first.epoch, first.batches, readers, first.layout, trained)

    @staticmethod
    def file(checkpoint: Path, rank: int) -> Path:
        """Each process records its own position: ``stream_position.json`` for the first,
        ``stream_position-<rank>.json`` for the others."""
        return checkpoint / (STREAM_POSITION_FILE if rank == 0 else f"stream_position-{rank}.json")

    def write(self, checkpoint: Path, rank: int) -> None:
        record: dict[str, Any] = {"epoch": self.epoch, "batches": self.batches, "rank": rank}
        if self.readers is not None:
            record["readers"] = self.readers
        if self.layout is not None:
            record["layout"] = self.layout
        if self.trained:
            record["trained"] = self.trained
        self.file(checkpoint, rank).write_text(json.dumps(record) + "\n", encoding="utf-8")

    @classmethod
    def read(cls, checkpoint: Path, rank: int = 0) -> StreamRecord | None:
        try:
            data = json.loads(cls.file(checkpoint, rank).read_text(encoding="utf-8"))
            readers = data.get("readers")
            if readers is not None:
                readers = {str(key): [int(value) for value in row] for key, row in readers.items()}
            layout, trained = (
                None if data.get(name) is None else {str(k): int(v) for k, v in data[name].items()}
                for name in ("layout", "trained")
            )
            return cls(int(data["epoch"]), int(data["batches"]), readers, layout, trained)
        except (OSError, ValueError, KeyError, TypeError, AttributeError):
            return None


def recorded_layout(checkpoint: Path | None) -> dict[str, int]:
    """The training stream's layout that ``checkpoint`` recorded (empty: none): its shard
    count, and the readers its files were cut into shards for."""
    record = StreamRecord.read(checkpoint) if checkpoint is not None else None
    return {} if record is None or record.layout is None else record.layout
