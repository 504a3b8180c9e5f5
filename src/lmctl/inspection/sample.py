"""The head of each split: the first ``--sample`` lines or records, never the whole file.

Plain text files are read line by line from their start (the size of the file and of the
bytes read give an estimate of its line count); other files and Hub datasets are opened as
``datasets`` streams and the first records taken, so a corpus of any size answers at once.
"""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from itertools import islice
from typing import TYPE_CHECKING, Any

from lmctl.data.load import BUILDERS, choose_column
from lmctl.errors import DataError
from lmctl.storage import hub
from lmctl.storage.paths import data_extension, is_remote, local_path

if TYPE_CHECKING:
    from lmctl.config.slices import Access, DataSpec
    from lmctl.config.sources import DataSource


#: The most bytes read from the start of a text file, whatever ``--sample`` says.
MAX_HEAD_BYTES = 256 << 20


@dataclass
class Head:
    """The records read from the start of one split."""

    split: str
    where: str
    #: Text objectives: the lines or texts; multiple choice: the records.
    texts: list[str] = field(default_factory=list)
    records: list[dict[str, Any]] = field(default_factory=list)
    #: True when the whole split was read (the sample covers it).
    complete: bool = False
    #: An estimate of the lines or records of the split, when one is known.
    estimated_total: int | None = None
    #: What was counted: the lines of a text file, or records.
    unit: str = "records"
    #: With named sources: the head of each source (its ``split`` is the source's name).
    parts: list[Head] = field(default_factory=list)

    @property
    def read(self) -> int:
        return len(self.records) if self.records else len(self.texts)

    def describe(self) -> str:
        unit = self.unit
        if self.complete:
            return f"all {self.read} {unit}"
        if self.estimated_total is not None:
            return f"sampled {self.read} of ~{self.estimated_total} {unit}"
        return f"first {self.read} {unit}"


def read_text_head(path: str, limit: int, flag: str) -> tuple[list[str], bool, int | None]:
    """The first ``limit`` lines of a text file, whether they are all of it, and an estimate
    of its line count from the bytes they took."""
    file = local_path(path)
    if not file.is_file():
        raise DataError(f"{flag} {path}: no such file", f"check the path given to {flag}")
    size = os.path.getsize(file)
    lines: list[str] = []
    taken = 0
    with open(file, "rb") as stream:
        # Bounded in bytes too: a file of few, huge lines is never read whole.
        while len(lines) < limit and taken < MAX_HEAD_BYTES:
            raw = stream.readline(MAX_HEAD_BYTES - taken)
            if not raw:
                break
            taken += len(raw)
            lines.append(raw.decode("utf-8", errors="replace").rstrip("\r\n"))
        complete = stream.read(1) == b""
    estimate = None
    if not complete and taken:
        estimate = round(size / (taken / len(lines)))
    return lines, complete, len(lines) if complete else estimate


def _stream_head(
    data: DataSpec, access: Access, split: str, path: str | None, limit: int
) -> tuple[list[dict[str, Any]], bool] | None:
    """The first ``limit`` records of a split read as a ``datasets`` stream (None: the data
    has no such split)."""
    import datasets

    name = data.dataset_name
    remote_name = path is None and name is not None and not local_path(name).exists()
    if remote_name and not hub.offline_mode():
        hub.require_hub(f"--dataset-name {name}")
    try:
        if path is not None:
            builder = BUILDERS[data_extension(path)]
            target = path if is_remote(path) else str(local_path(path))
            stream = datasets.load_dataset(
                builder, data_files={split: target}, split=split, streaming=True
            )
        else:
            assert data.dataset_name is not None
            names = datasets.get_dataset_split_names(
                data.dataset_name, data.dataset_config_name, token=access.token_value()
            )
            if split not in names:
                return None
            stream = datasets.load_dataset(
                data.dataset_name,
                data.dataset_config_name,
                split=split,
                streaming=True,
                token=access.token_value(),
                trust_remote_code=access.trust_remote_code or None,
            )
        records = [dict(record) for record in islice(stream, limit + 1)]
    except DataError:
        raise
    except Exception as exc:
        where = path or f"--dataset-name {data.dataset_name}"
        if path is None and hub.is_connection_error(exc):
            raise hub.unreachable(where) from exc
        raise DataError(
            f"{where}: could not be read ({type(exc).__name__}: {str(exc).splitlines()[0]})",
            "check the file, or the dataset name and that the Hub is reachable",
        ) from exc
    complete = len(records) <= limit
    return records[:limit], complete


