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
from where the training stream was.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
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
    from lmctl.data.stream.sources import TextSource


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


def block_streams(
    data: DataSpec,
    sources: dict[str, TextSource],
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
    return {
        split: _stream(
            data,
            split,
            source,
            partial(_blocks_from, read=source.read, encoder=encoder, block_size=block_size),
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
    sources: dict[str, TextSource],
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
            partial(_examples_from, read=source.read, encode=encoders[split]),
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
    source: TextSource,
    examples_from: Callable[..., Iterator[tuple[dict[str, Any], ReadPoint]]],
    features: Any,
    *,
    seed: int,
    console: Console,
    unit: str,
    empty: tuple[str, str],
) -> IterableDataset:
    """The split's stream of the examples that ``examples_from`` reads from a shard. The
    training stream shuffles its shard order each pass (with ``--seed``) and its examples in
    windows of ``--shuffle-buffer-size`` inside each reader, and carries positions (see
    :class:`StreamPlan`); then limits apply. Data too small for one example (``empty``: the
    problem and the fix) fails here, before training starts."""
    from datasets import IterableDataset, List, Value

    generate = partial(positioned, examples_from=examples_from)
    first = generate(source.shards, None)
    try:
        if next(first, None) is None:
            raise DataError(f"{source.where}: {empty[0]}", empty[1])
    finally:
        first.close()
    plan = None
    if split == "train":
        window = max(1, data.shuffle_buffer_size)
        plan = StreamPlan(seed, window, source.shards, source.readers.workers)
        if features is not None:
            features = features.copy()
            features[POSITION_COLUMN] = List(Value("int64"))
    stream = IterableDataset.from_generator(
        generate, features=features, gen_kwargs={"shards": source.shards, "plan": plan}
    )
    if plan is not None and data.shuffle_buffer_size > 0:
        # The shard order only: a buffer of one example keeps the reading order, which the
        # generator shuffles in windows it can find again on resume.
        stream = stream.shuffle(seed=seed, buffer_size=1)
    limit = sample_limit(data, split)
    if limit is not None:
        stream = stream.take(limit)
    stream.lmctl_plan = plan
    shards = f"{len(source.shards)} shard{'s' * (len(source.shards) != 1)}"
    console.info(f"{split}: streaming {source.where} in {shards}, {unit}")
    return stream
