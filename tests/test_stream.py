"""Streaming: byte-range shards, disjoint reading across ranks and dataloader workers,
hold-out, readers for each format, determinism (what exact resume relies on)."""

from __future__ import annotations

import json
from functools import partial
from pathlib import Path
from typing import Any

import pytest

from lmctl.config.loader import build_config
from lmctl.config.slices import Access, DataSpec, LoopSpec, take
from lmctl.console import Console, OutputOptions
from lmctl.data import stream
from lmctl.data.stream import positions, readers
from lmctl.data.stream.sources import Readers, TextSource, load_sources
from lmctl.distributed import world_size
from lmctl.errors import ConfigError, DataError
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
        for _, batch in readers.read_text_lines(shard, keep_linebreaks=keep)
        for line in batch
    ]


@pytest.mark.parametrize("count", [1, 2, 3, 7, 50, 400])
def test_byte_ranges_hold_every_line_once(tmp_path: Path, count: int) -> None:
    path = tmp_path / "tricky.txt"
    path.write_bytes(TRICKY_TEXT.encode())
    size = path.stat().st_size
    shards = readers.plan_shards([(str(path), size)], (0, size), readers=count)
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
        shards = readers.plan_shards(files, (0, total), readers=count)
        assert _read_all(shards, keep=False) == ["one", "two", "three", "four", "five", "six"]


def test_fsspec_urls_are_read_in_byte_ranges() -> None:
    import fsspec

    memory = fsspec.filesystem("memory")
    memory.pipe("/lmctl-test/corpus.txt", TRICKY_TEXT.encode())
    [url] = readers.expand("memory://lmctl-test/*.txt")
    size = readers.file_size(url)
    assert size == len(TRICKY_TEXT.encode())
    shards = readers.plan_shards([(url, size)], (0, size), readers=4)
    assert _read_all(shards) == TRICKY_TEXT.splitlines(keepends=True)


def test_json_lines_reader(tmp_path: Path) -> None:
    path = tmp_path / "data.jsonl"
    records = [{"id": 1, "text": "alpha"}, {"id": 2, "text": None}, {"id": 3, "text": "gamma"}]
    path.write_text("\n".join(json.dumps(r) for r in records) + "\n\n")
    size = path.stat().st_size
    shards = readers.plan_shards([(str(path), size)], (0, size), readers=3)
    texts = [
        text
        for shard in shards
        for _, batch in readers.read_json_lines(shard, column="text")
        for text in batch
    ]
    assert texts == ["alpha", "", "gamma"]


def _source_texts(source: TextSource) -> list[str]:
    return [text for shard in source.shards for _, batch in source.read(shard) for text in batch]


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
        monkeypatch.setattr(readers, "SHARD_BYTES", 4096)  # a 'large' file of many shards
    monkeypatch.setenv("WORLD_SIZE", "2")
    config = _config(train_file, tmp_path, dataloader_num_workers=2, shuffle_buffer_size=64)
    sources = load_sources(
        take(DataSpec, config),
        take(Access, config),
        Readers(world_size(), config.dataloader_num_workers),
        need_train=True,
        need_eval=False,
        text_options={"keep_linebreaks": True},
    )
    assert len(sources["train"].shards) % 4 == 0
    console = Console(OutputOptions(quiet=True))
    streams = stream.block_streams(
        take(DataSpec, config), sources, _line_tokenizer(lines), 1, console, seed=config.seed
    )

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
        sources = load_sources(
            take(DataSpec, config),
            take(Access, config),
            Readers(world_size(), config.dataloader_num_workers),
            need_train=True,
            need_eval=False,
            text_options={"keep_linebreaks": True},
        )
        train = stream.block_streams(
            take(DataSpec, config), sources, tokenizer, 1, console, seed=config.seed
        )["train"]
        return [example["input_ids"][0] for example in train]

    first = order(1)
    assert first == order(1)
    assert first != order(2)
    assert sorted(first) == list(range(500))


