"""Fast tokenize-and-group gives exactly the upstream token stream, whatever the workers."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import pytest

from lmctl.data.tokens import BlockCutter, Encoded, TextEncoder, write_blocks
from tests.conftest import corpus_lines


@pytest.fixture(scope="module")
def wordpiece_tokenizer() -> Any:
    """A BERT-style tokenizer that adds [CLS] and [SEP] to every text."""
    from lmctl.console import Console, OutputOptions
    from lmctl.models.tokenizer import train_tokenizer

    return train_tokenizer(
        lambda: iter([corpus_lines()[:2000]]),
        vocab_size=300,
        algorithm="wordpiece",
        model_max_length=128,
        console=Console(OutputOptions(quiet=True)),
        world_size=1,
    )


TEXTS = [
    "Hello world.\n",
    "",
    "\n",
    "  spaced   out  ",
    "\n",
    "ÉTÉ à Paris [SEP] x",
    "Hello world.\n",
    "",
    "last",
]


def test_encoder_matches_the_tokenizer(bpe_tokenizer: Path, wordpiece_tokenizer: Any) -> None:
    from transformers import AutoTokenizer

    for tokenizer in (AutoTokenizer.from_pretrained(bpe_tokenizer), wordpiece_tokenizer):
        expected = tokenizer(TEXTS, return_special_tokens_mask=True)
        encoded = TextEncoder(tokenizer, special_tokens_mask=True).encode(TEXTS)
        assert encoded.ids.tolist() == [t for ids in expected["input_ids"] for t in ids]
        assert encoded.mask is not None
        assert encoded.mask.tolist() == [m for ms in expected["special_tokens_mask"] for m in ms]


def test_encoder_ignores_truncation_left_on_the_tokenizer(wordpiece_tokenizer: Any) -> None:
    """A tokenizer left truncating by an earlier call must not truncate the token stream."""
    wordpiece_tokenizer(["word " * 50], truncation=True, max_length=4)
    long_text = ["word " * 50]
    expected = wordpiece_tokenizer(long_text)["input_ids"][0]
    assert TextEncoder(wordpiece_tokenizer).encode(long_text).ids.tolist() == expected


def test_block_cutter_carries_the_rest_over() -> None:
    import numpy as np

    cutter = BlockCutter(4)
    out = []
    for chunk in ([1, 2, 3], [4, 5], [6, 7, 8, 9, 10]):
        blocks = cutter.feed(Encoded(np.array(chunk, dtype="int32"), None))
        if blocks is not None:
            out.extend(blocks.ids.tolist())
    assert out == [[1, 2, 3, 4], [5, 6, 7, 8]]
    assert cutter.dropped == 2
    assert cutter.tokens == 10


@pytest.mark.parametrize("workers", [1, 2])
def test_write_blocks_is_upstream_grouping(
    tmp_path: Path, wordpiece_tokenizer: Any, workers: int
) -> None:
    """Concatenate every text's tokens (special tokens included) and cut into blocks."""
    from datasets import Dataset

    lines = [line + "\n" for line in corpus_lines()[:5000]]
    dataset = Dataset.from_dict({"text": lines})
    path = tmp_path / "blocks.arrow"
    encoder = TextEncoder(wordpiece_tokenizer, special_tokens_mask=True)
    stats = write_blocks(dataset, "text", encoder, 32, path, workers=workers)
    blocks = Dataset.from_file(str(path))

    expected = wordpiece_tokenizer(lines, return_special_tokens_mask=True)
    flat = [t for ids in expected["input_ids"] for t in ids]
    mask = [m for ms in expected["special_tokens_mask"] for m in ms]
    usable = len(flat) // 32 * 32
    assert stats.tokens == len(flat)
    assert stats.blocks == len(blocks) == usable // 32
    assert stats.dropped == len(flat) - usable
    assert [t for row in blocks["input_ids"] for t in row] == flat[:usable]
    assert [m for row in blocks["special_tokens_mask"] for m in row] == mask[:usable]
    assert not list(tmp_path.glob(".*")), "token scratch files are removed"


@pytest.mark.parametrize(
    ("special_tokens_mask", "truncation_side", "workers"),
    [
        (False, "right", 1),
        (True, "right", 1),
        (False, "left", 1),
        (True, "left", 1),
        (True, "right", 2),
        (False, "left", 3),
    ],
)
def test_line_writer_matches_the_tokenizer_through_datasets_map(
    wordpiece_tokenizer: Any,
    tmp_path: Path,
    special_tokens_mask: bool,
    truncation_side: str,
    workers: int,
) -> None:
    """The fast line-by-line writer gives the samples (columns, types, values) that
    ``Dataset.map`` with the tokenizer gives: blank lines skipped, long lines truncated; in
    the same order with worker processes, each writing a range of the rows."""
    from functools import partial

    import datasets

    from lmctl.data.tokens import LineEncoder, write_lines
    from lmctl.objectives.common import _tokenize

    wordpiece_tokenizer.truncation_side = truncation_side
    long_line = " ".join(corpus_lines()[:40])
    texts = [*TEXTS, long_line, "   \t", *corpus_lines()[:7000], None]
    dataset = datasets.Dataset.from_dict({"text": texts})
    options = {"special_tokens_mask": special_tokens_mask, "offsets": False, "max_length": 24}
    expected = dataset.map(
        partial(_tokenize, tokenizer=wordpiece_tokenizer, column="text", **options),
        batched=True,
        remove_columns=["text"],
        load_from_cache_file=False,
        cache_file_name=str(tmp_path / "map.arrow"),
    )
    encoder = LineEncoder(wordpiece_tokenizer, 24, special_tokens_mask=special_tokens_mask)
    texts_read, samples = write_lines(
        dataset, "text", encoder, tmp_path / "fast.arrow", workers=workers
    )
    written = datasets.Dataset.from_file(str(tmp_path / "fast.arrow"))
    assert (texts_read, samples) == (len(texts), len(expected))
    assert written.features == expected.features
    assert written[:] == expected[:]
    assert max(map(len, written["input_ids"])) == 24
    assert not list(tmp_path.glob(".*")), "the workers' scratch files are removed"
