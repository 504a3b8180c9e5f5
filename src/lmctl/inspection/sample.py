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
    """The head of the train and validation splits the data names. ``records``: keep whole
    records (multiple choice) rather than the text column."""
    files = {"train": data.train_file, "validation": data.validation_file}
    heads: list[Head] = []
    for split in ("train", "validation"):
        path = files[split]
        if path is None and data.dataset_name is None:
            continue
        where = data.source(split)
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
                path, limit, f"--{split}-file"
            )
        else:
            found = _stream_head(data, access, split, path, limit)
            if found is None:
                continue
            rows, head.complete = found
            if head.complete:
                head.estimated_total = len(rows)
            if records:
                head.records = rows
            elif rows:
                column = choose_column(list(rows[0]), data.text_column, where)
                head.texts = [str(row[column] or "") for row in rows]
        heads.append(head)
    if not heads:
        raise DataError(
            "no data to inspect", "give --train-file, --validation-file or --dataset-name"
        )
    return heads
