"""Fast tokenization into flat token arrays, cut into fixed-size blocks or kept one sample per
line (``--line-by-line``).

The prepared-data cache (:mod:`lmctl.data.prepared`) and streaming (:mod:`lmctl.data.stream`) share
these pieces. They are fast because nothing is built that the model does not need: the
tokenizer's Rust backend encodes large batches (it releases the GIL, so the next batch is
encoded while the previous one is copied out), each distinct text of a batch only once (blank
and repeated lines are common), no attention masks, offsets or labels are kept
(the collator derives labels from ``input_ids``), ids go straight into one flat ``int32``
array, and blocks are cut with numpy and written as Arrow fixed-size lists.

The token stream is exactly the upstream one: every text is encoded on its own, with the
special tokens the tokenizer adds, and the results are concatenated in order.
"""

from __future__ import annotations

import os
from collections import deque
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import ThreadPoolExecutor
from contextlib import contextmanager
from dataclasses import dataclass
from itertools import chain
from pathlib import Path
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    import numpy as np
    from datasets import Dataset
    from transformers import PreTrainedTokenizerBase

#: Texts encoded per call: large enough to amortise the per-call cost, small enough to bound
#: memory (a batch of long documents is still only a few megabytes).
ENCODE_BATCH = 2048
#: Tokens per chunk when reading token files back.
READ_CHUNK = 1 << 22
#: Blocks per Arrow record batch.
WRITE_ROWS = 1024

IDS_DTYPE = "int32"
TOKENIZERS_PARALLELISM = "TOKENIZERS_PARALLELISM"
MASK_DTYPE = "int8"


@dataclass
class Encoded:
    """Token ids (and optionally the special-tokens mask) of several texts, concatenated."""

    ids: np.ndarray
    mask: np.ndarray | None


def rust_backend(tokenizer: PreTrainedTokenizerBase, truncate_to: int | None) -> Any:
    """A private copy of a fast tokenizer's Rust backend, without padding, that truncates as
    ``tokenizer(..., truncation=True, max_length=truncate_to)`` does (None: not at all) and
    splits special tokens as the tokenizer says."""
    from tokenizers import Tokenizer

    backend = Tokenizer.from_str(tokenizer.backend_tokenizer.to_str())
    backend.no_padding()
    if truncate_to is None:
        backend.no_truncation()
    else:
        backend.enable_truncation(
            truncate_to, stride=0, strategy="longest_first", direction=tokenizer.truncation_side
        )
    backend.encode_special_tokens = bool(getattr(tokenizer, "split_special_tokens", False))
    return backend


def is_blank(text: Any) -> bool:
    """A missing, empty or whitespace-only text: it gives no line-by-line sample."""
    return not isinstance(text, str) or not text or text.isspace()


