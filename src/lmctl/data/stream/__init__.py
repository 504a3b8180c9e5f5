"""Streaming: read, tokenize and group data on the fly, in bounded memory, with every
distributed rank and every dataloader worker reading different shards.

A stream is ``IterableDataset.from_generator(generate, gen_kwargs={"shards": [...]})``. The
``datasets`` library splits that *list* of shards between ranks (``split_dataset_by_node``,
or the ``shard`` call accelerate makes when it prepares the dataloader) and then between the
dataloader workers of each rank, so no two readers ever open the same bytes. ``generate`` is
composed with :func:`functools.partial`: a reader with its paths, credentials and read options
bound (the shard left free), then the tokenize-and-group step with the tokenizer and block
size bound.

Assembled here: blocks of concatenated tokens (:func:`block_streams`), or one example per
line or record (:func:`example_streams`, for ``--line-by-line`` and multiple choice), each
tokenized by an encoder that the objective hands in: the same function that its prepared
(non-streaming) data goes through. Each split's shards and reader come from :mod:`.sources`,
the shards are read by :mod:`.readers`, and :mod:`.positions` lets a resumed run read on
from where the training stream was; named sources and their mixture come from :mod:`.mixture`.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator, Mapping
from functools import partial
from typing import TYPE_CHECKING, Any

from lmctl.data.load import sample_limit
from lmctl.data.stream.positions import POSITION_COLUMN, ReadPoint, StreamPlan, positioned
from lmctl.data.stream.readers import ChunkKey
from lmctl.data.tokens import ENCODE_BATCH, BlockCutter, TextEncoder
from lmctl.errors import DataError

if TYPE_CHECKING:
    from datasets import IterableDataset
    from transformers import PreTrainedTokenizerBase

    from lmctl.config.slices import DataSpec
    from lmctl.console import Console
    from lmctl.data.stream.mixture import MixedSource
    from lmctl.data.stream.sources import Readers, TextSource


def _chunks_from(
    shard: Any, read: Callable[..., Iterator[tuple[ChunkKey, list[Any]]]], point: ReadPoint
) -> Iterator[tuple[ChunkKey, list[Any]]]:
    """Non-empty batches of at most ``ENCODE_BATCH`` texts or records of ``shard``, from the
    chunk of ``point`` on, each with its chunk's key."""
    piece, offset, _ = point
    for key, batch in read(shard, (piece, offset) if piece >= 0 else None):
        for begin in range(0, len(batch), ENCODE_BATCH):
            yield key, batch[begin : begin + ENCODE_BATCH]


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


#: Reads a shard from a point: each example with the point after it.
ExamplesFrom = Callable[[Any, ReadPoint], Iterator[tuple[dict[str, Any], ReadPoint]]]


def _examples_of(part: TextSource, *, encode: Encoder) -> ExamplesFrom:
    return partial(_examples_from, read=part.read, encode=encode)


def block_streams(
    data: DataSpec,
    sources: Mapping[str, TextSource | MixedSource],
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    console: Console,
    *,
    seed: int,
    special_tokens_mask: bool = False,
) -> dict[str, IterableDataset]:
    """Streams of ``block_size`` blocks (the streaming side of ``tokenize_and_group``)."""
    from lmctl.data.tokens import block_features

    encoder = TextEncoder(tokenizer, special_tokens_mask=special_tokens_mask)
    features = block_features(block_size, special_tokens_mask)

    def examples_of(part: TextSource) -> ExamplesFrom:
        return partial(_blocks_from, read=part.read, encoder=encoder, block_size=block_size)

    return {
        split: _stream(
            data,
            split,
            source,
            examples_of,
            features,
            seed=seed,
            console=console,
            unit=f"blocks of {block_size} tokens",
            empty=(
                f"too few tokens for one block of {block_size}",
                "use a smaller --block-size/--max-seq-length, or more data",
            ),
        )
        for split, source in sources.items()
    }


def example_streams(
    data: DataSpec,
    sources: Mapping[str, TextSource | MixedSource],
    encoders: dict[str, Encoder],
    console: Console,
    *,
    seed: int,
    unit: str,
) -> dict[str, IterableDataset]:
    """Streams of one example per line or record (the streaming side of line-by-line and
    of multiple choice), each split tokenized by its encoder; ``unit`` names what an example
    is, for messages ('line', 'record')."""
    return {
        split: _stream(
            data,
            split,
            source,
            partial(_examples_of, encode=encoders[split]),
            None,
            seed=seed,
            console=console,
            unit=f"one example per {unit}",
            empty=(f"no non-empty {unit}s", f"give data with at least one {unit}"),
        )
        for split, source in sources.items()
    }


