"""The sources of a streaming run: each split's shards and a reader for them, nothing read
yet, and the validation part held out of txt/JSON-lines training data without a validation
split (the first ``--validation-split-percentage`` of its bytes, as upstream holds out the first
records); Hub, csv and parquet streams need a validation split or ``--no-eval``."""

from __future__ import annotations

from collections.abc import Callable, Iterator
from dataclasses import dataclass
from functools import partial
from itertools import islice
from typing import TYPE_CHECKING, Any

from lmctl.data.load import choose_column, data_files, not_text, parse_json_record, require_hold_out
from lmctl.data.sources import Reader, read_shards
from lmctl.data.stream.readers import (
    ChunkKey,
    expand,
    file_size,
    open_file,
    plan_shards,
    read_dataset_shard,
    read_json_lines,
    read_text_lines,
)
from lmctl.data.tokens import ENCODE_BATCH
from lmctl.errors import ConfigError, DataError
from lmctl.storage import hub
from lmctl.storage.paths import data_extension

if TYPE_CHECKING:
    from datasets import IterableDataset

    from lmctl.config.slices import Access, DataSpec

#: ``--train-tokenizer`` on a stream learns from this much of the start of the training data.
TOKENIZER_SAMPLE_BYTES = 100 << 20

LINE_FORMATS = ("txt", "jsonl", "json")


@dataclass(frozen=True)
class Readers:
    """Who reads a stream at once: the run's processes, each with ``workers`` dataloader
    workers (0: the process itself reads)."""

    processes: int
    workers: int
    #: The training stream's shard count that the checkpoint a run resumes from recorded
    #: (None: planned for these readers); kept when the number of processes changes.
    shards: int | None = None
    #: The readers that the checkpoint's training files were cut into shards for (None:
    #: these): a resumed run cuts each file of a mixture as the run it goes on from did.
    cut_for: int | None = None

    @property
    def count(self) -> int:
        """The fewest shards that keep every reader busy."""
        return max(1, self.processes) * max(1, self.workers)


@dataclass
class TextSource:
    """One split of raw data: its shards, cut for ``readers``, and a reader for one shard.
        A text source reads batches of texts; a record source (``columns`` set) batches of
        records (dicts). A reader of ``train_sources``/``validation_sources`` is one too
    (:func:`reader_source`)."""

    where: str
    shards: list[Any]
    readers: Readers
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


def load_sources(
    data: DataSpec,
    access: Access,
    readers: Readers,
    *,
    need_train: bool,
    need_eval: bool,
    text_options: dict[str, Any],
    records: bool = False,
) -> dict[str, TextSource]:
    """The ``train``/``validation`` sources of a streaming run, nothing read yet: text
    sources, or with ``records`` record sources (whole records, for objectives that read
    several columns)."""
    paths = data_files(data).values()
    if data.dataset_name is None and all(
        data_extension(path) in LINE_FORMATS and not _is_json_array(expand(path)) for path in paths
    ):
        return _line_sources(data, need_train, need_eval, text_options, readers, records=records)
    return _dataset_sources(data, access, need_train, need_eval, readers, records=records)


def _is_json_array(files: list[str]) -> bool:
    if not files or data_extension(files[0]) != "json":
        return False
    with open_file(files[0], None) as handle:
        head = handle.read(4096).lstrip()
    return head.startswith(b"[")


def _line_sources(
    data: DataSpec,
    need_train: bool,
    need_eval: bool,
    text_options: dict[str, Any],
    readers: Readers,
    *,
    records: bool,
) -> dict[str, TextSource]:
    held_out = need_eval and data.validation_file is None
    if held_out:
        require_hold_out(data.validation_split_percentage)
    cut = data.validation_split_percentage / 100 if held_out else 0.0
    splits: dict[str, tuple[Any, tuple[float, float]]] = {}
    if need_train:
        splits["train"] = (data.train_file, (cut, 1.0))
    if need_eval:
        whole = (data.validation_file, (0.0, 1.0))
        splits["validation"] = (data.train_file, (0.0, cut)) if held_out else whole
    sources = {}
    for split, (path, (low, high)) in splits.items():
        files = [(file, file_size(file)) for file in expand(path)]
        if not files:
            raise DataError(f"{path}: no file matches", "check the path or pattern")
        total = sum(size for _, size in files)
        window = (int(total * low), int(total * high))
        recorded, cut_for = (readers.shards, readers.cut_for) if split == "train" else (None, None)
        shards = plan_shards(files, window, cut_for or readers.count, count=recorded)
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
            sources[split] = TextSource(where, shards, readers, reader, columns)
        else:
            lines = _line_reader(data.text_column, names, text_options)
            sources[split] = TextSource(where, shards, readers, lines)
    return sources


