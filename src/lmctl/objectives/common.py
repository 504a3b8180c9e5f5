"""Building blocks that several objectives share: sequence-length options and rules, and
tokenization (grouped into blocks, or one sample per line)."""

from __future__ import annotations

from dataclasses import asdict, dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from lmctl.config.base import TrainConfig
from lmctl.config.fields import PANEL_OBJECTIVE, option
from lmctl.config.slices import DataSpec
from lmctl.data.load import cached_map, group_into_blocks, text_column, tokenizer_fingerprint
from lmctl.data.tokens import LineEncoder, default_workers, is_blank, write_lines
from lmctl.errors import DataError
from lmctl.models.config import DEFAULT_LENGTH_CAP, max_positions

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from lmctl.config.slices import DataSpec, LoopSpec
    from lmctl.console import Console

# Tokenizers without a recorded maximum report a huge sentinel (int(1e30)).
_UNSET_MAX = 10**9


class SequenceConfig(TrainConfig):
    """Objectives whose samples are token sequences of a bounded length."""

    max_seq_length: int | None = option(
        None,
        "Maximum tokens per sequence (default: the tokenizer's maximum, capped at 1024 and "
        "at the model's positions; larger than the tokenizer's maximum: clamped with a "
        "warning). Longer inputs are truncated.",
        panel=PANEL_OBJECTIVE,
        gt=0,
    )


@dataclass(frozen=True)
class SequenceOptions:
    max_seq_length: int | None


class LineByLineConfig(SequenceConfig):
    """Objectives that read plain text either grouped into blocks or one sample per line."""

    line_by_line: bool = option(
        False,
        "One sample per non-empty line (blank lines skipped, long lines truncated to "
        "--max-seq-length) instead of concatenating all texts into blocks.",
        panel=PANEL_OBJECTIVE,
    )
    pad_to_max_length: bool = option(
        False,
        "With --line-by-line, pad every sample to --max-seq-length instead of to the longest "
        "in its batch (fixed shapes).",
        panel=PANEL_OBJECTIVE,
    )


@dataclass(frozen=True)
class LineByLineOptions(SequenceOptions):
    line_by_line: bool
    pad_to_max_length: bool


def announce_text_column(data: DataSpec, raw: DatasetDict, console: Console) -> None:
    """Say which column holds the text, and which are ignored, when --text-column did not
    choose and the data has several."""
    if data.text_column is not None:
        return
    for split, dataset in raw.items():
        columns = list(dataset.column_names)
        if len(columns) < 2:
            continue
        where = data.source(split)
        column = text_column(dataset, None, where)
        ignored = ", ".join(name for name in columns if name != column)
        console.info(
            f"{split}: reading the text from column '{column}' of {where}; ignoring {ignored} "
            "(choose another with --text-column)"
        )


def resolve_sequence_length(
    requested: int | None,
    flag: str,
    tokenizer: PreTrainedTokenizerBase,
    model_config: PretrainedConfig,
    console: Console,
    *,
    default: int | None = None,
) -> int:
    """Upstream rules: unset -> the tokenizer's maximum capped at 1024 and at the model's
    positions; larger than the tokenizer's maximum -> clamped with a warning."""
    tokenizer_max = tokenizer.model_max_length
    positions = max_positions(model_config)
    if requested is None:
        length = default if default is not None else min(tokenizer_max, DEFAULT_LENGTH_CAP)
        if positions is not None and length > positions:
            length = positions
        return length
    length = requested
    if tokenizer_max < _UNSET_MAX and length > tokenizer_max:
        console.warn(
            f"{flag} {requested} is larger than the tokenizer's maximum length "
            f"({tokenizer_max}); using {tokenizer_max}"
        )
        length = tokenizer_max
    if positions is not None and length > positions:
        console.warn(
            f"{flag} {length} is larger than the model's {positions} positions; using {positions}"
        )
        length = positions
    return length


def _tokenize(
    examples: dict[str, list[Any]],
    *,
    tokenizer: PreTrainedTokenizerBase,
    column: str,
    special_tokens_mask: bool,
    offsets: bool,
    max_length: int | None = None,
    pad_to_max_length: bool = False,
) -> dict[str, Any]:
    """Grouped mode (``max_length`` None): token ids only, for concatenation. Line mode:
    blank lines dropped, each line truncated (and optionally padded) to ``max_length``."""
    texts = examples[column]
    extras = {
        "return_special_tokens_mask": special_tokens_mask,
        "return_offsets_mapping": offsets,
    }
    if max_length is None:
        encoded = tokenizer(texts, return_attention_mask=False, **extras)
        keep = ["input_ids"]
    else:
        kept = [text for text in texts if not is_blank(text)]
        # A batch of blank lines only gives no sample, with the same columns as the others.
        encoded = tokenizer(
            kept or [""],
            truncation=True,
            max_length=max_length,
            padding="max_length" if pad_to_max_length else False,
            **extras,
        )
        keep = [key for key in encoded if key not in ("special_tokens_mask", "offset_mapping")]
    if special_tokens_mask:
        keep.append("special_tokens_mask")
    if offsets:
        keep.append("offset_mapping")
    rows = len(encoded["input_ids"]) if max_length is None or kept else 0
    return {key: encoded[key][:rows] for key in keep}