def _stream(
    data: DataSpec,
    split: str,
    source: TextSource | MixedSource,
    examples_of: Callable[[TextSource], ExamplesFrom],
    features: Any,
    *,
    seed: int,
    console: Console,
    unit: str,
    empty: tuple[str, str],
) -> IterableDataset:
    """The split's stream of the examples that ``examples_of(part)`` reads from a shard of
    each part of ``source``. The training stream shuffles each source's shard order (with
    ``--seed``) and its examples in windows of ``--shuffle-buffer-size`` inside each reader,
    and carries positions (see :class:`StreamPlan`); a training mixture draws from its
    sources by weight (see :mod:`.mixture`). Then limits apply. Data too small for one
    example (``empty``: the problem and the fix) fails here, before training starts."""
    from lmctl.data.stream.mixture import MixedSource

    training = split == "train"
    if isinstance(source, MixedSource):
        plan = None
        if training:
            numbered = [(number, shard) for number, part in enumerate(source.parts)
                        for shard in part.shards]  # fmt: skip
            names = [named.name for named in data.train_sources]
            plan = _plan(data, seed, numbered, source.parts[0].readers, parts=names,
                         seeks=source.records_positions)  # fmt: skip
        parts = [
            _source_stream(data, part, examples_of(part), features, seed=seed, plan=plan,
                           part=number, empty=empty)
            for number, part in enumerate(source.parts)
        ]  # fmt: skip
        stream = _mixed(parts, source, seed=seed)
        shards = f"{len(source.parts)} sources"
    else:
        plan = None
        if training:
            plan = _plan(data, seed, source.shards, source.readers)
        stream = _source_stream(
            data, source, examples_of(source), features, seed=seed, plan=plan, empty=empty
        )
        shards = f"{len(source.shards)} shard{'s' * (len(source.shards) != 1)}"
    limit = sample_limit(data, split)
    if limit is not None:
        stream = stream.take(limit)
    stream.lmctl_plan = plan
    console.info(f"{split}: streaming {source.where} in {shards}, {unit}")
    return stream


def _plan(
    data: DataSpec,
    seed: int,
    shards: list[Any],
    readers: Readers,
    *,
    parts: list[str] | None = None,
    seeks: bool = True,
) -> StreamPlan:
    """A training stream's plan (``parts``, ``seeks``: a mixture's, see :class:`StreamPlan`)."""
    window, cut_for = max(1, data.shuffle_buffer_size), readers.cut_for or readers.count
    return StreamPlan(seed, window, shards, readers.workers, cut_for, parts=parts, seeks=seeks)


def _source_stream(
    data: DataSpec,
    source: TextSource,
    examples_from: ExamplesFrom,
    features: Any,
    *,
    seed: int,
    plan: StreamPlan | None,
    part: int | None = None,
    empty: tuple[str, str],
) -> IterableDataset:
    """The stream of one source; with a ``plan``, shuffled and marked with positions as a
    training stream. ``part``: the source's number in a mixture whose sources share one plan,
    which numbers each shard as ``(part, shard)``."""
    from datasets import IterableDataset, List, Value

    first = positioned(source.shards, None, examples_from)
    try:
        if next(first, None) is None:
            raise DataError(f"{source.where}: {empty[0]}", empty[1])
    finally:
        first.close()
    shards = source.shards
    if part is not None:
        shards = [(part, shard) for shard in shards]
        examples_from = partial(_of_part, examples_from=examples_from)
    if plan is not None and features is not None:
        features = features.copy()
        features[POSITION_COLUMN] = List(Value("int64"))
    stream = IterableDataset.from_generator(
        partial(positioned, examples_from=examples_from),
        features=features,
        gen_kwargs={"shards": shards, "plan": plan},
    )
    if plan is not None and data.shuffle_buffer_size > 0:
        # The shard order only: a buffer of one example keeps the reading order, which the
        # generator shuffles in windows it can find again on resume.
        stream = stream.shuffle(seed=seed, buffer_size=1)
    return stream


def _of_part(
    shard: tuple[int, Any], point: ReadPoint, *, examples_from: ExamplesFrom
) -> Iterator[tuple[dict[str, Any], ReadPoint]]:
    """``examples_from`` of a mixture's shard, numbered ``(part, shard)``."""
    return examples_from(shard[1], point)


def _mixed(parts: list[IterableDataset], source: MixedSource, *, seed: int) -> IterableDataset:
    """The parts drawn by the source's weights from ``seed``, or one after the other."""
    import datasets

    if source.weights is None:
        return datasets.concatenate_datasets(parts)
    return datasets.interleave_datasets(
        parts,
        probabilities=source.weights,
        seed=seed,
        stopping_strategy=source.stopping_strategy,
    )
