"""Building blocks that several objectives share: sequence-length rules, tokenize-and-group,
and a collator for fixed-length blocks."""

from __future__ import annotations

from dataclasses import asdict
from pathlib import Path
from typing import TYPE_CHECKING, Any, cast

from lmctl.data import text_column
from lmctl.errors import DataError
from lmctl.modeling import max_positions

if TYPE_CHECKING:
    from datasets import Dataset, DatasetDict
    from transformers import PretrainedConfig, PreTrainedTokenizerBase

    from lmctl.config.base import TrainConfig
    from lmctl.console import Console

DEFAULT_LENGTH_CAP = 1024
# Tokenizers without a recorded maximum report a huge sentinel (int(1e30)).
_UNSET_MAX = 10**9


def split_source(config: TrainConfig, split: str) -> str:
    """How the user named the data of a split, for error messages."""
    path = config.train_file if split == "train" else config.validation_file
    if path is None and split == "validation" and config.train_file is not None:
        return f"{config.train_file} (held-out validation part)"
    if path is not None:
        return path
    return f"--dataset-name {config.dataset_name} [{split}]"


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


def tokenize_and_group(
    config: TrainConfig,
    raw: DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    console: Console,
    *,
    special_tokens_mask: bool = False,
) -> DatasetDict:
    """Tokenize every text, concatenate, and cut into ``block_size`` blocks.

    With ``--streaming`` this happens on the fly (:mod:`lmctl.stream`); otherwise the blocks
    come from the prepared-data cache (:mod:`lmctl.prepared`), built on a miss by the fast
    tokenizer (:mod:`lmctl.tokens`) with ``--preprocessing-num-workers`` processes.
    """
    if config.streaming:
        from lmctl import stream

        sources = cast("dict[str, stream.TextSource]", raw)
        streams = stream.block_streams(
            config, sources, tokenizer, block_size, console, special_tokens_mask=special_tokens_mask
        )
        return cast("DatasetDict", streams)
    from lmctl.prepared import prepared_splits
    from lmctl.tokens import TextEncoder, write_blocks

    encoder = TextEncoder(tokenizer, special_tokens_mask=special_tokens_mask)

    def build(split: str, dataset: Dataset, path: Path) -> dict[str, Any]:
        where = split_source(config, split)
        column = text_column(dataset, config.text_column, where)
        workers = config.preprocessing_num_workers or 1
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
        config,
        raw,
        tokenizer,
        console,
        params={
            "kind": "blocks",
            "block_size": block_size,
            "special_tokens_mask": special_tokens_mask,
        },
        text_options=text_options_of(config),
        build=build,
    )


def text_options_of(config: TrainConfig) -> dict[str, Any]:
    """The raw-reading options that change the texts (part of the prepared-data key)."""
    from lmctl.objectives import get_objective

    return get_objective(config.objective).text_options(config) if config.objective else {}


class BlockCollator:
    """Stacks equal-length blocks; labels are the inputs (the model shifts them)."""

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        input_ids = torch.tensor([feature["input_ids"] for feature in features], dtype=torch.long)
        return {"input_ids": input_ids, "labels": input_ids.clone()}