def _tokenize_texts(texts: list[str], **options: Any) -> dict[str, Any]:
    """:func:`_tokenize` of a plain batch of texts (a stream's lines)."""
    return _tokenize({"text": texts}, column="text", **options)


def tokenize_and_group(
    raw: DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    console: Console,
    *,
    data: DataSpec,
    loop: LoopSpec,
    text_options: dict[str, Any],
    special_tokens_mask: bool = False,
    offsets: bool = False,
) -> DatasetDict:
    """Tokenize every text, concatenate, and cut into ``block_size`` blocks.

    With ``--streaming`` this happens on the fly (:mod:`lmctl.data.stream`); otherwise the blocks
    come from the prepared-data cache (:mod:`lmctl.data.prepared`), built on a miss by the fast
    tokenizer (:mod:`lmctl.data.tokens`) with ``--preprocessing-num-workers`` processes.
    ``text_options`` are the raw-reading options that changed the texts (part of the key).
    """
    if not data.streaming:
        announce_text_column(data, raw, console)
    if offsets:
        return _group_with_offsets(
            data, raw, tokenizer, block_size, console, special_tokens_mask=special_tokens_mask
        )
    if data.streaming:
        from lmctl.data import stream
        from lmctl.data.stream.sources import TextSource

        sources = cast("dict[str, TextSource]", raw)
        streams = stream.block_streams(
            data,
            sources,
            tokenizer,
            block_size,
            console,
            seed=loop.seed,
            special_tokens_mask=special_tokens_mask,
        )
        return cast("DatasetDict", streams)
    from lmctl.data.prepared import prepared_splits
    from lmctl.data.tokens import TextEncoder, write_blocks

    encoder = TextEncoder(tokenizer, special_tokens_mask=special_tokens_mask)

    def build(split: str, dataset: Dataset, path: Path) -> dict[str, Any]:
        where = data.source(split)
        column = text_column(dataset, data.text_column, where)
        workers = writer_processes(data, dataset, column, split, console)
        stats = write_blocks(dataset, column, encoder, block_size, path, workers=workers)
        if stats.blocks == 0:
            raise DataError(
                f"{where}: {stats.tokens} tokens, too few for one block of {block_size}",
                "use a smaller --block-size/--max-seq-length, or more data",
            )
        console.info(
            f"{split}: {stats.texts} records -> {stats.blocks} blocks of {block_size} tokens"
        )
        return asdict(stats)

    return prepared_splits(
        data,
        raw,
        tokenizer,
        console,
        params={
            "kind": "blocks",
            "block_size": block_size,
            "special_tokens_mask": special_tokens_mask,
        },
        text_options=text_options,
        build=build,
    )


def _tokenized_split(
    data: DataSpec,
    split: str,
    dataset: Dataset,
    tokenizer: PreTrainedTokenizerBase,
    tokenizer_key: str,
    *,
    description: str,
    **options: Any,
) -> tuple[str, Dataset]:
    """One split through :func:`_tokenize` (``datasets``-cached under an explicit key), and
    how the user named its data (for messages)."""
    where = data.source(split)
    column = text_column(dataset, data.text_column, where)
    tokenized = cached_map(
        dataset,
        partial(_tokenize, tokenizer=tokenizer, column=column, **options),
        key=("tokenize", tokenizer_key, column, *sorted(options.items())),
        data=data,
        description=f"{description} {split}",
        remove_columns=list(dataset.column_names),
    )
    return where, tokenized


def _group_with_offsets(
    data: DataSpec,
    raw: DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    console: Console,
    *,
    special_tokens_mask: bool,
) -> DatasetDict:
    """Blocks that also carry each token's character offsets (whole-word masking reads them).

    The fast block writer keeps token ids only, so this path tokenizes with ``Dataset.map``
    (cached by ``datasets`` under an explicit fingerprint) and groups the offset pairs too.
    """
    import datasets

    tokenizer_key = tokenizer_fingerprint(tokenizer)
    processed = {}
    for split, dataset in raw.items():
        where, tokenized = _tokenized_split(
            data,
            split,
            dataset,
            tokenizer,
            tokenizer_key,
            description="tokenizing",
            special_tokens_mask=special_tokens_mask,
            offsets=True,
        )
        blocks = cached_map(
            tokenized,
            partial(group_into_blocks, block_size=block_size),
            key=("group", block_size),
            data=data,
            description=f"grouping {split} into blocks of {block_size}",
        )
        if len(blocks) == 0:
            total = sum(len(ids) for ids in tokenized["input_ids"])
            raise DataError(
                f"{where}: {total} tokens, too few for one block of {block_size}",
                "use a smaller --block-size/--max-seq-length, or more data",
            )
        console.info(
            f"{split}: {len(dataset)} records -> {len(blocks)} blocks of {block_size} tokens"
        )
        processed[split] = blocks
    return datasets.DatasetDict(processed)