class TextEncoder:
    """Encodes lists of texts into flat token arrays, exactly as ``tokenizer(texts)`` would.

    Picklable: dataloader and preprocessing workers each build their own backend copy.
    """

    def __init__(self, tokenizer: PreTrainedTokenizerBase, *, special_tokens_mask: bool = False):
        self.tokenizer = tokenizer
        self.special_tokens_mask = special_tokens_mask
        self._backend: Any = None

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_backend": None}

    def _fast_backend(self) -> Any:
        """A private copy of the Rust tokenizer without truncation or padding, or None."""
        if self._backend is None:
            has_backend = getattr(self.tokenizer, "backend_tokenizer", None) is not None
            self._backend = rust_backend(self.tokenizer, None) if has_backend else False
        return self._backend or None

    def encode_raw(self, texts: list[str]) -> tuple[Any, list[int] | None]:
        """The expensive, GIL-free part: run the tokenizer on the distinct texts of ``texts``
        (blank and repeated lines are common in text files), and where each text's is."""
        distinct = dict.fromkeys(texts)
        order = None
        if len(distinct) < len(texts):
            position = {text: index for index, text in enumerate(distinct)}
            order = [position[text] for text in texts]
            texts = list(distinct)
        backend = self._fast_backend()
        if backend is not None:
            return backend.encode_batch_fast(texts, add_special_tokens=True), order
        encoded = self.tokenizer(
            texts,
            return_attention_mask=False,
            return_special_tokens_mask=self.special_tokens_mask,
            verbose=False,
        )
        return encoded, order

    def flatten(self, raw: tuple[Any, list[int] | None]) -> Encoded:
        """The cheap part: copy ids (and mask) out of the encodings into flat arrays."""
        import numpy as np

        encoded, order = raw
        if isinstance(encoded, list):
            ids_lists = [encoding.ids for encoding in encoded]
            mask_lists = (
                [encoding.special_tokens_mask for encoding in encoded]
                if self.special_tokens_mask
                else None
            )
        else:
            ids_lists = encoded["input_ids"]
            mask_lists = encoded["special_tokens_mask"] if self.special_tokens_mask else None
        if order is not None:
            ids_lists = [ids_lists[index] for index in order]
            if mask_lists is not None:
                mask_lists = [mask_lists[index] for index in order]
        count = sum(map(len, ids_lists))
        ids = np.fromiter(chain.from_iterable(ids_lists), dtype=IDS_DTYPE, count=count)
        mask = None
        if mask_lists is not None:
            mask = np.fromiter(chain.from_iterable(mask_lists), dtype=MASK_DTYPE, count=count)
        return Encoded(ids, mask)

    def encode(self, texts: list[str]) -> Encoded:
        return self.flatten(self.encode_raw(texts))

    def encode_stream(self, batches: Iterable[list[str]]) -> Iterator[Encoded]:
        """Encode batches in order, encoding batch k+1 while batch k is being consumed."""
        for raw in _in_order_one_ahead(self.encode_raw, batches):
            yield self.flatten(raw)


class BlockCutter:
    """Concatenates token chunks and cuts them into ``block_size`` blocks; the rest carries
    over to the next chunk, and what is left at the end is dropped (upstream behaviour)."""

    def __init__(self, block_size: int) -> None:
        import numpy as np

        self.block_size = block_size
        self._ids = np.empty(0, dtype=IDS_DTYPE)
        self._mask: np.ndarray | None = None
        self.tokens = 0

    def feed(self, chunk: Encoded) -> Encoded | None:
        """Add a chunk; return the complete blocks it finishes, shaped (n, block_size)."""
        import numpy as np

        self.tokens += len(chunk.ids)
        ids = np.concatenate([self._ids, chunk.ids]) if len(self._ids) else chunk.ids
        mask = None
        if chunk.mask is not None:
            previous = self._mask if self._mask is not None else np.empty(0, dtype=MASK_DTYPE)
            mask = np.concatenate([previous, chunk.mask]) if len(previous) else chunk.mask
        full = len(ids) // self.block_size * self.block_size
        self._ids = ids[full:].copy()
        self._mask = mask[full:].copy() if mask is not None else None
        if full == 0:
            return None
        shape = (-1, self.block_size)
        return Encoded(
            ids[:full].reshape(shape), mask[:full].reshape(shape) if mask is not None else None
        )

    @property
    def dropped(self) -> int:
        """Tokens left over after the last complete block."""
        return len(self._ids)


def block_features(block_size: int, with_mask: bool) -> Any:
    from datasets import Features, List, Value

    columns = {"input_ids": List(Value(IDS_DTYPE), length=block_size)}
    if with_mask:
        columns["special_tokens_mask"] = List(Value(MASK_DTYPE), length=block_size)
    return Features(columns)


class BlockWriter:
    """Writes blocks to an Arrow stream file that ``datasets.Dataset.from_file`` memory-maps."""

    def __init__(self, path: Path, block_size: int, with_mask: bool) -> None:
        import pyarrow as pa

        self.block_size = block_size
        self.schema = block_features(block_size, with_mask).arrow_schema
        self.rows = 0
        self._sink = pa.OSFile(str(path), "wb")
        self._writer = pa.ipc.new_stream(self._sink, self.schema)

    def write(self, blocks: Encoded) -> None:
        import pyarrow as pa

        for start in range(0, len(blocks.ids), WRITE_ROWS):
            ids = blocks.ids[start : start + WRITE_ROWS]
            arrays = [pa.FixedSizeListArray.from_arrays(pa.array(ids.reshape(-1)), self.block_size)]
            if blocks.mask is not None:
                mask = blocks.mask[start : start + WRITE_ROWS].reshape(-1)
                arrays.append(pa.FixedSizeListArray.from_arrays(pa.array(mask), self.block_size))
            self._writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=self.schema))
            self.rows += len(ids)

    def close(self) -> None:
        self._writer.close()
        self._sink.close()


