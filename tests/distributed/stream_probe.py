"""Run under torchrun: train a tiny model with the Trainer on a lmctl stream whose lines are
one token each; record which lines this rank trained on and which shards its dataloader
workers opened.

    torchrun --nproc_per_node 2 tests/distributed/stream_probe.py CORPUS OUT_DIR LINES
"""

from __future__ import annotations

import json
import os
import sys
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import Any


def recording_read(
    shard: Any,
    start: Any = None,
    *,
    read: Callable[..., Iterator[tuple[Any, list[str]]]],
    log: Path,
) -> Any:
    """The source's reader, noting which process opened which shard."""
    with (log / f"reads-{os.environ['RANK']}-{os.getpid()}.txt").open("a") as handle:
        handle.write(f"{shard[0].start}\n")
    yield from read(shard, start)


def main() -> None:
    corpus, out, lines = sys.argv[1], Path(sys.argv[2]), int(sys.argv[3])
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import GPT2Config, GPT2LMHeadModel, PreTrainedTokenizerFast, Trainer

    from lmctl.config.loader import build_config
    from lmctl.config.slices import Access, DataSpec, slice_config, take
    from lmctl.console import Console, OutputOptions
    from lmctl.data import stream
    from lmctl.data.stream.sources import Readers, load_sources
    from lmctl.distributed import world_size
    from lmctl.engine.trainer import training_arguments
    from lmctl.objectives.clm import ClmConfig, ClmOptions
    from lmctl.objectives.collate import BlockCollator
    from lmctl.run.runtime import resolve_runtime

    vocab = {f"w{index}": index for index in range(lines)}
    vocab["[UNK]"] = lines
    backend = Tokenizer(models.WordLevel(vocab, unk_token="[UNK]"))
    backend.pre_tokenizer = pre_tokenizers.Whitespace()
    tokenizer = PreTrainedTokenizerFast(tokenizer_object=backend, unk_token="[UNK]")

    config = build_config(
        ClmConfig,
        cli_values={
            "train_file": corpus,
            "model_type": "gpt2",
            "tokenizer_name": str(out),
            "streaming": True,
            "max_steps": 10,
            "do_eval": False,
            "per_device_train_batch_size": 4,
            "dataloader_num_workers": 2,
            "save_strategy": "no",
            "output_dir": str(out),
        },
    )
    sources = load_sources(
        take(DataSpec, config),
        take(Access, config),
        Readers(world_size(), config.dataloader_num_workers),
        need_train=True,
        need_eval=False,
        text_options={"keep_linebreaks": True},
    )
    source = sources["train"]
    shard_lines = {
        shard[0].start: [int(text.strip()[1:]) for _, batch in source.read(shard) for text in batch]
        for shard in source.shards
    }
    source.read = partial(recording_read, read=source.read, log=out)
    console = Console(OutputOptions(quiet=True))
    train = stream.block_streams(
        take(DataSpec, config), sources, tokenizer, 4, console, seed=config.seed
    )["train"]
    model = GPT2LMHeadModel(GPT2Config(vocab_size=lines + 1, n_layer=1, n_embd=8, n_head=2))
    seen: list[int] = []

    class Recording(Trainer):
        def training_step(self, model: Any, inputs: Any, num_items_in_batch: Any = None) -> Any:
            seen.extend(inputs["input_ids"].reshape(-1).tolist())
            return super().training_step(model, inputs, num_items_in_batch)

    spec = slice_config(config, ClmOptions)
    args = training_arguments(spec, resolve_runtime(spec, out, console), out)
    trainer = Recording(model=model, args=args, train_dataset=train, data_collator=BlockCollator())
    trainer.train()
    rank = os.environ["RANK"]
    result = {"seen": seen, "shards": shard_lines, "main_pid": os.getpid()}
    (out / f"rank{rank}.json").write_text(json.dumps(result))


if __name__ == "__main__":
    from lmctl.run.launch import end_launched_process

    main()
    # End as lmctl's own launched processes do: torch's native teardown at interpreter
    # shutdown now and then aborts a rank after a run that succeeded.
    end_launched_process(0)
