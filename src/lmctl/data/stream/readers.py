"""Reading the shards of a stream, each batch with a key to start again from. txt and
JSON-lines files (local or any fsspec URL) are cut into byte ranges on line boundaries (a line
belongs to the range holding its first byte), at least one per reader, so that a single large
file still feeds many readers. Hub datasets, csv, parquet and JSON arrays are read through
``datasets`` streaming; their shards are the files (or row groups) that ``datasets`` knows."""

from __future__ import annotations

import os
from collections.abc import Iterator
from dataclasses import dataclass
from itertools import pairwise
from typing import TYPE_CHECKING, Any

from lmctl.data.load import parse_json_record
from lmctl.data.tokens import ENCODE_BATCH
from lmctl.errors import DataError
from lmctl.storage.paths import has_glob, is_remote, matching_files

if TYPE_CHECKING:
    from datasets import IterableDataset

#: Target size of one byte-range shard: small enough to shuffle and balance well.
SHARD_BYTES = 64 << 20
#: Data of at least ``MIN_SHARDS`` times ``MIN_SHARD_BYTES`` is cut into at least
#: ``MIN_SHARDS`` shards, so that a run can later go on with more processes (which must share
#: the shards the run started with evenly, see ``positions.check_split``).
MIN_SHARDS = 8
MIN_SHARD_BYTES = 1 << 20
#: Bytes read per call; texts are handed to the tokenizer in batches of this size or less.
READ_BYTES = 1 << 20


@dataclass(frozen=True)
class ByteRange:
    """Bytes ``start..stop`` of one file; it holds the lines that *begin* in that range."""

    path: str
    start: int
    stop: int


#: A shard of a line-oriented source: consecutive byte ranges, possibly over several files.
Shard = tuple[ByteRange, ...]


def open_file(path: str, storage_options: dict[str, Any] | None) -> Any:
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
    with open_file(piece.path, storage_options) as handle:
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


def plan_shards(
    files: list[tuple[str, int]],
    window: tuple[int, int],
    readers: int,
    shard_bytes: int | None = None,
    count: int | None = None,
) -> list[Shard]:
    """Cut bytes ``window`` of the files laid end to end into equal shards.

    The count is a multiple of ``readers`` (at least one shard each), at least
    :data:`MIN_SHARDS` of data large enough, and shards are at most about ``shard_bytes``, so
    ranks and workers get equal shares however they split the list. ``count``: exactly so
    many (the shards that a resumed run's checkpoint recorded).
    """
    low, high = window
    length = high - low
    if length <= 0:
        return []
    if count is None:
        least = MIN_SHARDS if length >= MIN_SHARDS * MIN_SHARD_BYTES else 1
        count = max(readers, least, -(-length // (shard_bytes or SHARD_BYTES)))
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
    """The files a data path names (a pattern such as ``data/*.txt`` names several); local
    files by their absolute paths, which a stream's shards (and their shuffled orders) are
    keyed by: a resumed run reads its config with the paths made absolute."""
    if not is_remote(path):
        return [os.path.abspath(file) for file in matching_files(path)]
    if not has_glob(path):
        return [path]
    from fsspec.core import url_to_fs

    fs, inner = url_to_fs(path)
    return [fs.unstrip_protocol(match) for match in sorted(fs.glob(inner))]