def _line_reader(
    requested: str | None, files: list[str], text_options: dict[str, Any]
) -> Callable[..., Iterator[tuple[ChunkKey, list[str]]]]:
    if data_extension(files[0]) == "txt":
        return partial(read_text_lines, keep_linebreaks=text_options.get("keep_linebreaks", True))
    path, _, record = _first_record(files)
    column = _pick_column(list(record), requested, path, record)
    return partial(read_json_lines, column=column)


def _first_record(files: list[str]) -> tuple[str, int, dict[str, Any]]:
    """The first record of JSON-lines data: its file, line number and value."""
    path = next((file for file in files if file_size(file) > 0), files[0])
    with open_file(path, None) as handle:
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
    name = choose_column(columns, requested, where)
    if example is not None and not isinstance(example.get(name), (str, type(None))):
        raise not_text(where, name, type(example[name]).__name__, columns)
    return name


def _dataset_sources(
    data: DataSpec,
    access: Access,
    need_train: bool,
    need_eval: bool,
    readers: Readers,
    *,
    records: bool,
) -> dict[str, TextSource]:
    """Sources read through ``datasets`` streaming: Hub datasets, csv, parquet, JSON arrays."""
    import datasets

    if data.dataset_name is not None:
        what = f"--dataset-name {data.dataset_name}"
        if not hub.offline_mode():
            hub.require_hub(what)
        args: tuple[Any, ...] = (data.dataset_name, data.dataset_config_name)
        kwargs: dict[str, Any] = {"token": access.token_value()}
    else:
        files = data_files(data)
        what = ", ".join(files.values())
        extension = data_extension(next(iter(files.values())))
        args = ({"csv": "csv", "parquet": "parquet"}.get(extension, "json"),)
        kwargs = {"data_files": files}
    try:
        streams = datasets.load_dataset(*args, streaming=True, cache_dir=access.cache_dir, **kwargs)
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
        if stream.num_shards < readers.count:
            stream = stream.reshard()
        where = f"{what} [{split}]"
        count = stream.num_shards
        if records:
            reader = partial(read_dataset_shard, dataset=stream, num_shards=count, column=None)
            columns = _stream_columns(stream, where)
            sources[split] = TextSource(where, list(range(count)), readers, reader, columns)
            continue
        column = _stream_column(stream, data.text_column, where)
        reader = partial(read_dataset_shard, dataset=stream, num_shards=count, column=column)
        sources[split] = TextSource(where, list(range(count)), readers, reader)
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
            raise not_text(where, name, dtype or "structured data", columns)
        return name
    for example in stream.take(1):
        return _pick_column(list(example), requested, where, example)
    raise DataError(f"{where}: no records (the data is empty)", "give non-empty data")


def reader_source(
    reader: Reader, where: str, readers: Readers, *, text_column: str | None, records: bool
) -> TextSource:
    """A reader (a ``train_sources``/``validation_sources`` entry) as a stream source: one
    shard per item of its shard lists, read by calling the reader on that shard alone. Its
    first record is read here, to choose the text column (or take a record source's
    columns) before any work."""
    shards = reader.shards()
    first = next(read_shards(reader, **shards[0]), None) if shards else None
    if first is None:
        raise DataError(f"{where}: no records", "give a source with at least one record")
    if records:
        read = partial(_read_reader_shard, reader=reader, column=None)
        return TextSource(where, shards, readers, read, list(first))
    column = _pick_column(list(first), text_column, where, first)
    read = partial(_read_reader_shard, reader=reader, column=column)
    return TextSource(where, shards, readers, read)


def _read_reader_shard(
    shard: dict[str, list[Any]],
    start: ChunkKey | None = None,
    *,
    reader: Reader,
    column: str | None,
) -> Iterator[tuple[ChunkKey, list[Any]]]:
    """The ``column`` texts of one shard of a reader (or with ``column`` None its records),
    keyed by the count of records before them. A reader cannot seek: starting again at a key
    reads the shard from its start and drops that many records (nothing tokenizes them)."""
    done = 0 if start is None else start[1]
    batch: list[Any] = []
    for record in islice(read_shards(reader, **shard), done, None):
        if column is None:
            batch.append(record)
        else:
            value = record.get(column)
            batch.append(value if isinstance(value, str) else "")
        if len(batch) == ENCODE_BATCH:
            yield (0, done), batch
            done, batch = done + len(batch), []
    if batch:
        yield (0, done), batch