def texts_in_batches(
    dataset: Dataset, column: str, start: int, stop: int, batch_size: int = ENCODE_BATCH
) -> Iterator[list[str]]:
    """Texts of rows ``start..stop`` of one column, in batches; missing values read as ''."""
    import pyarrow.compute as pc

    table_view = dataset.with_format("arrow")
    for begin in range(start, stop, batch_size):
        column_data = table_view[begin : min(begin + batch_size, stop)].column(column)
        if column_data.null_count:
            column_data = pc.fill_null(column_data, "")
        yield column_data.to_pylist()


@dataclass
class RangeJob:
    """One preprocessing worker's share: a contiguous range of rows."""

    dataset: Any
    column: str
    encoder: Any  # TextEncoder for blocks, LineEncoder for line-by-line samples
    start: int
    stop: int
    prefix: str


#: Text each preprocessing process gets at least when the number is lmctl's choice: a
#: process costs about 0.1 s to start and tokenizes about 10% faster than the tokenizer's
#: own threads, so below a few MB of text one process with the threads is faster.
BYTES_PER_DEFAULT_WORKER = 4 * 2**20


def default_workers(dataset: Dataset, column: str) -> int:
    """Processes to tokenize ``column`` with when ``--preprocessing-num-workers`` is not
    given: one per usable CPU core and per 4 MB of text, where processes can be forked
    (starting one elsewhere re-imports the libraries, seconds each)."""
    import multiprocessing

    if "fork" not in multiprocessing.get_all_start_methods():
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    text = dataset.data.table.column(column).nbytes
    return max(1, min(cores or 1, text // BYTES_PER_DEFAULT_WORKER))


def range_jobs(
    dataset: Dataset, column: str, encoder: Any, workers: int, scratch: Path
) -> list[RangeJob]:
    """The rows cut into at most ``workers`` contiguous ranges of at least one encoding
    batch each, one job per range, writing under ``scratch``."""
    rows = len(dataset)
    workers = max(1, min(workers, -(-rows // ENCODE_BATCH)))
    bounds = [rows * index // workers for index in range(workers + 1)]
    return [
        RangeJob(dataset, column, encoder, bounds[i], bounds[i + 1], str(scratch / f"{i:05d}"))
        for i in range(workers)
    ]


def tokenize_range(job: RangeJob) -> int:
    """Encode a range of rows into ``<prefix>.ids`` (and ``.mask``); returns the token count."""
    count = 0
    mask_path = job.prefix + ".mask" if job.encoder.special_tokens_mask else os.devnull
    with open(job.prefix + ".ids", "wb") as ids_file, open(mask_path, "wb") as mask_file:
        batches = texts_in_batches(job.dataset, job.column, job.start, job.stop)
        for chunk in job.encoder.encode_stream(batches):
            chunk.ids.tofile(ids_file)
            if chunk.mask is not None:
                chunk.mask.tofile(mask_file)
            count += len(chunk.ids)
    return count


@contextmanager
def forked_workers() -> Iterator[None]:
    """While processes are forked: tokenizers stays single-threaded in them.

    A default run tokenizes with the tokenizer's own thread pool. A forked child can't use
    a pool its parent started, so the children (preprocessing workers, dataloader workers)
    inherit ``TOKENIZERS_PARALLELISM=false``: they are the parallelism. The setting is the
    user's again afterwards.
    """
    previous = os.environ.get(TOKENIZERS_PARALLELISM)
    os.environ[TOKENIZERS_PARALLELISM] = "false"
    try:
        yield
    finally:
        if previous is None:
            os.environ.pop(TOKENIZERS_PARALLELISM, None)
        else:
            os.environ[TOKENIZERS_PARALLELISM] = previous


def _read_tokens(prefix: str, with_mask: bool) -> Iterator[Encoded]:
    import numpy as np

    if os.path.getsize(prefix + ".ids") == 0:
        return
    ids_all = np.memmap(prefix + ".ids", dtype=IDS_DTYPE, mode="r")
    mask_all = np.memmap(prefix + ".mask", dtype=MASK_DTYPE, mode="r") if with_mask else None
    for start in range(0, len(ids_all), READ_CHUNK):
        ids = np.array(ids_all[start : start + READ_CHUNK])
        mask = np.array(mask_all[start : start + READ_CHUNK]) if mask_all is not None else None
        yield Encoded(ids, mask)


@dataclass
class BlockStats:
    texts: int
    tokens: int
    blocks: int
    dropped: int


def write_blocks(
    dataset: Dataset,
    column: str,
    encoder: TextEncoder,
    block_size: int,
    path: Path,
    *,
    workers: int = 1,
) -> BlockStats:
    """Tokenize a text column and write it as ``block_size`` blocks to the Arrow file ``path``.

    ``workers`` processes each encode a contiguous range of rows into a token file (memory
    stays bounded by one batch per worker); the token files are then cut into blocks in
    order, so the result is the same whatever the number of workers.
    """
    scratch = path.parent / f".{path.name}.tokens"
    scratch.mkdir(parents=True, exist_ok=True)
    with_mask = encoder.special_tokens_mask
    jobs = range_jobs(dataset, column, encoder, workers, scratch)
    try:
        run_jobs(tokenize_range, jobs)
        cutter = BlockCutter(block_size)
        writer = BlockWriter(path, block_size, with_mask)
        try:
            for job in jobs:
                for chunk in _read_tokens(job.prefix, with_mask):
                    blocks = cutter.feed(chunk)
                    if blocks is not None:
                        writer.write(blocks)
        finally:
            writer.close()
    finally:
        for file in scratch.iterdir():
            file.unlink()
        scratch.rmdir()
    return BlockStats(
        texts=len(dataset), tokens=cutter.tokens, blocks=writer.rows, dropped=cutter.dropped
    )


def run_jobs(work: Callable[[RangeJob], int], jobs: list[RangeJob]) -> list[int]:
    """``work`` of each job, in this process for one job, in a process each for more."""
    if len(jobs) == 1:
        return [work(jobs[0])]
    import multiprocessing
    from concurrent.futures import ProcessPoolExecutor

    method = "fork" if "fork" in multiprocessing.get_all_start_methods() else "spawn"
    context = multiprocessing.get_context(method)
    with forked_workers(), ProcessPoolExecutor(max_workers=len(jobs), mp_context=context) as pool:
        return list(pool.map(work, jobs))


#: Columns of a line-by-line sample besides ``input_ids``, as ``tokenizer(texts)`` returns them.
_LINE_COLUMNS = ("token_type_ids", "attention_mask")


class LineEncoder:
    """Encodes texts one sample each, truncated to ``max_length`` with the tokenizer's special
    tokens, exactly as ``tokenizer(texts, truncation=True, max_length=max_length)`` would, but
    straight into flat arrays and row offsets (no Python lists per token field)."""

    def __init__(
        self, tokenizer: PreTrainedTokenizerBase, max_length: int, *, special_tokens_mask: bool
    ) -> None:
        self.columns = ["input_ids"]
        self.columns += [name for name in _LINE_COLUMNS if name in tokenizer.model_input_names]
        if special_tokens_mask:
            self.columns.append("special_tokens_mask")
        self._backend: Any = None
        self._tokenizer = tokenizer
        self.max_length = max_length

    def __getstate__(self) -> dict[str, Any]:
        return {**self.__dict__, "_backend": None}

    @staticmethod
    def supports(tokenizer: PreTrainedTokenizerBase) -> bool:
        return getattr(tokenizer, "backend_tokenizer", None) is not None

    def _fast_backend(self) -> Any:
        if self._backend is None:
            self._backend = rust_backend(self._tokenizer, self.max_length)
        return self._backend

    def encode(self, texts: list[str]) -> dict[str, tuple[np.ndarray, np.ndarray]]:
        """Each column as (values, row offsets) for the ``texts`` (none of them blank)."""
        import numpy as np

        encodings = self._fast_backend().encode_batch_fast(texts, add_special_tokens=True)
        lengths = np.fromiter(map(len, encodings), dtype=np.int32, count=len(encodings))
        offsets = np.zeros(len(encodings) + 1, dtype=np.int32)
        np.cumsum(lengths, out=offsets[1:])
        total = int(offsets[-1])
        out: dict[str, tuple[np.ndarray, np.ndarray]] = {}
        for name in self.columns:
            if name == "attention_mask":
                out[name] = (np.ones(total, dtype=MASK_DTYPE), offsets)
                continue
            field = {"input_ids": "ids", "token_type_ids": "type_ids"}.get(name, name)
            dtype = IDS_DTYPE if name == "input_ids" else MASK_DTYPE
            values = chain.from_iterable(getattr(e, field) for e in encodings)
            out[name] = (np.fromiter(values, dtype=dtype, count=total), offsets)
        return out


def line_features(columns: list[str]) -> Any:
    from datasets import Features, List, Value

    return Features(
        {name: List(Value(IDS_DTYPE if name == "input_ids" else MASK_DTYPE)) for name in columns}
    )


def write_lines(
    dataset: Dataset, column: str, encoder: LineEncoder, path: Path, *, workers: int = 1
) -> tuple[int, int]:
    """Tokenize a text column one sample per non-blank text into the Arrow file ``path``;
    returns (texts, samples).

    ``workers`` processes each write the samples of a contiguous range of rows to a file of
    their own, which are then copied into ``path`` in order: the same samples in the same
    order whatever the number of workers.
    """
    import pyarrow as pa

    scratch = path.parent / f".{path.name}.lines"
    scratch.mkdir(parents=True, exist_ok=True)
    jobs = range_jobs(dataset, column, encoder, workers, scratch)
    try:
        if len(jobs) == 1:
            jobs[0].prefix = str(path)
            return len(dataset), write_line_range(jobs[0])
        samples = sum(run_jobs(write_line_range, jobs))
        schema = line_features(encoder.columns).arrow_schema
        with pa.OSFile(str(path), "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
            for job in jobs:
                with pa.memory_map(job.prefix) as source:
                    for batch in pa.ipc.open_stream(source):
                        writer.write_batch(batch)
    finally:
        for file in scratch.iterdir():
            file.unlink()
        scratch.rmdir()
    return len(dataset), samples


def write_line_range(job: RangeJob) -> int:
    """Write the samples of a range of rows to the Arrow stream ``job.prefix``; returns how
    many (blank texts give none)."""
    import pyarrow as pa

    schema = line_features(job.encoder.columns).arrow_schema
    samples = 0
    with pa.OSFile(job.prefix, "wb") as sink, pa.ipc.new_stream(sink, schema) as writer:
        batches = texts_in_batches(job.dataset, job.column, job.start, job.stop)
        kept = ([text for text in batch if not is_blank(text)] for batch in batches)
        for encoded in _in_order_one_ahead(job.encoder.encode, kept):
            samples += _write_line_batch(writer, schema, encoded)
    return samples


def _in_order_one_ahead(work: Any, batches: Iterable[list[str]]) -> Iterator[Any]:
    """``work`` of each non-empty batch, in order; batch k+1 is worked on in a thread while
    the result of batch k is consumed (the tokenizer releases the GIL)."""
    with ThreadPoolExecutor(max_workers=1, thread_name_prefix="lmctl-encode") as pool:
        pending: deque[Any] = deque()
        for batch in batches:
            if not batch:
                continue
            pending.append(pool.submit(work, batch))
            if len(pending) > 1:
                yield pending.popleft().result()
        while pending:
            yield pending.popleft().result()


def _write_line_batch(writer: Any, schema: Any, encoded: dict[str, Any]) -> int:
    import pyarrow as pa

    arrays = [
        pa.ListArray.from_arrays(pa.array(offsets), pa.array(values))
        for values, offsets in encoded.values()
    ]
    writer.write_batch(pa.RecordBatch.from_arrays(arrays, schema=schema))
    return len(arrays[0])
