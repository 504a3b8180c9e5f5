"""Building blocks that several objectives share: sequence-length rules, tokenize-and-group,
and a collator for fixed-length blocks."""

from __future__ import annotations

from functools import partial
from typing import TYPE_CHECKING, Any

from lmctl.data import cached_map, group_into_blocks, text_column, tokenizer_fingerprint
from lmctl.errors import DataError
from lmctl.modeling import max_positions

if TYPE_CHECKING:
    from datasets import DatasetDict
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


def _tokenize(
    examples: dict[str, list[Any]],
    *,
    tokenizer: PreTrainedTokenizerBase,
    column: str,
    special_tokens_mask: bool,
) -> dict[str, Any]:
    encoded = tokenizer(
        examples[column],
        return_attention_mask=False,
        return_special_tokens_mask=special_tokens_mask,
    )
    out = {"input_ids": encoded["input_ids"]}
    if special_tokens_mask:
        out["special_tokens_mask"] = encoded["special_tokens_mask"]
    return out


def tokenize_and_group(
    config: TrainConfig,
    raw: DatasetDict,
    tokenizer: PreTrainedTokenizerBase,
    block_size: int,
    console: Console,
    *,
    special_tokens_mask: bool = False,
) -> DatasetDict:
    """Tokenize every text, concatenate, and cut into ``block_size`` blocks."""
    import datasets

    tokenizer_key = tokenizer_fingerprint(tokenizer)
    processed = {}
    for split, dataset in raw.items():
        where = split_source(config, split)
        column = text_column(dataset, config.text_column, where)
        tokenized = cached_map(
            dataset,
            partial(
                _tokenize,
                tokenizer=tokenizer,
                column=column,
                special_tokens_mask=special_tokens_mask,
            ),
            key=("tokenize", tokenizer_key, column, special_tokens_mask),
            config=config,
            description=f"tokenizing {split}",
            remove_columns=list(dataset.column_names),
        )
        blocks = cached_map(
            tokenized,
            partial(group_into_blocks, block_size=block_size),
            key=("group", block_size),
            config=config,
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


class BlockCollator:
    """Stacks equal-length blocks; labels are the inputs (the model shifts them)."""

    def __call__(self, features: list[dict[str, Any]]) -> dict[str, Any]:
        import torch

        input_ids = torch.tensor([feature["input_ids"] for feature in features], dtype=torch.long)
        return {"input_ids": input_ids, "labels": input_ids.clone()}