def test_held_out_part_and_train_part_cover_the_file(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text("".join(f"line {n}\n" for n in range(1000)))
    config = _config(str(path), tmp_path, do_eval=True, validation_split_percentage=10)
    sources = load_sources(
        take(DataSpec, config),
        take(Access, config),
        Readers(world_size(), config.dataloader_num_workers),
        need_train=True,
        need_eval=True,
        text_options={"keep_linebreaks": False},
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
    sources = load_sources(
        take(DataSpec, config),
        take(Access, config),
        Readers(world_size(), config.dataloader_num_workers),
        need_train=True,
        need_eval=False,
        text_options={"keep_linebreaks": True},
    )
    blocks = stream.block_streams(
        take(DataSpec, config), sources, tokenizer, 16, Console(OutputOptions()), seed=config.seed
    )
    got = [token for example in blocks["train"] for token in example["input_ids"]]
    expected = [token for ids in tokenizer(lines)["input_ids"] for token in ids]
    assert got == expected[: len(expected) // 16 * 16]


def test_line_streams_keep_one_example_per_line(tmp_path: Path, bpe_tokenizer: Path) -> None:
    from transformers import AutoTokenizer

    path = tmp_path / "c.txt"
    path.write_text("short\n\n   \n" + "long " * 100 + "\nlast\n")
    tokenizer = AutoTokenizer.from_pretrained(bpe_tokenizer)
    config = _config(str(path), bpe_tokenizer, shuffle_buffer_size=0)
    sources = load_sources(
        take(DataSpec, config),
        take(Access, config),
        Readers(world_size(), config.dataloader_num_workers),
        need_train=True,
        need_eval=False,
        text_options={"keep_linebreaks": False},
    )
    lines = tokenize_lines(
        sources,
        tokenizer,
        8,
        Console(OutputOptions()),
        data=take(DataSpec, config),
        loop=take(LoopSpec, config),
        text_options={"keep_linebreaks": True},
    )
    examples = list(lines["train"])
    assert len(examples) == 3
    assert max(len(example["input_ids"]) for example in examples) == 8
    assert examples[0]["input_ids"] == tokenizer("short")["input_ids"]


def test_too_little_data_for_one_block_fails_early(tmp_path: Path, bpe_tokenizer: Path) -> None:
    from transformers import AutoTokenizer

    path = tmp_path / "c.txt"
    path.write_text("tiny\n")
    config = _config(str(path), bpe_tokenizer)
    sources = load_sources(
        take(DataSpec, config),
        take(Access, config),
        Readers(world_size(), config.dataloader_num_workers),
        need_train=True,
        need_eval=False,
        text_options={"keep_linebreaks": True},
    )
    tokenizer = AutoTokenizer.from_pretrained(bpe_tokenizer)
    with pytest.raises(DataError, match="too few tokens for one block of 64"):
        stream.block_streams(
            take(DataSpec, config),
            sources,
            tokenizer,
            64,
            Console(OutputOptions(quiet=True)),
            seed=config.seed,
        )


def test_tokenizer_sample_reads_the_start_of_the_stream(tmp_path: Path) -> None:
    path = tmp_path / "c.txt"
    path.write_text("".join(f"line {n}\n" for n in range(10000)))
    config = _config(str(path), tmp_path)
    sources = load_sources(
        take(DataSpec, config),
        take(Access, config),
        Readers(world_size(), config.dataloader_num_workers),
        need_train=True,
        need_eval=False,
        text_options={"keep_linebreaks": False},
    )
    sample = [text for batch in sources["train"].texts(limit_bytes=1000) for text in batch]
    assert sample[0] == "line 0"
    assert len(sample) < 10000


def test_sources_compose_with_partial(tmp_path: Path) -> None:
    """A reader is a partial with everything but the shard bound; the generator too."""
    path = tmp_path / "c.txt"
    path.write_text("a\nb\n")
    config = _config(str(path), tmp_path)
    source = load_sources(
        take(DataSpec, config),
        take(Access, config),
        Readers(world_size(), config.dataloader_num_workers),
        need_train=True,
        need_eval=False,
        text_options={"keep_linebreaks": False},
    )["train"]
    assert isinstance(source.read, partial)
    assert source.read.keywords == {"keep_linebreaks": False}
    assert _source_texts(source) == ["a", "b"]


def _tensor_batch(features: list[dict[str, Any]]) -> dict[str, Any]:
    import torch

    return {"input_ids": torch.tensor([feature["input_ids"] for feature in features])}


def _line_ids(texts: list[str]) -> dict[str, list[Any]]:
    """One example per non-blank line ``w<N>``: its number."""
    return {"input_ids": [[int(text.strip()[1:])] for text in texts if text.strip()]}


def _train_stream(kind: str, tmp_path: Path, lines: int, **values: Any) -> Any:
    """A training stream of ``lines`` numbered lines (blank lines between some): blocks of
    three lines, one example per line, or one per csv record (read through ``datasets``)."""
    if kind == "records":
        path = tmp_path / "numbers-*.csv"  # three files: three shards
        for part in range(3):
            numbers = range(part * lines // 3, (part + 1) * lines // 3)
            (tmp_path / f"numbers-{part}.csv").write_text(
                "text\n" + "".join(f"w{n}\n" for n in numbers)
            )
    else:
        path = tmp_path / "numbers.txt"
        if not path.exists():
            text = "".join(f"w{n}\n" + ("\n" if n % 5 == 0 else "") for n in range(lines))
            path.write_text(text)
    config = _config(str(path), tmp_path, **values)
    sources = load_sources(
        take(DataSpec, config),
        take(Access, config),
        Readers(world_size(), config.dataloader_num_workers),
        need_train=True,
        need_eval=False,
        text_options={"keep_linebreaks": True},
    )
    console = Console(OutputOptions(quiet=True))
    if kind == "blocks":
        return stream.block_streams(
            take(DataSpec, config), sources, _line_tokenizer(lines), 3, console, seed=config.seed
        )["train"]
    return stream.example_streams(
        take(DataSpec, config),
        sources,
        {"train": _line_ids},
        console,
        seed=config.seed,
        unit="line",
    )["train"]


def _loader(dataset: Any, workers: int) -> Any:
    from torch.utils.data import DataLoader

    from lmctl.objectives.collate import SeededCollator

    collate = SeededCollator(_tensor_batch, seed=0)
    return DataLoader(dataset, batch_size=4, num_workers=workers, collate_fn=collate)


@pytest.mark.parametrize("kind", ["blocks", "lines", "records"])
@pytest.mark.parametrize("workers", [0, 2])
def test_a_resumed_stream_seeks_to_each_workers_position(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, kind: str, workers: int
) -> None:
    """Stopped after any batch (within a shuffle window, at a chunk boundary, after a worker
    ran out), a new stream given the positions yields placeholders for the batches trained
    before, then exactly the batches of the uninterrupted pass."""
    monkeypatch.setattr(readers, "SHARD_BYTES", 1500)  # several shards per worker
    monkeypatch.setattr(readers, "READ_BYTES", 200)  # many chunks per shard; blocks span them
    values = {"dataloader_num_workers": workers, "shuffle_buffer_size": 7, "seed": 3}
    first = _train_stream(kind, tmp_path, 900, **values)
    cursor = positions.stream_cursor(first)
    assert cursor is not None
    cursor.begin_pass(1)
    batches, states = [], []
    for batch in _loader(first, workers):
        cursor.take(batch)
        assert positions.POSITION_COLUMN not in batch
        batches.append(batch["input_ids"].tolist())
        states.append(json.loads(json.dumps(cursor.state())))  # as a checkpoint keeps it
    numbers = [n for batch in batches for row in batch for n in row]
    assert len(set(numbers)) == len(numbers), "a line was read twice"
    shards = len(cursor.plan.shards)
    assert shards >= (2 if kind == "records" else 4)
    assert len(numbers) >= 900 - 2 * shards, "more lost than each shard's last partial block"

    for stop in (1, 2, 7, len(batches) // 2, len(batches) - 3, len(batches) - 1):
        again = _train_stream(kind, tmp_path, 900, **values)
        resumed = positions.stream_cursor(again)
        assert resumed is not None
        resumed.restore(1, states[stop - 1])
        resumed.begin_pass(1)
        rest = []
        for index, batch in enumerate(_loader(again, workers)):
            if index < stop:
                assert batch[positions.POSITION_COLUMN][0, 0] == -1, "not a placeholder"
                continue
            resumed.take(batch)
            rest.append(batch["input_ids"].tolist())
        assert rest == batches[stop:], f"stopped after batch {stop}"
        assert resumed.state() == states[-1]


def test_each_pass_shuffles_anew_and_resume_reads_a_bounded_amount(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    """Resuming far into a pass tokenizes no more than resuming near its start: one chunk
    and one shuffle window, not the part of the pass already trained on."""
    from lmctl.data.tokens import TextEncoder

    monkeypatch.setattr(readers, "READ_BYTES", 300)
    values = {"shuffle_buffer_size": 16, "seed": 5}
    first = _train_stream("blocks", tmp_path, 3000, **values)
    cursor = positions.stream_cursor(first)
    assert cursor is not None
    orders, states = [], []
    for epoch in (0, 1):
        cursor.begin_pass(epoch)
        order = []
        for batch in _loader(first, 0):
            cursor.take(batch)
            order.extend(n for row in batch["input_ids"].tolist() for n in row)
            if epoch == 0:
                states.append(cursor.state())
        orders.append(order)
    assert orders[0] != orders[1] and sorted(orders[0]) == sorted(orders[1])

    encoded: list[int] = []
    encode_raw = TextEncoder.encode_raw

    def counting(self: TextEncoder, texts: list[str]) -> Any:
        encoded.append(len(texts))
        return encode_raw(self, texts)

    monkeypatch.setattr(TextEncoder, "encode_raw", counting)
    read_again = {}
    for stop in (10, len(states) - 10):
        again = _train_stream("blocks", tmp_path, 3000, **values)
        resumed = positions.stream_cursor(again)
        assert resumed is not None
        resumed.restore(0, states[stop - 1])
        resumed.begin_pass(0)
        encoded.clear()
        loader = iter(_loader(again, 0))
        for _ in range(stop):
            next(loader)
        first_batch = next(loader)
        assert first_batch["input_ids"].flatten().tolist() == orders[0][stop * 12 : stop * 12 + 12]
        read_again[stop] = sum(encoded)
    lines_per_chunk = 300 // len("w1000\n")
    # The window's blocks of three lines, the chunks it spans and the one read ahead.
    bound = 16 * 3 + 4 * lines_per_chunk
    assert all(count <= bound for count in read_again.values()), read_again
    assert max(read_again.values()) < (len(states) - 10) * 12 // 10, "replayed the pass"


@pytest.mark.parametrize(
    "change,flag",
    [({"dataloader_num_workers": 2}, "--dataloader-num-workers 0"),
     ({"shuffle_buffer_size": 9}, "--shuffle-buffer-size 7")],
)  # fmt: skip
def test_positions_are_refused_by_a_stream_laid_out_otherwise(
    tmp_path: Path, change: dict[str, Any], flag: str
) -> None:
    values = {"dataloader_num_workers": 0, "shuffle_buffer_size": 7}
    first = _train_stream("lines", tmp_path, 200, **values)
    cursor = positions.stream_cursor(first)
    assert cursor is not None
    cursor.begin_pass(0)
    batch = next(iter(_loader(first, 0)))
    cursor.take(batch)
    other = positions.stream_cursor(_train_stream("lines", tmp_path, 200, **{**values, **change}))
    assert other is not None
    with pytest.raises(ConfigError) as raised:
        other.restore(0, cursor.state(), cursor.layout())
    assert flag in raised.value.hint


def test_a_checkpoint_keeps_each_readers_position(tmp_path: Path) -> None:
    from lmctl.data.stream.positions import StreamRecord

    readers = {"0:3": [16, 0, 128, 5, 2], "1:0": [12, -1, 0, 0, 12]}
    record = StreamRecord(2, 8, readers, {"workers": 2, "window": 7, "shards": 4})
    record.write(tmp_path, 1)
    assert StreamRecord.read(tmp_path, 1) == record
    assert StreamRecord.read(tmp_path, 0) is None  # each process reads its own