def tokenize_lines(
    raw: DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    max_length: int,
    console: Console,
    *,
    data: DataSpec,
    loop: LoopSpec,
    text_options: dict[str, Any],
    pad_to_max_length: bool = False,
    special_tokens_mask: bool = False,
    offsets: bool = False,
) -> DatasetDict:
    """One sample per non-empty line (or record): blank ones skipped, long ones truncated.

    The samples come from the prepared-data cache (:mod:`lmctl.data.prepared`), like blocks;
    with ``--streaming`` the lines are read and tokenized on the fly, by the same function.
    """
    from lmctl.data.prepared import prepared_splits

    options: dict[str, Any] = {
        "special_tokens_mask": special_tokens_mask,
        "offsets": offsets,
        "max_length": max_length,
        "pad_to_max_length": pad_to_max_length,
    }
    if data.streaming:
        from lmctl.data import stream
        from lmctl.data.stream.sources import TextSource

        sources = cast("dict[str, TextSource]", raw)
        encode = partial(_tokenize_texts, tokenizer=tokenizer, **options)
        streams = stream.example_streams(
            data,
            sources,
            dict.fromkeys(sources, encode),
            console,
            seed=loop.seed,
            unit="line",
        )
        return cast("DatasetDict", streams)
    announce_text_column(data, raw, console)

    def build(split: str, dataset: Dataset, path: Path) -> dict[str, Any]:
        where = data.source(split)
        column = text_column(dataset, data.text_column, where)
        workers = data.preprocessing_num_workers
        if _fast_lines(tokenizer, options):
            texts, count = write_lines(
                dataset,
                column,
                LineEncoder(tokenizer, max_length, special_tokens_mask=special_tokens_mask),
                path,
                workers=writer_processes(data, dataset, column, split, console),
            )
            return _line_stats(split, where, texts, count, max_length=max_length, console=console)
        samples = dataset.map(
            partial(_tokenize, tokenizer=tokenizer, column=column, **options),
            batched=True,
            num_proc=workers,
            remove_columns=list(dataset.column_names),
            load_from_cache_file=False,
            cache_file_name=None if workers and workers > 1 else str(path),
            desc=f"tokenizing line by line: {split}",
        )
        if workers and workers > 1:
            samples = samples.flatten_indices(cache_file_name=str(path))
        return _line_stats(
            split, where, len(dataset), len(samples), max_length=max_length, console=console
        )

    return prepared_splits(
        data,
        raw,
        tokenizer,
        console,
        params={"kind": "lines", **options},
        text_options=text_options,
        build=build,
    )


def writer_processes(
    data: DataSpec, dataset: Dataset, column: str, split: str, console: Console
) -> int:
    """Processes for the fast block and line writers: ``--preprocessing-num-workers``, else
    lmctl's choice for the size of the text (said in the log when more than one)."""
    if data.preprocessing_num_workers:
        return data.preprocessing_num_workers
    workers = default_workers(dataset, column)
    if workers > 1:
        console.info(
            f"{split}: tokenizing in {workers} processes (one per CPU core and 4 MB of text; "
            "--preprocessing-num-workers sets the number)"
        )
    return workers


def _fast_lines(tokenizer: PreTrainedTokenizerBase, options: dict[str, Any]) -> bool:
    """Whether line-by-line samples can be written by the fast line writer (a Rust tokenizer,
    no offsets or fixed-length padding; any number of workers); it gives the same samples as
    ``Dataset.map`` with the tokenizer, which does the rest."""
    plain = not options["offsets"] and not options["pad_to_max_length"]
    return plain and LineEncoder.supports(tokenizer)


def _line_stats(
    split: str, where: str, texts: int, samples: int, *, max_length: int, console: Console
) -> dict[str, Any]:
    if samples == 0:
        raise DataError(f"{where}: no non-empty lines ({texts} blank)", "give data with text in it")
    skipped = texts - samples
    console.info(
        f"{split}: {texts} lines -> {samples} samples of at most {max_length} tokens "
        f"({skipped} blank skipped)"
    )
    return {"texts": texts, "samples": samples, "blank": skipped}


def tokenize_texts(
    options: LineByLineOptions,
    raw: DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    length: int,
    console: Console,
    **keywords: Any,
) -> DatasetDict:
    """Line by line or grouped into blocks, as ``--line-by-line`` says; ``keywords`` are
    those that both take (``data``, ``loop``, ``text_options``, ``special_tokens_mask``,
    ``offsets``)."""
    if options.line_by_line:
        return tokenize_lines(
            raw,
            tokenizer,
            length,
            console,
            pad_to_max_length=options.pad_to_max_length,
            **keywords,
        )
    return tokenize_and_group(raw, tokenizer, length, console, **keywords)
