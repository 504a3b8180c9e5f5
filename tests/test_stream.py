"""Streaming: byte-range shards, disjoint reading across ranks and dataloader workers,
hold-out, readers for each format, determinism (what exact resume relies on)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from lmctl.config.loader import build_config
from lmctl.console import Console, OutputOptions
from lmctl.data import stream
from lmctl.errors import DataError
from lmctl.objectives.clm import ClmConfig
from lmctl.objectives.common import tokenize_lines

TRICKY_TEXT = (
    "first line\n"
    "\n"
    "crlf line\r\n"
    "unicode: été, 東京, 🙂\n"
    "   \n"
    "a much longer line " + "word " * 300 + "\n"
    "x\n"
    "no newline at the end"
)


def _read_all(shards: list[stream.Shard], keep: bool = True) -> list[str]:
    return [
        line
        for shard in shards
        for batch in stream.read_text_lines(shard, keep_linebreaks=keep)
        for line in batch
    ]


@pytest.mark.parametrize("count", [1, 2, 3, 7, 50, 400])
def test_byte_ranges_hold_every_line_once(tmp_path: Path, count: int) -> None:
    path = tmp_path / "tricky.txt"
    path.write_bytes(TRICKY_TEXT.encode())
    size = path.stat().st_size
    shards = stream.plan_shards([(str(path), size)], (0, size), readers=count)
    assert len(shards) == count
    assert _read_all(shards) == TRICKY_TEXT.splitlines(keepends=True)
    assert _read_all(shards, keep=False) == TRICKY_TEXT.splitlines()


def test_shards_span_several_files_and_skip_empty_ones(tmp_path: Path) -> None:
    texts = ["one\ntwo\n", "", "three\nfour\nfive\n", "six"]
    files = []
    for index, text in enumerate(texts):
        path = tmp_path / f"part-{index}.txt"
        path.write_text(text)
        files.append((str(path), len(text.encode())))
    total = sum(size for _, size in files)
    for count in (1, 2, 5, 11):
        shards = stream.plan_shards(files, (0, total), readers=count)
        assert _read_all(shards, keep=False) == ["one", "two", "three", "four", "five", "six"]


def test_fsspec_urls_are_read_in_byte_ranges() -> None:
    import fsspec

    memory = fsspec.filesystem("memory")
    memory.pipe("/lmctl-test/corpus.txt", TRICKY_TEXT.encode())
    [url] = stream.expand("memory://lmctl-test/*.txt")
    size = stream.file_size(url)
    assert size == len(TRICKY_TEXT.encode())
    shards = stream.plan_shards([(url, size)], (0, size), readers=4)
    assert _read_all(shards) == TRICKY_TEXT.splitlines(keepends=True)


def test_json_lines_reader(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    records = [{"id": 1, "text": "alpha"}, {"id": 2, "text": None}, {"id": 3, "text": "gamma"}]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    size = path.stat().st_size
    shards = stream.plan_shards([(str(path), size)], (0, size), readers=3)
    texts = [
        text
        for shard in shards
        for batch in stream.read_json_lines(shard, column="text")
        for text in batch
    ]
    assert texts == ["alpha", "", "gamma"]


def _source_texts(source: stream.TextSource) -> list[str]:
    return [text for shard in source.shards for batch in source.read(shard) for text in batch]


def _config(train_file: str, tokenizer: Path, **values: Any) -> ClmConfig:
    return build_config(
        ClmConfig,
        cli_values={
            "train_file": train_file,
            "model_type": "gpt2",
            "tokenizer_name": str(tokenizer),
            "streaming": True,
            "max_steps": 1,
            "do_eval": False,
            **values,
        },
    )


def _line_tokenizer(vocabulary: int) -> Any:
    """One token per line ``w<N>``: a block of size 1 is then exactly one line."""
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import PreTrainedTokenizerFast

    vocab = {f"w{index}": index for index in range(vocabulary)}
    vocab["[UNK]"] = vocabulary
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    return PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")


def _collect(batch: list[dict[str, Any]]) -> list[int]:
    return [example["input_ids"][0] for example in batch]


def _read_as_ranks(
    dataset: Any, how: str, ranks: int = 2, workers: int = 2, collate: Any = _collect
) -> list[list[int]]:
    """Iterate ``dataset`` as each rank would, each with ``workers`` dataloader workers."""
    from torch.utils.data import DataLoader

    seen = []
    for rank in range(ranks):
        if how == "split_dataset_by_node":
            from datasets.distributed import split_dataset_by_node

            loader: Any = DataLoader(
                split_dataset_by_node(dataset, rank=rank, world_size=ranks),
                batch_size=16,
                num_workers=workers,
                collate_fn=collate,
            )
        else:  # what the Trainer does: accelerate prepares the loader, dispatch_batches off
            from accelerate.data_loader import prepare_data_loader

            loader = prepare_data_loader(
                DataLoader(dataset, batch_size=16, num_workers=workers, collate_fn=collate),
                num_processes=ranks,
                process_index=rank,
                put_on_device=False,
                dispatch_batches=False,
            )
        seen.append([token for batch in loader for token in batch])
    return seen


@pytest.mark.parametrize("how", ["split_dataset_by_node", "accelerate"])
@pytest.mark.parametrize("layout", ["many files", "one large file"])
def test_two_ranks_two_workers_read_every_line_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, how: str, layout: str
) -> None:
    lines = 6000
    if layout == "many files":
        sizes = [0, 1, 699, 1300, 4000]  # an empty file and one with a single line too
        start = 0
        for index, count in enumerate(sizes):
            text = "".join(f"w{n}\n" for n in range(start, start + count))
            (tmp_path / f"part-{index}.txt").write_text(text)
            start += count
        train_file = str(tmp_path / "part-*.txt")
    else:
        (tmp_path / "big.txt").write_text("".join(f"w{n}\n" for n in range(lines)))
        train_file = str(tmp_path / "big.txt")
        monkeypatch.setattr(stream, "SHARD_BYTES", 4096)  # a 'large' file of many shards
    monkeypatch.setenv("WORLD_SIZE", "2")
    config = _config(train_file, tmp_path, dataloader_num_workers=2, shuffle_buffer_size=64)
    sources = stream.load_sources(
        config, need_train=True, need_eval=False, text_options={"keep_linebreaks": True}
    )
    assert len(sources["train"].shards) % 4 == 0
    console = Console(OutputOptions(quiet=True))
    streams = stream.block_streams(config, sources, _line_tokenizer(lines), 1, console)

    per_rank = _read_as_ranks(streams["train"], how)

    everything = [token for rank in per_rank for token in rank]
    assert all(per_rank), "every rank reads some data"
    assert len(everything) == len(set(everything)), "a line was read twice"
    assert sorted(everything) == list(range(lines)), "a line was lost"


def test_stream_is_deterministic_for_a_seed(tmp_path: Path) -> None:
    (tmp_path / "c.txt").write_text("".join(f"w{n}\n" for n in range(500)))
    tokenizer = _line_tokenizer(500)
    console = Console(OutputOptions(quiet=True))

    def order(seed: int) -> list[int]:
        config = _config(str(tmp_path / "c.txt"), tmp_path, seed=seed, shuffle_buffer_size=50)
        sources = stream.load_sources(
            config, need_train=True, need_eval=False, text_options={"keep_linebreaks": True}
        )
        train = stream.block_streams(config, sources, tokenizer, 1, console)["train"]
        return [example["input_ids"][0] for example in train]

    first = order(1)
    assert first == order(1)
    assert first != order(2)
    assert sorted(first) == list(range(500))


def test_held_out_part_and_train_part_cover_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text("".join(f"line {n}\n" for n in range(1000)))
    config = _config(str(path), tmp_path, do_eval=True, validation_split_percentage=10)
    sources = stream.load_sources(
        config, need_train=True, need_eval=True, text_options={"keep_linebreaks": False}
    )
    validation = _source_texts(sources["validation"])
    train = _source_texts(sources["train"])
    assert validation + train == [f"line {n}" for n in range(1000)]
    assert 80 <= len(validation) <= 120


def test_blocks_are_the_concatenated_tokens(tmp_path: Path, bpe_tokenizer: Path) -> None:
    from transformers import AutoTokenizer

    lines = [f"Line number {n} of the stream, with some words.\n" for n in range(300)]
    path = tmp_path / "c.txt"
    path.write_text("".join(lines))
    tokenizer = AutoTokenizer.from_pretrained(bpe_tokenizer)
    config = _config(str(path), bpe_tokenizer, shuffle_buffer_size=0)
    sources = stream.load_sources(
        config, need_train=True, need_eval=False, text_options={"keep_linebreaks": True}
    )
    blocks = stream.block_streams(config, sources, tokenizer, 16, Console(OutputOptions()))
    got = [token for example in blocks["train"] for token in example["input_ids"]]
    expected = [token for ids in tokenizer(lines)["input_ids"] for token in ids]
    assert got == expected[: len(expected) // 16 * 16]


def test_line_streams_keep_one_example_per_line(tmp_path: Path, bpe_tokenizer: Path) -> None:
    from transformers import AutoTokenizer

    path = tmp_path / "c.txt"
    path.write_text("short\n\n   \n" + "long " * 100 + "\nlast\n")
    tokenizer = AutoTokenizer.from_pretrained(bpe_tokenizer)
    config = _config(str(path), bpe_tokenizer, shuffle_buffer_size=0)
    sources = stream.load_sources(
        config, need_train=True, need_eval=False, text_options={"keep_linebreaks": False}
    )
    lines = tokenize_lines(config, sources, tokenizer, 8, Console(OutputOptions()))
    examples = list(lines["train"])
    assert len(examples) == 3
    assert max(len(example["input_ids"]) for example in examples) == 8
    assert examples[0]["input_ids"] == tokenizer("short")["input_ids"]


def test_too_little_data_for_one_block_fails_early(tmp_path: Path, bpe_tokenizer: Path) -> None:
    from transformers import AutoTokenizer

    path = tmp_path / "c.txt"
    path.write_text("tiny\n")
    config = _config(str(path), bpe_tokenizer)
    sources = stream.load_sources(
        config, need_train=True, need_eval=False, text_options={"keep_linebreaks": True}
    )
    tokenizer = AutoTokenizer.from_pretrained(bpe_tokenizer)
    with pytest.raises(DataError, match="too few tokens for one block of 64"):
        stream.block_streams(config, sources, tokenizer, 64, Console(OutputOptions(quiet=True)))


def test_tokenizer_sample_reads_the_start_of_the_stream(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text("".join(f"line {n}\n" for n in range(10000)))
    config = _config(str(path), tmp_path)
    sources = stream.load_sources(
        config, need_train=True, need_eval=False, text_options={"keep_linebreaks": False}
    )
    sample = [text for batch in sources["train"].texts(limit_bytes=1000) for text in batch]
    assert sample[0] == "line 0"
    assert len(sample) < 10000


def test_sources_compose_with_partial(tmp_path: Path) -> None:
    """A reader is a partial with everything but the shard bound; the generator too."""
    path = tmp_path / "c.txt"
    path.write_text("a\nb\n")
    config = _config(str(path), tmp_path)
    source = stream.load_sources(
        config, need_train=True, need_eval=False, text_options={"keep_linebreaks": False}
    )["train"]
    assert isinstance(source.read, partial)
    assert source.read.keywords == {"keep_linebreaks": False}
    assert _source_texts(source) == ["a", "b"]
