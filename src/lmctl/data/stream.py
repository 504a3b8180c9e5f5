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

Without a validation split, txt/JSON-lines data holds out the first
``--validation-split-percentage`` of its bytes for evaluation (as upstream holds out the first
records); Hub, csv and parquet streams need a validation split or ``--no-eval``.
"""

from __future__ import annotations

import os
from collections.abc import Callable, Generator, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import pairwise
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
) -> Iterator[bytes]:
    """Chunks of whole lines (each chunk ends with a newline, except at end of file) of the
    lines that begin inside ``piece``."""
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
            position += len(data)
            yield data


def _decode(data: bytes, piece: ByteRange) -> str:
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise DataError(
            f"{piece.path}: not UTF-8 text near byte {piece.start + exc.start}",
            "convert the file to UTF-8",
        ) from exc


def read_text_lines(
    shard: Shard, *, keep_linebreaks: bool, storage_options: dict[str, Any] | None = None
) -> Iterator[list[str]]:
    """The lines of a txt shard, split as the ``datasets`` text builder splits them."""
    for piece in shard:
        for data in read_byte_range(piece, storage_options):
            yield _decode(data, piece).splitlines(keepends=keep_linebreaks)


def read_json_lines(
    shard: Shard, *, column: str | None, storage_options: dict[str, Any] | None = None
) -> Iterator[list[Any]]:
    """The ``column`` values of a JSON-lines shard (blank lines skipped, null read as ''), or
    with ``column`` None the records themselves."""
    for piece in shard:
        for data in read_byte_range(piece, storage_options):
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
            yield values


def read_dataset_shard(
    index: int, *, dataset: IterableDataset, num_shards: int, column: str | None
) -> Iterator[list[Any]]:
    """The ``column`` texts of shard ``index`` of a ``datasets`` stream, or with ``column``
    None its records."""
    part = dataset.shard(num_shards=num_shards, index=index, contiguous=True)
    for batch in part.iter(batch_size=ENCODE_BATCH):
        if column is None:
            names = list(batch)
            yield [dict(zip(names, row, strict=True)) for row in zip(*batch.values(), strict=True)]
        else:
            yield [text if isinstance(text, str) else "" for text in batch[column]]


@dataclass
class TextSource:
    """One split of raw data: its shards and a reader for one shard. A text source reads
    batches of texts; a record source (``columns`` set) batches of records (dicts)."""

    where: str
    shards: list[Any]
    read: Callable[[Any], Iterator[list[Any]]]
    #: A record source's columns (as its first record has them); None for a text source.
    columns: list[str] | None = None

    def texts(
        self, limit_bytes: int = TOKENIZER_SAMPLE_BYTES, columns: list[str] | None = None
    ) -> Iterator[list[str]]:
        """Texts from the start of the source, about ``limit_bytes`` of them (of a record
        source: the text values of ``columns``)."""
        seen = 0
        for shard in self.shards:
            for batch in self.read(shard):
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
) -> Callable[[Any], Iterator[list[str]]]:
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


def generate_blocks(
    shards: list[Any],
    *,
    read: Callable[[Any], Iterator[list[str]]],
    encoder: TextEncoder,
    block_size: int,
) -> Generator[dict[str, Any], None, None]:
    """Blocks of ``block_size`` tokens from the texts of ``shards``, read in order."""
    cutter = BlockCutter(block_size)
    batches = (batch for shard in shards for batch in _rebatch(read(shard)))
    for chunk in encoder.encode_stream(batches):
        blocks = cutter.feed(chunk)
        if blocks is None:
            continue
        for row in range(len(blocks.ids)):
            example = {"input_ids": blocks.ids[row].tolist()}
            if blocks.mask is not None:
                example["special_tokens_mask"] = blocks.mask[row].tolist()
            yield example


#: Turns a batch read from a source (texts or records) into model-ready columns; the
#: number of examples out may differ from the number in (blank lines are dropped).
Encoder = Callable[[list[Any]], dict[str, list[Any]]]


def generate_examples(
    shards: list[Any],
    *,
    read: Callable[[Any], Iterator[list[Any]]],
    encode: Encoder,
) -> Generator[dict[str, Any], None, None]:
    """One example per record (or line) of ``shards``, tokenized by ``encode``, in order."""
    for shard in shards:
        for batch in _rebatch(read(shard)):
            encoded = encode(batch)
            keys = list(encoded)
            for row in range(len(encoded[keys[0]]) if keys else 0):
                yield {key: encoded[key][row] for key in keys}


def _rebatch(batches: Iterator[list[Any]], size: int = ENCODE_BATCH) -> Iterator[list[Any]]:
    """At most ``size`` texts per batch, so memory stays bounded whatever the line length."""
    for batch in batches:
        for start in range(0, len(batch), size):
            yield batch[start : start + size]


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
        streams[split] = _finish(config, split, _from_generator(generate, source, features))
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
        streams[split] = _finish(config, split, _from_generator(generate, source, None))
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


def _from_generator(generate: Any, source: TextSource, features: Any) -> IterableDataset:
    from datasets import IterableDataset

    return IterableDataset.from_generator(
        generate, features=features, gen_kwargs={"shards": source.shards}
    )


def _finish(config: TrainConfig, split: str, stream: IterableDataset) -> IterableDataset:
    """Shuffle the training stream (shard order and a buffer of examples) and apply limits."""
    if split == "train" and config.shuffle_buffer_size > 0:
        stream = stream.shuffle(seed=config.seed, buffer_size=config.shuffle_buffer_size)
    limit = sample_limit(config, split)
    return stream if limit is None else stream.take(limit)