def read_heads(data: DataSpec, access: Access, limit: int, *, records: bool) -> list[Head]:
    """The head of the train and validation splits the data names (of each named source, up
    to ``limit`` records each). ``records``: keep whole records (multiple choice) rather than
    the text column."""
    files = {"train": data.train_file, "validation": data.validation_file}
    named = {"train": data.train_sources, "validation": data.validation_sources}
    heads: list[Head] = []
    for split in ("train", "validation"):
        head: Head | None
        if named[split]:
            head = _sources_head(data, access, split, named[split], limit, records=records)
        elif files[split] is None and data.dataset_name is None:
            continue
        else:
            path = files[split]
            where = data.source(split)
            head = _head(data, access, split, where, path=path, limit=limit, records=records)
        if head is not None:
            heads.append(head)
    if not heads:
        raise DataError(
            "no data to inspect", "give --train-file, --validation-file or --dataset-name"
        )
    return heads


def _head(
    data: DataSpec,
    access: Access,
    split: str,
    where: str,
    *,
    path: str | None,
    limit: int,
    records: bool,
    flag: str | None = None,
) -> Head | None:
    """The head of the file ``path``, else of the ``split`` split of the dataset ``data``
    names (None: it has no such split); ``flag`` names the file in messages."""
    head = Head(split, where)
    if path is not None and data_extension(path) == "txt" and not is_remote(path):
        if records:
            raise DataError(
                f"{path}: a text file holds no multiple-choice records",
                "give a csv, json, jsonl or parquet file with the context, ending and "
                "label columns",
            )
        head.unit = "lines"
        head.texts, head.complete, head.estimated_total = read_text_head(
            path, limit, flag or f"--{split}-file"
        )
        return head
    found = _stream_head(data, access, split, path, limit)
    if found is None:
        return None
    return _filled(head, *found, data.text_column, records=records)


def _filled(
    head: Head, rows: list[dict[str, Any]], complete: bool, column: str | None, *, records: bool
) -> Head:
    head.complete = complete
    if complete:
        head.estimated_total = len(rows)
    if records:
        head.records = rows
    elif rows:
        chosen = choose_column(list(rows[0]), column, head.where)
        head.texts = [str(row[chosen] or "") for row in rows]
    return head


def _sources_head(
    data: DataSpec,
    access: Access,
    split: str,
    sources: list[DataSource],
    limit: int,
    *,
    records: bool,
) -> Head:
    """The heads of ``sources``, one part each, and together the head of ``split``."""
    from dataclasses import replace

    from lmctl.data.sources import read_shards, resolve_reader, source_where

    field_name = f"{split}_sources"
    parts: list[Head] = []
    for index, source in enumerate(sources):
        where = source_where(field_name, index, source)
        part: Head | None
        if source.reader is not None:
            reader = resolve_reader(source, where)
            rows = list(islice(read_shards(reader, **reader.shard_args), limit + 1))
            head = Head(source.name, where)
            complete = len(rows) <= limit
            part = _filled(head, rows[:limit], complete, data.text_column, records=records)
        else:
            one = replace(data, dataset_name=source.dataset, dataset_config_name=source.config)
            flag = f"{field_name}[{index}].file"
            part = _head(
                one, access, split, where, path=source.file, limit=limit, records=records, flag=flag
            )
            if part is None:
                raise DataError(
                    f"{where}: the dataset {source.dataset} has no '{split}' split",
                    "name a dataset with that split, or a file",
                )
            part.split = source.name
        parts.append(part)
    totals = [part.estimated_total for part in parts]
    return Head(
        split,
        data.source(split),
        texts=[text for part in parts for text in part.texts],
        records=[record for part in parts for record in part.records],
        complete=all(part.complete for part in parts),
        estimated_total=None if None in totals else sum(t for t in totals if t is not None),
        unit="lines" if all(part.unit == "lines" for part in parts) else "records",
        parts=parts,
    )
