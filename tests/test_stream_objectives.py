"""``--streaming`` for the objectives that read lines or records: mlm and plm with
``--line-by-line``, and swag. Every example is tokenized as read, the shards are split between
ranks and dataloader workers, and a resumed stream continues exactly."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from lmctl.config.loader import build_config
from lmctl.config.slices import Access, DataSpec, LoopSpec, take
from lmctl.console import Console, OutputOptions
from lmctl.data.stream import readers
from lmctl.data.stream.sources import Readers, load_sources
from lmctl.distributed import world_size
from lmctl.engine import ENGINES
from lmctl.objectives import get_objective
from tests.conftest import TINY_BERT, TINY_XLNET, corpus_lines, lmctl, swag_records, write_jsonl
from tests.test_resume import _max_weight_diff
from tests.test_stream import _line_tokenizer, _read_as_ranks


def _first_tokens(batch: list[dict[str, Any]]) -> list[int]:
    """The first token of every example (of the first choice of a multiple-choice one)."""
    out = []
    for example in batch:
        ids = example["input_ids"]
        out.append(ids[0][0] if isinstance(ids[0], list) else ids[0])
    return out


def _streams(objective: str, train_file: Path, tokenizer: Any, **values: Any) -> Any:
    config = build_config(
        get_objective(objective).config_class,
        cli_values={
            "train_file": str(train_file),
            "model_type": "xlnet" if objective == "plm" else "bert",
            "tokenizer_name": "unused",
            "streaming": True,
            "max_steps": 1,
            "do_eval": False,
            "dataloader_num_workers": 2,
            "shuffle_buffer_size": 16,
            "max_seq_length": 8,
            **values,
        },
    )
    obj = get_objective(objective)
    sources = load_sources(
        take(DataSpec, config),
        take(Access, config),
        Readers(world_size(), config.dataloader_num_workers),
        need_train=True,
        need_eval=False,
        text_options={},
        records=obj.streams_records,
    )
    console = Console(OutputOptions(quiet=True))
    return obj.preprocess(
        take(obj.options_class, config),
        sources,
        tokenizer,
        _NoPositions(),
        console,
        data=take(DataSpec, config),
        loop=take(LoopSpec, config),
    )["train"]


class _NoPositions:
    """A model config without a position limit."""


@pytest.mark.parametrize("objective", ["mlm", "plm", "swag"])
def test_two_ranks_two_workers_read_every_example_once(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, objective: str
) -> None:
    count = 3000
    tokenizer = _line_tokenizer(count)
    tokenizer.pad_token = tokenizer.mask_token = "[UNK]"
    if objective == "swag":
        records = [{"sent1": f"w{n}", "ending0": "w0", "ending1": "w1", "label": 0}
                   for n in range(count)]  # fmt: skip
        train = write_jsonl(tmp_path / "train.jsonl", records)
        values: dict[str, Any] = {"ending_columns": "ending0,ending1"}
    else:
        train = tmp_path / "train.txt"
        train.write_text("".join(f"w{n}\n\n" for n in range(count)))  # blank lines skipped
        values = {"line_by_line": True}
    monkeypatch.setattr(readers, "SHARD_BYTES", 4096)
    monkeypatch.setenv("WORLD_SIZE", "2")
    dataset = _streams(objective, train, tokenizer, **values)

    per_rank = _read_as_ranks(dataset, "accelerate", collate=_first_tokens)

    everything = [token for rank in per_rank for token in rank]
    assert all(per_rank), "every rank reads some data"
    assert sorted(everything) == list(range(count)), "an example was lost or read twice"


def _objective_args(
    objective: str, data: dict[str, tuple[Path, Path]], wordpiece: Path
) -> list[str | Path]:
    if objective == "swag":
        train, valid = data["swag"]
        return [*TINY_BERT, "--tokenizer-name", wordpiece, "--train-file", train,
                "--validation-file", valid, "--max-seq-length", "32"]  # fmt: skip
    train, valid = data["lines"]
    model = TINY_BERT if objective == "mlm" else TINY_XLNET
    return [*model, "--tokenizer-name", wordpiece, "--train-file", train,
            "--validation-file", valid, "--line-by-line", "--max-seq-length", "32"]  # fmt: skip


@pytest.fixture(scope="module")
def small_data(tmp_path_factory: pytest.TempPathFactory) -> dict[str, tuple[Path, Path]]:
    """Little data, so that 12 steps of 4 examples read it more than once."""
    folder = tmp_path_factory.mktemp("stream-objectives")
    # No title lines of two or three tokens: a permutation batch of those alone can have no
    # target position at all, and then no loss.
    lines = [line for line in corpus_lines() if len(line.split()) >= 6]
    train, valid = folder / "train.txt", folder / "valid.txt"
    train.write_text("".join(f"{line}\n\n" for line in lines[:20]))
    valid.write_text("\n".join(lines[20:40]) + "\n")
    swag = (
        write_jsonl(folder / "train.jsonl", swag_records(20, seed=1)),
        write_jsonl(folder / "valid.jsonl", swag_records(12, seed=2)),
    )
    return {"lines": (train, valid), "swag": swag}


def _losses(run: Path) -> dict[int, float]:
    records = [json.loads(line) for line in (run / "metrics.jsonl").open()]
    return {r["step"]: r["loss"] for r in records if "loss" in r}


@pytest.mark.e2e
@pytest.mark.slow
@pytest.mark.parametrize("engine", list(ENGINES))
@pytest.mark.parametrize("objective", ["mlm", "plm", "swag"])
def test_streamed_run_trains_and_resumes_exactly(
    objective: str,
    engine: str,
    small_data: dict[str, tuple[Path, Path]],
    wordpiece_tokenizer: Path,
    tmp_path: Path,
) -> None:
    run = [
        "train", objective, "--engine", engine,
        *_objective_args(objective, small_data, wordpiece_tokenizer),
        "--streaming", "--max-steps", "12", "--save-steps", "6", "--logging-steps", "1",
        "--per-device-train-batch-size", "4", "--max-eval-samples", "8",
        "--dataloader-num-workers", "2", "--json",
    ]  # fmt: skip
    first = tmp_path / "first"
    proc = lmctl(*run, "-o", first)
    assert proc.returncode == 0, proc.stderr
    assert json.loads(proc.stdout)["global_step"] == 12
    assert "streaming" in proc.stderr
    results = json.loads((first / "all_results.json").read_text())
    assert results["eval_samples"] == 8
    assert (first / "model.safetensors").is_file()

    second = tmp_path / "second"
    proc = lmctl(*run, "-o", second, "--resume-from-checkpoint", first / "checkpoint-6")
    assert proc.returncode == 0, proc.stderr
    resumed = _losses(second)
    assert sorted(resumed) == list(range(7, 13))
    original = _losses(first)
    assert [resumed[step] for step in resumed] == [original[step] for step in resumed]
    assert _max_weight_diff(first, second) == 0.0


@pytest.mark.parametrize(
    "objective,flags",
    [
        ("mlm", ["--line-by-line", "--streaming"]),
        ("plm", ["--line-by-line", "--streaming"]),
        ("swag", ["--streaming"]),
        ("mlm", ["--line-by-line"]),
    ],
)
def test_streamed_data_problems_fail_before_training(
    objective: str, flags: list[str], wordpiece_tokenizer: Path, tmp_path: Path
) -> None:
    """Data that gives no example (only blank lines), or a record missing a column, is a data
    error (exit 3) before any training."""
    if objective == "swag":
        train = write_jsonl(tmp_path / "t.jsonl", [{"sent1": "a", "ending0": "b", "label": 0}])
        needle = "no column 'ending1'"
    else:
        train = tmp_path / "t.txt"
        train.write_text("\n   \n\n")
        needle = "no non-empty lines"
    model = TINY_XLNET if objective == "plm" else TINY_BERT
    proc = lmctl(
        "train", objective, *model, "--tokenizer-name", wordpiece_tokenizer, *flags,
        "--train-file", train, "--no-eval", "--max-steps", "2",
        "--max-seq-length", "32", "-o", tmp_path / "run",
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert needle in proc.stderr and "Traceback" not in proc.stderr
    assert not (tmp_path / "run").exists()
