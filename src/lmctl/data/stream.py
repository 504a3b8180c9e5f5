"""Streaming: read, tokenize and group data on the fly, in bounded memory, with every
distributed rank and every dataloader worker reading different shards.

A stream is ``IterableDataset.from_generator(generate, gen_kwargs={"shards": [...]})``. The
``datasets`` library splits that *list* of shards between ranks (``split_dataset_by_node``,
or the ``shard`` call accelerate makes when it prepares the dataloader) and then between the
dataloader workers of each rank, so no two readers ever open the same bytes. ``generate`` is
composed with :func:`functools.partial`: a reader with its paths, credentials and read options
bound (the shard left free), then the tokenize-and-group step with the tokenizer and block
size bound.

What is streamed: blocks of concatenated tokens (:func:`block_streams`), or one example per
line or record (:func:`example_streams`, for ``--line-by-line`` and multiple choice), each
tokenized by an encoder that the objective hands in: the same function that its prepared
(non-streaming) data goes through. A text source reads one text column; a record source
(``load_sources(records=True)``) reads whole records.

Shards:

* txt and JSON-lines files (local or any fsspec URL) are cut into byte ranges aligned to line
  boundaries — a line belongs to the range holding its first byte — so a single large file
  still feeds many readers. There are at least as many shards as ranks times dataloader workers.
* Hub datasets, csv, parquet and JSON-array files are read through ``datasets`` streaming;
  their shards are the files (or row groups) that ``datasets`` knows about.

Order and resume: the training stream shuffles its shard order each pass and the examples
of each shard in windows; every training example carries its position (:class:`StreamPlan`),
the engine keeps the last one of each shard and worker (:class:`StreamCursor`) in every
checkpoint, and a resumed reader seeks straight there.

Without a validation split, txt/JSON-lines data holds out the first
``--validation-split-percentage`` of its bytes for evaluation (as upstream holds out the first
records); Hub, csv and parquet streams need a validation split or ``--no-eval``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import islice, pairwise
from typing import TYPE_CHECKING, Any

from lmctl.data.load import parse_json_record, sample_limit
from lmctl.data.tokens import ENCODE_BATCH, BlockCutter, TextEncoder
from lmctl.errors import ConfigError, DataError
from lmctl.storage import hub
from lmctl.storage.paths import data_extension, has_glob, is_remote, matching_files

if TYPE_CHECKING:
    from datasets import IterableDataset
    from transformers import PreTrainedTokenizerBase

    from lmctl.config.base import TrainConfig
    from lmctl.console import Console

#: Target size of one byte-range shard: small enough to shuffle and balance well.
SHARD_BYTES = 64 << 20
#: Bytes read per call; texts are handed to the tokenizer in batches of this size or less.
READ_BYTES = 1 << 20
#: ``--train-tokenizer`` on a stream learns from this much of the start of the training data.
TOKENIZER_SAMPLE_BYTES = 100 << 20

LINE_FORMATS = ("txt", "jsonl", "json")


@dataclass(frozen=True)
class ByteRange:
    """Bytes ``start..stop`` of one file; it holds the lines that *begin* in that range."""

    path: str
    start: int
    stop: int


#: A shard of a line-oriented source: consecutive byte ranges, possibly over several files.
Shard = tuple[ByteRange, ...]


def _open(path: str, storage_options: dict[str, Any] | None) -> Any:
    import fsspec

    return fsspec.open(path, "rb", **(storage_options or {})).open()


def file_size(path: str, storage_options: dict[str, Any] | None = None) -> int:
    from fsspec.core import url_to_fs

    fs, inner = url_to_fs(path, **(storage_options or {}))
    return int(fs.size(inner))


def read_byte_range(
    piece: ByteRange, storage_options: dict[str, Any] | None = None
) -> Iterator[tuple[int, bytes]]:
    """Chunks of whole lines (each chunk ends with a newline, except at end of file) of the
    lines that begin inside ``piece``, each with the offset of its first byte: a line start,
    so reading again from there (``ByteRange(path, offset, stop)``) gives the same chunks."""
    with _open(piece.path, storage_options) as handle:
        position = piece.start
        if position > 0:
            # The line that straddles ``start`` belongs to the previous range.
            handle.seek(position - 1)
            position += len(handle.readline()) - 1
        while position < piece.stop:
            data = handle.read(min(READ_BYTES, piece.stop - position))
            if not data:
                return
            if not data.endswith(b"\n"):
                data += handle.readline()
            yield position, data
            position += len(data)


#: Where a reader can start again: the index of a piece of the shard (or 0) and an offset
#: into it (a byte offset of a line start, or a record count); None for the shard's start.
ChunkKey = tuple[int, int]


def _pieces_from(shard: Shard, start: ChunkKey | None) -> Iterator[tuple[int, ByteRange]]:
    """The pieces of ``shard`` from ``start`` on, the first one cut to begin there."""
    for index, piece in enumerate(shard):
        if start is not None and index < start[0]:
            continue
        if start is not None and index == start[0]:
            yield index, ByteRange(piece.path, start[1], piece.stop)
        else:
            yield index, piece


def _decode(data: bytes, piece: ByteRange) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{piece.path}: not UTF-8 text near byte {piece.start + exc.start}",
            "convert the file to UTF-8",
        ) from exc


def read_text_lines(
    shard: Shard,
    start: ChunkKey | None = None,
    *,
    keep_linebreaks: bool,
    storage_options: dict[str, Any] | None = None,
) -> Iterator[tuple[ChunkKey, list[str]]]:
    """The lines of a txt shard, split as the ``datasets`` text builder splits them, a chunk
    at a time with the key that reads again from that chunk (``start``)."""
    for index, piece in _pieces_from(shard, start):
        for offset, data in read_byte_range(piece, storage_options):
            yield (index, offset), _decode(data, piece).splitlines(keepends=keep_linebreaks)


def read_json_lines(
    shard: Shard,
    start: ChunkKey | None = None,
    *,
    column: str | None,
    storage_options: dict[str, Any] | None = None,
) -> Iterator[tuple[ChunkKey, list[Any]]]:
    """The ``column`` values of a JSON-lines shard (blank lines skipped, null read as ''), or
    with ``column`` None the records themselves; keyed as :func:`read_text_lines`."""
    for index, piece in _pieces_from(shard, start):
        for offset, data in read_byte_range(piece, storage_options):
            values: list[Any] = []
            for line in _decode(data, piece).splitlines():
                if not line.strip():
                    continue
                record = parse_json_record(
                    line, f"{piece.path} ({line[:80]!r})", require_object=column is None
                )
                if column is None:
                    values.append(record)
                    continue
                value = record.get(column) if isinstance(record, dict) else None
                values.append(value if isinstance(value, str) else "")
            yield (index, offset), values


def read_dataset_shard(
    index: int,
    start: ChunkKey | None = None,
    *,
    dataset: IterableDataset,
    num_shards: int,
    column: str | None,
) -> Iterator[tuple[ChunkKey, list[Any]]]:
    """The ``column`` texts of shard ``index`` of a ``datasets`` stream, or with ``column``
    None its records, keyed by the count of records before them. Starting again at a key
    skips that many records (``datasets`` reads them, nothing tokenizes them)."""
    part = dataset.shard(num_shards=num_shards, index=index, contiguous=True)
    done = 0 if start is None else start[1]
    if done:
        part = part.skip(done)
    for batch in part.iter(batch_size=ENCODE_BATCH):
        values: list[Any]
        if column is None:
            names = list(batch)
            values = [
                dict(zip(names, row, strict=True)) for row in zip(*batch.values(), strict=True)
            ]
        else:
            values = [text if isinstance(text, str) else "" for text in batch[column]]
        yield (0, done), values
        done += len(values)


@dataclass
class TextSource:
    """One split of raw data: its shards and a reader for one shard. A text source reads
    batches of texts; a record source (``columns`` set) batches of records (dicts)."""

    where: str
    shards: list[Any]
    #: ``read(shard, start=None)``: (key, batch) pairs of one shard, from ``start`` on.
    read: Callable[..., Iterator[tuple[ChunkKey, list[Any]]]]
    #: A record source's columns (as its first record has them); None for a text source.
    columns: list[str] | None = None

    def texts(
        self, limit_bytes: int = TOKENIZER_SAMPLE_BYTES, columns: list[str] | None = None
    ) -> Iterator[list[str]]:
        """Texts from the start of the source, about ``limit_bytes`` of them (of a record
        source: the text values of ``columns``)."""
        seen = 0
        for shard in self.shards:
            for _, batch in self.read(shard):
                values = batch
                if columns is not None:
                    values = [record.get(name) for record in batch for name in columns]
                kept = []
                for text in values:
                    if text and isinstance(text, str):
                        kept.append(text)
                        seen += len(text)
                    if seen >= limit_bytes:
                        yield kept
                        return
                yield kept


def readers_per_stream(config: TrainConfig) -> int:
    """Distributed ranks times dataloader workers: the fewest shards that keep everyone busy."""
    world = int(os.environ.get("WORLD_SIZE", "1") or 1)
    return max(1, world) * max(1, config.dataloader_num_workers)


def plan_shards(
    files: list[tuple[str, int]],
    window: tuple[int, int],
    readers: int,
    shard_bytes: int | None = None,
) -> list[Shard]:
    """Cut bytes ``window`` of the files laid end to end into equal shards.

    The count is a multiple of ``readers`` (at least one shard each) and shards are at most
    about ``shard_bytes``, so ranks and workers get equal shares however they split the list.
    """
    low, high = window
    length = high - low
    if length <= 0:
        return []
    count = max(readers, -(-length // (shard_bytes or SHARD_BYTES)))
    count = -(-count // readers) * readers
    edges = [low + length * index // count for index in range(count + 1)]
    offsets = []
    position = 0
    for path, size in files:
        offsets.append((path, position, position + size))
        position += size
    shards: list[Shard] = []
    for begin, end in pairwise(edges):
        pieces = [
            ByteRange(path, max(begin, first) - first, min(end, last) - first)
            for path, first, last in offsets
            if first < end and begin < last
        ]
        shards.append(tuple(piece for piece in pieces if piece.stop > piece.start))
    return shards


def expand(path: str) -> list[str]:
    """The files a data path names (a pattern such as ``data/*.txt`` names several)."""
    if not is_remote(path):
        return matching_files(path)
    if not has_glob(path):
        return [path]
    from fsspec.core import url_to_fs

    fs, inner = url_to_fs(path)
    return [fs.unstrip_protocol(match) for match in sorted(fs.glob(inner))]


def load_sources(
    config: TrainConfig,
    *,
    need_train: bool,
    need_eval: bool,
    text_options: dict[str, Any],
    records: bool = False,
) -> dict[str, TextSource]:
    """The ``train``/``validation`` sources of a streaming run, nothing read yet: text
    sources, or with ``records`` record sources (whole records, for objectives that read
    several columns)."""
    readers = readers_per_stream(config)
    paths = [path for path in (config.train_file, config.validation_file) if path is not None]
    if config.dataset_name is None and all(
        data_extension(path) in LINE_FORMATS and not _is_json_array(expand(path)) for path in paths
    ):
        return _line_sources(config, need_train, need_eval, text_options, readers, records=records)
    return _dataset_sources(config, need_train, need_eval, readers, records=records)


def _is_json_array(files: list[str]) -> bool:
    if not files or data_extension(files[0]) != "json":
        return False
    with _open(files[0], None) as handle:
        head = handle.read(4096).lstrip()
    return head.startswith(b"[")


def _line_sources(
    config: TrainConfig,
    need_train: bool,
    need_eval: bool,
    text_options: dict[str, Any],
    readers: int,
    *,
    records: bool,
) -> dict[str, TextSource]:
    splits: dict[str, tuple[str, tuple[float, float]]] = {}
    held_out = need_eval and config.validation_file is None
    if held_out and config.validation_split_percentage <= 0:
        raise ConfigError(
            "evaluation is on, there is no validation data and --validation-split-percentage is 0",
            "give --validation-file, a percentage above 0, or --no-eval",
        )
    cut = config.validation_split_percentage / 100 if held_out else 0.0
    if need_train:
        assert config.train_file is not None
        splits["train"] = (config.train_file, (cut, 1.0))
    if need_eval:
        if config.validation_file is not None:
            splits["validation"] = (config.validation_file, (0.0, 1.0))
        else:
            assert config.train_file is not None
            splits["validation"] = (config.train_file, (0.0, cut))
    sources = {}
    for split, (path, (low, high)) in splits.items():
        files = [(file, file_size(file)) for file in expand(path)]
        if not files:
            raise DataError(f"{path}: no file matches", "check the path or pattern")
        total = sum(size for _, size in files)
        window = (int(total * low), int(total * high))
        shards = plan_shards(files, window, readers)
        where = path if (low, high) == (0.0, 1.0) else f"{path} ({split} part)"
        if not shards:
            raise DataError(
                f"{where}: no records (the data is empty)",
                "give a file with at least one non-empty record",
            )
        names = [file for file, _ in files]
        if records:
            if data_extension(names[0]) == "txt":
                raise ConfigError(
                    f"{path}: records with columns are needed, not plain text",
                    "use a csv, json, jsonl or parquet file",
                )
            columns = list(_first_record(names)[2])
            reader = partial(read_json_lines, column=None)
            sources[split] = TextSource(where, shards, reader, columns)
        else:
            sources[split] = TextSource(where, shards, _line_reader(config, names, text_options))
    return sources


def _line_reader(
    config: TrainConfig, files: list[str], text_options: dict[str, Any]
) -> Callable[..., Iterator[tuple[ChunkKey, list[str]]]]:
    if data_extension(files[0]) == "txt":
        return partial(read_text_lines, keep_linebreaks=text_options.get("keep_linebreaks", True))
    path, _, record = _first_record(files)
    column = _pick_column(list(record), config.text_column, path, record)
    return partial(read_json_lines, column=column)


def _first_record(files: list[str]) -> tuple[str, int, dict[str, Any]]:
    """The first record of JSON-lines data: its file, line number and value."""
    path = next((file for file in files if file_size(file) > 0), files[0])
    with _open(path, None) as handle:
        for number, raw_line in enumerate(handle, 1):
            line = raw_line.decode("utf-8", errors="replace")
            if not line.strip():
                continue
            record = parse_json_record(line, f"{path}, line {number}")
            if not record:
                raise DataError(
                    f"{path}, line {number}: expected a JSON object with a text field",
                    'write one object per line, e.g. {"text": "..."}',
                )
            return path, number, record
    raise DataError(f"{path}: no records (the data is empty)", "give a non-empty file")


def _pick_column(
    columns: list[str], requested: str | None, where: str, example: dict[str, Any] | None
) -> str:
    if requested is not None:
        if requested not in columns:
            raise DataError(
                f"{where}: no column '{requested}' (columns: {', '.join(columns)})",
                "fix --text-column",
            )
        name = requested
    else:
        name = "text" if "text" in columns else columns[0]
    if example is not None and not isinstance(example.get(name), (str, type(None))):
        raise DataError(
            f"{where}: column '{name}' holds {type(example[name]).__name__}, not text "
            f"(columns: {', '.join(columns)})",
            "add a 'text' column or name the text column with --text-column",
        )
    return name


def _dataset_sources(
    config: TrainConfig, need_train: bool, need_eval: bool, readers: int, *, records: bool
) -> dict[str, TextSource]:
    """Sources read through ``datasets`` streaming: Hub datasets, csv, parquet, JSON arrays."""
    import datasets

    if config.dataset_name is not None:
        what = f"--dataset-name {config.dataset_name}"
        if not hub.offline_mode():
            hub.require_hub(what)
        args: tuple[Any, ...] = (config.dataset_name, config.dataset_config_name)
        kwargs: dict[str, Any] = {"token": config.token_value()}
    else:
        files = {}
        if config.train_file is not None:
            files["train"] = config.train_file
        if config.validation_file is not None:
            files["validation"] = config.validation_file
        what = ", ".join(files.values())
        extension = data_extension(next(iter(files.values())))
        args = ({"csv": "csv", "parquet": "parquet"}.get(extension, "json"),)
        kwargs = {"data_files": files}
    try:
        streams = datasets.load_dataset(*args, streaming=True, cache_dir=config.cache_dir, **kwargs)
    except Exception as exc:
        if hub.is_connection_error(exc):
            raise hub.unreachable(what) from exc
        raise DataError(f"{what}: could not open it as a stream ({exc})", "check the data") from exc
    wanted = (["train"] if need_train else []) + (["validation"] if need_eval else [])
    sources = {}
    for split in wanted:
        if split not in streams:
            hint = (
                "give --validation-file, or --no-eval"
                if split == "validation"
                else "give --train-file"
            )
            raise ConfigError(
                f"{what}: no '{split}' split to stream (a stream of this kind can't hold out "
                "a percentage)",
                hint,
            )
        stream = streams[split]
        if stream.num_shards < readers:
            stream = stream.reshard()
        where = f"{what} [{split}]"
        count = stream.num_shards
        if records:
            reader = partial(read_dataset_shard, dataset=stream, num_shards=count, column=None)
            columns = _stream_columns(stream, where)
            sources[split] = TextSource(where, list(range(count)), reader, columns)
            continue
        column = _stream_column(stream, config.text_column, where)
        reader = partial(read_dataset_shard, dataset=stream, num_shards=count, column=column)
        sources[split] = TextSource(where, list(range(count)), reader)
    return sources


def _stream_columns(stream: IterableDataset, where: str) -> list[str]:
    if stream.features is not None:
        return list(stream.features)
    for example in stream.take(1):
        return list(example)
    raise DataError(f"{where}: no records (the data is empty)", "give non-empty data")


def _stream_column(stream: IterableDataset, requested: str | None, where: str) -> str:
    if stream.features is not None:
        columns = list(stream.features)
        name = _pick_column(columns, requested, where, None)
        dtype = getattr(stream.features[name], "dtype", None)
        if dtype not in ("string", "large_string"):
            raise DataError(
                f"{where}: column '{name}' holds {dtype or 'structured data'}, not text "
                f"(columns: {', '.join(columns)})",
                "add a 'text' column or name the text column with --text-column",
            )
        return name
    for example in stream.take(1):
        return _pick_column(list(example), requested, where, example)
    raise DataError(f"{where}: no records (the data is empty)", "give non-empty data")


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
    """

    seed: int
    #: Examples shuffled together (1: reading order).
    window: int
    #: Every shard of the source, to number them.
    shards: list[Any]
    #: Dataloader workers per process (0: the process itself reads).
    workers: int = 0
    epoch: int = 0
    #: The pass that ``resume`` belongs to; other passes read from the start.
    resume_epoch: int = -1
    #: (worker, shard) -> [examples given, *position after the last of them]
    resume: dict[tuple[int, int], list[int]] | None = None

    def seek(self, worker: int, shard: int) -> tuple[int, list[int] | None]:
        """Placeholders to yield first, and the position to read on from (None: the
        shard's start)."""
        if self.resume is None or self.epoch != self.resume_epoch:
            return 0, None
        record = self.resume.get((worker, shard))
        if record is None:
            return 0, None
        return record[0], record[1:]


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

    def begin_pass(self, epoch: int) -> None:
        """Called before the pass's dataloader iterator is made."""
        self.plan.epoch = epoch
        if epoch != self.plan.resume_epoch:
            self.plan.resume = None
            self.readers = {}

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
            given = self.readers.get((worker, shard), [0])[0]
            self.readers[(worker, shard)] = [given + count, *position]

    def state(self) -> dict[str, list[int]]:
        """JSON-ready: ``"<worker>:<shard>"`` -> [examples given, *position]."""
        return {
            f"{worker}:{shard}": list(value)
            for (worker, shard), value in sorted(self.readers.items())
        }

    def layout(self) -> dict[str, int]:
        """What positions only mean the same under: recorded with them, checked on resume."""
        plan = self.plan
        return {"workers": plan.workers, "window": plan.window, "shards": len(plan.shards)}

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


def _positioned(
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


def _chunks_from(
    shard: Any, read: Callable[..., Iterator[tuple[ChunkKey, list[Any]]]], point: ReadPoint
) -> Iterator[tuple[ChunkKey, list[Any]]]:
    """Non-empty batches of at most ``ENCODE_BATCH`` texts or records of ``shard``, from the
    chunk of ``point`` on, each with its chunk's key."""
    piece, offset, _ = point
    for key, batch in read(shard, (piece, offset) if piece >= 0 else None):
        for begin in range(0, len(batch), ENCODE_BATCH):
            yield key, batch[begin : begin + ENCODE_BATCH]


def generate_blocks(
    shards: list[Any],
    plan: StreamPlan | None = None,
    *,
    read: Callable[..., Iterator[tuple[ChunkKey, list[str]]]],
    encoder: TextEncoder,
    block_size: int,
) -> Generator[dict[str, Any], None, None]:
    """Blocks of ``block_size`` tokens from the texts of ``shards``, read in order."""
    return _positioned(
        shards, plan, partial(_blocks_from, read=read, encoder=encoder, block_size=block_size)
    )


def _blocks_from(
    shard: Any,
    point: ReadPoint,
    *,
    read: Callable[..., Iterator[tuple[ChunkKey, list[str]]]],
    encoder: TextEncoder,
    block_size: int,
) -> Iterator[tuple[dict[str, Any], ReadPoint]]:
    """Blocks from ``point`` (a block's first token), each with the point of the next one."""
    from collections import deque

    from lmctl.data.tokens import Encoded

    keys: deque[ChunkKey] = deque()

    def texts() -> Iterator[list[str]]:
        for key, batch in _chunks_from(shard, read, point):
            keys.append(key)
            yield batch

    first, skip = point[:2], point[2]
    cutter = BlockCutter(block_size)
    #: The encoded batches not yet cut into blocks: (chunk key, first token's index in the
    #: stream, its index in the chunk, length).
    spans: deque[tuple[ChunkKey, int, int, int]] = deque()
    current, seen, fed, cut = None, 0, 0, 0
    for encoded in encoder.encode_stream(texts()):
        chunk, key = encoded, keys.popleft()
        if key != current:
            current, seen = key, 0
        offset, seen = seen, seen + len(chunk.ids)
        if key == first and offset < skip:
            drop = min(skip - offset, len(chunk.ids))
            mask = None if chunk.mask is None else chunk.mask[drop:]
            chunk, offset = Encoded(chunk.ids[drop:], mask), offset + drop
        if not len(chunk.ids):
            continue
        spans.append((key, fed, offset, len(chunk.ids)))
        fed += len(chunk.ids)
        blocks = cutter.feed(chunk)
        if blocks is None:
            continue
        for row in range(len(blocks.ids)):
            example = {"input_ids": blocks.ids[row].tolist()}
            if blocks.mask is not None:
                example["special_tokens_mask"] = blocks.mask[row].tolist()
            cut += block_size
            while spans[0][1] + spans[0][3] < cut:
                spans.popleft()
            where, begins, at, _ = spans[0]
            yield example, (*where, at + cut - begins)


#: Turns a batch read from a source (texts or records) into model-ready columns; the
#: number of examples out may differ from the number in (blank lines are dropped).
Encoder = Callable[[list[Any]], dict[str, list[Any]]]


def generate_examples(
    shards: list[Any],
    plan: StreamPlan | None = None,
    *,
    read: Callable[..., Iterator[tuple[ChunkKey, list[Any]]]],
    encode: Encoder,
) -> Generator[dict[str, Any], None, None]:
    """One example per record (or line) of ``shards``, tokenized by ``encode``, in order."""
    return _positioned(shards, plan, partial(_examples_from, read=read, encode=encode))


def _examples_from(
    shard: Any,
    point: ReadPoint,
    *,
    read: Callable[..., Iterator[tuple[ChunkKey, list[Any]]]],
    encode: Encoder,
) -> Iterator[tuple[dict[str, Any], ReadPoint]]:
    """Examples from ``point``, each with the point after it."""
    first, skip = point[:2], point[2]
    current, seen = None, 0
    for key, batch in _chunks_from(shard, read, point):
        if key != current:
            current, seen = key, 0
        encoded = encode(batch)
        names = list(encoded)
        for row in range(len(encoded[names[0]]) if names else 0):
            seen += 1
            if key == first and seen <= skip:
                continue
            yield {name: encoded[name][row] for name in names}, (*key, seen)


def block_streams(
    config: TrainConfig,
    sources: dict[str, TextSource],
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    console: Console,
    *,
    special_tokens_mask: bool = False,
) -> dict[str, IterableDataset]:
    """Streams of ``block_size`` blocks (the streaming side of ``tokenize_and_group``)."""
    from lmctl.data.tokens import block_features

    encoder = TextEncoder(tokenizer, special_tokens_mask=special_tokens_mask)
    features = block_features(block_size, special_tokens_mask)
    streams = {}
    for split, source in sources.items():
        generate = partial(
            generate_blocks, read=source.read, encoder=encoder, block_size=block_size
        )
        if not _yields_anything(generate, source):
            raise DataError(
                f"{source.where}: too few tokens for one block of {block_size}",
                "use a smaller --block-size/--max-seq-length, or more data",
            )
        streams[split] = _stream(config, split, generate, source, features)
        console.info(
            f"{split}: streaming {source.where} in {len(source.shards)} shards, "
            f"blocks of {block_size} tokens"
        )
    return streams


def example_streams(
    config: TrainConfig,
    sources: dict[str, TextSource],
    encoders: dict[str, Encoder],
    console: Console,
    *,
    unit: str,
) -> dict[str, IterableDataset]:
    """Streams of one example per line or record (the streaming side of line-by-line and
    of multiple choice), each split tokenized by its encoder; ``unit`` names what an example
    is, for messages ('line', 'record')."""
    streams = {}
    for split, source in sources.items():
        generate = partial(generate_examples, read=source.read, encode=encoders[split])
        if not _yields_anything(generate, source):
            raise DataError(
                f"{source.where}: no non-empty {unit}s", f"give data with at least one {unit}"
            )
        streams[split] = _stream(config, split, generate, source, None)
        console.info(
            f"{split}: streaming {source.where} in {len(source.shards)} shards, one example "
            f"per {unit}"
        )
    return streams


def _yields_anything(
    generate: Callable[..., Generator[Any, None, None]], source: TextSource
) -> bool:
    """Read just far enough to find the first example, so that data too small to give one
    fails before training starts."""
    examples = generate(source.shards)
    try:
        return next(examples, None) is not None
    finally:
        examples.close()


def _stream(
    config: TrainConfig, split: str, generate: Any, source: TextSource, features: Any
) -> IterableDataset:
    """The split's stream. The training stream shuffles its shard order each pass (with
    ``--seed``) and its examples in windows of ``--shuffle-buffer-size`` inside each reader,
    and carries positions (see :class:`StreamPlan`); then limits apply."""
    from datasets import IterableDataset, List, Value

    plan = None
    if split == "train":
        window = max(1, config.shuffle_buffer_size)
        plan = StreamPlan(config.seed, window, source.shards, config.dataloader_num_workers)
        if features is not None:
            features = features.copy()
            features[POSITION_COLUMN] = List(Value("int64"))
    stream = IterableDataset.from_generator(
        generate, features=features, gen_kwargs={"shards": source.shards, "plan": plan}
    )
    if plan is not None and config.shuffle_buffer_size > 0:
        # The shard order only: a buffer of one example keeps the reading order, which the
        # generator shuffles in windows it can find again on resume.
        stream = stream.shuffle(seed=config.seed, buffer_size=1)
    limit = sample_limit(config, split)
    if limit is not None:
        stream = stream.take(limit)
    stream.lmctl_plan = plan
    return stream
