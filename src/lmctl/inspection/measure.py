"""Measurements of a sample of tokenized data: lengths, cuts, padding and unknown tokens.

Percentiles are nearest-rank (the smallest length that at least p% of the samples do not
exceed). Padding waste is the share of padded positions when the samples are batched in
their order, and when they are ordered by the project's length-grouped sampler
(:class:`lmctl.data.batching.LengthGroupedSampler`: shuffled, cut into mega-batches of up to
50 batches, fewer for a small sample, each sorted by length) with the run's seed.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from transformers import PreTrainedTokenizerBase

#: Texts tokenized per call of the fast tokenizer.
BATCH = 1000
HISTOGRAM_BINS = 10
TOP_UNKNOWN = 10
GROUPING = (
    "the length-grouped sampler: shuffled, mega-batches of up to 50 batches (fewer for a "
    "small sample) each sorted by length"
)


def percentile(ordered: list[int], p: float) -> int:
    """Nearest-rank percentile of an ascending list (0 for an empty one)."""
    if not ordered:
        return 0
    rank = max(1, math.ceil(p / 100 * len(ordered)))
    return ordered[rank - 1]


def distribution(lengths: list[int]) -> dict[str, Any]:
    ordered = sorted(lengths)
    return {
        "samples": len(ordered),
        "tokens": sum(ordered),
        "mean": round(sum(ordered) / len(ordered), 2) if ordered else 0,
        "p50": percentile(ordered, 50),
        "p90": percentile(ordered, 90),
        "p99": percentile(ordered, 99),
        "max": ordered[-1] if ordered else 0,
    }


def histogram(lengths: list[int], bins: int = HISTOGRAM_BINS) -> list[dict[str, int]]:
    """Equal-width bins from 0 to the longest sample: ``{"low", "high", "count"}`` with
    ``low <= length <= high``."""
    if not lengths:
        return []
    top = max(lengths)
    width = max(1, math.ceil((top + 1) / bins))
    counts = Counter(min(length // width, bins - 1) for length in lengths)
    edges = range(0, min(bins, math.ceil((top + 1) / width)))
    return [
        {"low": i * width, "high": min((i + 1) * width - 1, top), "count": counts.get(i, 0)}
        for i in edges
    ]


def text_bars(bins: list[dict[str, int]], width: int = 40) -> list[str]:
    """The histogram as text lines, one per bin."""
    peak = max((item["count"] for item in bins), default=0) or 1
    span = len(str(bins[-1]["high"])) if bins else 1
    return [
        f"{item['low']:>{span}}-{item['high']:<{span}} "
        f"{'#' * math.ceil(item['count'] / peak * width) if item['count'] else '':<{width}} "
        f"{item['count']}"
        for item in bins
    ]


def cut(lengths: list[int], limit: int) -> dict[str, Any]:
    """The samples longer than ``limit`` and the tokens past it, as counts and shares."""
    total = sum(lengths)
    samples = sum(1 for length in lengths if length > limit)
    tokens = sum(length - limit for length in lengths if length > limit)
    return {
        "limit": limit,
        "samples_cut": samples,
        "samples_cut_share": round(samples / len(lengths), 6) if lengths else 0.0,
        "tokens_cut": tokens,
        "tokens_cut_share": round(tokens / total, 6) if total else 0.0,
    }


def blocks(lengths: list[int], block_size: int) -> dict[str, Any]:
    """Texts concatenated and cut into ``block_size`` blocks: the remainder is dropped."""
    total = sum(lengths)
    dropped = total % block_size
    return {
        "limit": block_size,
        "grouped": True,
        "blocks": total // block_size,
        "tokens_cut": dropped,
        "tokens_cut_share": round(dropped / total, 6) if total else 0.0,
    }


def _padded_share(
    lengths: list[int], real: list[int], sequences: int, order: list[int], batch_size: int
) -> float:
    padded = positions = 0
    for start in range(0, len(order), batch_size):
        batch = order[start : start + batch_size]
        width = max(lengths[i] for i in batch) * sequences * len(batch)
        positions += width
        padded += width - sum(real[i] for i in batch)
    return round(padded / positions, 6) if positions else 0.0


def padding(
    lengths: list[int],
    batch_size: int,
    seed: int,
    *,
    real: list[int] | None = None,
    sequences: int = 1,
) -> dict[str, Any]:
    """Share of padded positions in batches of ``batch_size`` samples (lengths already cut),
    in the samples' order and in the length-grouped sampler's. A sample of ``sequences``
    sequences (the choices of a record) pads each to the batch's longest; ``real`` holds its
    tokens (default: its length)."""
    from lmctl.data.batching import LengthGroupedSampler

    filled = real if real is not None else lengths
    grouped = list(LengthGroupedSampler(lengths, batch_size, seed)) if lengths else []
    in_order = list(range(len(lengths)))
    return {
        "batch_size": batch_size,
        "padding_share": _padded_share(lengths, filled, sequences, in_order, batch_size),
        "padding_share_grouped": _padded_share(lengths, filled, sequences, grouped, batch_size),
        "grouping": GROUPING,
    }


@dataclass
class Tokenized:
    """Lengths (special tokens included) and unknown tokens of a sample."""

    lengths: list[int]
    #: Tokens of the texts themselves (without the special tokens the tokenizer adds).
    text_tokens: int
    unknown: int
    unknown_pieces: Counter[str]


def tokenize_texts(
    tokenizer: PreTrainedTokenizerBase,
    firsts: list[str],
    seconds: list[str] | None = None,
) -> Tokenized:
    """Tokenize in batches as the objectives do (special tokens added, nothing cut)."""
    unk = tokenizer.unk_token_id
    offsets = unk is not None and tokenizer.is_fast
    specials = tokenizer.num_special_tokens_to_add(pair=seconds is not None)
    lengths: list[int] = []
    unknown = 0
    pieces: Counter[str] = Counter()
    for start in range(0, len(firsts), BATCH):
        texts = firsts[start : start + BATCH]
        pairs = seconds[start : start + BATCH] if seconds is not None else None
        encoded = tokenizer(
            texts,
            pairs,
            add_special_tokens=True,
            truncation=False,
            verbose=False,
            return_attention_mask=False,
            return_token_type_ids=False,
            return_offsets_mapping=offsets,
        )
        for row, ids in enumerate(encoded["input_ids"]):
            lengths.append(len(ids))
            if unk is None or unk not in ids:
                continue
            where = [i for i, token in enumerate(ids) if token == unk]
            unknown += len(where)
            if offsets:
                sequence_ids = encoded.sequence_ids(row)
                for i in where:
                    begin, end = encoded["offset_mapping"][row][i]
                    source = texts[row] if sequence_ids[i] != 1 else pairs[row]  # type: ignore[index]
                    pieces[source[begin:end]] += 1
    text_tokens = sum(lengths) - specials * len(lengths)
    return Tokenized(lengths, text_tokens, unknown, pieces)


def unknown_report(tokenized: Tokenized, unk_token: str | None) -> dict[str, Any]:
    total = tokenized.text_tokens
    return {
        "unk_token": unk_token,
        "unknown_tokens": tokenized.unknown,
        "unknown_share": round(tokenized.unknown / total, 6) if total else 0.0,
        "top_unknown": [
            {"text": text, "count": count}
            for text, count in tokenized.unknown_pieces.most_common(TOP_UNKNOWN)
        ],
    }


def line_counts(texts: list[str]) -> dict[str, int]:
    """Blank lines, and lines that repeat an earlier non-blank line."""
    blank = sum(1 for text in texts if not text.strip())
    seen: set[str] = set()
    duplicates = 0
    for text in texts:
        if not text.strip():
            continue
        if text in seen:
            duplicates += 1
        seen.add(text)
    return {"blank_lines": blank, "duplicate_lines": duplicates}
