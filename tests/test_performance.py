"""Speed features keep results correct: length-grouped batches, mixed precision, fused AdamW,
evaluation that reduces logits to predictions, tokenizer threads around forked workers."""

from __future__ import annotations

import json
import os
from pathlib import Path
from typing import Any

import pytest

from lmctl.config.loader import build_config
from lmctl.errors import ConfigError
from lmctl.objectives.clm import ClmConfig
from tests.conftest import TINY_BERT, TINY_GPT2, lmctl, sliced, slow_except


def test_length_grouped_epochs_are_permutations_replayable_by_epoch() -> None:
    import random

    from lmctl.data.batching import LengthGroupedSampler

    rng = random.Random(0)
    lengths = [rng.randint(3, 120) for _ in range(999)]
    sampler = LengthGroupedSampler(lengths, batch_size=8, seed=42)
    epochs = []
    for epoch in range(3):
        sampler.set_epoch(epoch)
        order = list(sampler)
        assert sorted(order) == list(range(len(lengths)))  # every sample once per epoch
        epochs.append(order)
    assert epochs[0] != epochs[1] != epochs[2]
    sampler.set_epoch(1)
    assert list(sampler) == epochs[1]  # an epoch is replayed exactly (resume)

    def padding(order: list[int]) -> int:
        batches = [order[i : i + 8] for i in range(0, len(order), 8)]
        return sum(
            max(lengths[i] for i in b) * len(b) - sum(map(lengths.__getitem__, b)) for b in batches
        )

    shuffled = list(range(len(lengths)))
    random.Random(1).shuffle(shuffled)
    assert padding(epochs[0]) < padding(shuffled) / 5


def test_length_grouping_keeps_every_sample_equally_likely_in_every_batch() -> None:
    """In expectation over seeds, each sample lands in each part of the epoch equally often
    (the longest batch always goes first, as the Trainer does, so that part is excluded)."""
    import random

    from lmctl.data.batching import LengthGroupedSampler

    rng = random.Random(3)
    lengths = [rng.randint(3, 60) for _ in range(400)]
    first_half = [0] * len(lengths)
    seeds = 300
    for seed in range(seeds):
        order = list(LengthGroupedSampler(lengths, batch_size=8, seed=seed))
        for index in order[8 : len(order) // 2 + 4]:
            first_half[index] += 1
    longest_first = set(sorted(range(len(lengths)), key=lengths.__getitem__)[-8:])
    shares = [count / seeds for i, count in enumerate(first_half) if i not in longest_first]
    assert abs(sum(shares) / len(shares) - 0.49) < 0.02
    assert max(abs(share - 0.49) for share in shares) < 0.2


def test_sample_lengths_read_the_arrow_column() -> None:
    import datasets

    from lmctl.data.batching import sample_lengths

    flat = datasets.Dataset.from_dict({"input_ids": [[1, 2, 3], [4], [5, 6]]})
    assert sample_lengths(flat) == [3, 1, 2]
    assert sample_lengths(flat.select([2, 0])) == [2, 3]
    choices = datasets.Dataset.from_dict({"input_ids": [[[1, 2], [3]], [[4], [5, 6, 7]]]})
    assert sample_lengths(choices) == [2, 3]


def test_grouping_is_off_by_default_as_upstream_and_on_when_asked(tmp_path: Path) -> None:
    """Length grouping changes what a step learns (at equal steps, mlm line by line learned
    less with it), so like upstream it is off unless --group-by-length asks for it."""
    from lmctl.objectives import get_objective
    from lmctl.objectives.mlm import MlmConfig
    from lmctl.objectives.swag import SwagConfig

    train = tmp_path / "t.txt"
    train.write_text("a\n")
    swag = tmp_path / "s.jsonl"
    swag.write_text("{}\n")
    base = {
        "model_type": "bert",
        "tokenizer_name": "tok",
        "train_file": str(train),
        "do_eval": False,
    }
    mlm = get_objective("mlm")
    line_by_line = {**base, "line_by_line": True}
    assert not mlm.groups_by_length(
        build_config(MlmConfig, cli_values=line_by_line).group_by_length
    )
    assert not mlm.groups_by_length(build_config(MlmConfig, cli_values=base).group_by_length)
    assert mlm.groups_by_length(
        build_config(
            MlmConfig, cli_values={**line_by_line, "group_by_length": True}
        ).group_by_length
    )
    swag_values = {**base, "train_file": str(swag)}
    assert not get_objective("swag").groups_by_length(
        build_config(SwagConfig, cli_values=swag_values).group_by_length
    )
    assert get_objective("swag").groups_by_length(
        build_config(
            SwagConfig, cli_values={**swag_values, "group_by_length": True}
        ).group_by_length
    )
    clm_config = build_config(ClmConfig, cli_values={**base, "model_type": "gpt2"})
    assert not get_objective("clm").groups_by_length(clm_config.group_by_length)


def _minimal(train: Path) -> dict[str, Any]:
    return {"model_type": "gpt2", "tokenizer_name": "tok", "train_file": str(train)}


@pytest.mark.parametrize(
    "values,native,expected",
    [
        ({}, True, None),
        ({"precision": "auto"}, True, "bf16"),
        ({"precision": "auto"}, False, None),
        ({"precision": "fp32"}, True, None),
        ({"precision": "bf16"}, False, "bf16"),
        ({"bf16": True}, False, "bf16"),
        ({"fp16": True, "precision": "fp16"}, False, "fp16"),
    ],
)
def test_precision_resolution(
    tmp_path: Path, values: dict[str, Any], native: bool, expected: str | None
) -> None:
    train = tmp_path / "t.txt"
    train.write_text("a\n")
    config = build_config(ClmConfig, cli_values={**_minimal(train), **values})
    assert config.mixed_precision(lambda: native) == expected


def test_precision_contradicting_bf16_is_a_config_error(tmp_path: Path) -> None:
    train = tmp_path / "t.txt"
    train.write_text("a\n")
    with pytest.raises(ConfigError, match="--precision fp32 contradicts --bf16"):
        build_config(ClmConfig, cli_values={**_minimal(train), "precision": "fp32", "bf16": True})


def test_fused_adamw_takes_the_same_steps_as_the_loop(tmp_path: Path) -> None:
    import torch

    from lmctl.engine.optim import make_optimizer
    from lmctl.fastpaths.table import fused_adamw_available

    if not fused_adamw_available("cpu"):
        pytest.skip("no fused AdamW kernel for this device in this torch build")
    train = tmp_path / "t.txt"
    train.write_text("a\n")
    values = {**_minimal(train), "learning_rate": 1e-2, "weight_decay": 0.1}
    config = build_config(ClmConfig, cli_values=values)
    torch.manual_seed(0)
    reference = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32))
    fused_model = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.LayerNorm(32))
    fused_model.load_state_dict(reference.state_dict())
    fused = make_optimizer(sliced(config).optimizer, {}, fused_model, fused=True)
    assert fused.defaults["fused"]
    stock = make_optimizer(sliced(config).optimizer, {}, reference, fused=False)
    assert stock.defaults["fused"] is None and stock.defaults["foreach"] is None
    loop = torch.optim.AdamW(
        [{"params": g["params"], "weight_decay": g["weight_decay"]} for g in _groups(reference)],
        lr=1e-2,
        foreach=False,
    )
    inputs = torch.randn(8, 16)
    for _ in range(5):
        for model, optimizer in ((reference, loop), (fused_model, fused)):
            optimizer.zero_grad()
            model(inputs).pow(2).mean().backward()
            optimizer.step()
    for a, b in zip(reference.parameters(), fused_model.parameters(), strict=True):
        assert (a - b).abs().max() < 1e-5, (a - b).abs().max()


def _groups(model: Any) -> list[dict[str, Any]]:
    from lmctl.engine.optim import parameter_groups

    return parameter_groups(model, 0.1)


def test_accuracy_from_predictions_equals_accuracy_from_logits() -> None:
    import torch

    from lmctl.metrics import BatchMetrics, reduce_logits
    from lmctl.objectives.collate import masked_positions

    torch.manual_seed(0)
    logits = torch.randn(3, 7, 11)
    labels = torch.randint(0, 11, (3, 7))
    labels[0, :3] = -100
    from_logits, from_predictions = BatchMetrics(masked_positions), BatchMetrics(masked_positions)
    from_logits.update(logits, labels)
    predictions = reduce_logits(logits, labels)
    assert predictions.dtype == torch.long and predictions.shape == labels.shape
    from_predictions.update(predictions, labels)
    scored = labels != -100
    expected = int((logits.argmax(-1) == labels)[scored].sum()) / int(scored.sum())
    assert from_logits.compute() == from_predictions.compute() == {"accuracy": expected}


def test_forked_workers_turn_tokenizer_threads_off_only_meanwhile(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lmctl.data.tokens import forked_workers

    monkeypatch.delenv("TOKENIZERS_PARALLELISM", raising=False)
    with forked_workers():
        assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    assert "TOKENIZERS_PARALLELISM" not in os.environ
    monkeypatch.setenv("TOKENIZERS_PARALLELISM", "true")
    with forked_workers():
        assert os.environ["TOKENIZERS_PARALLELISM"] == "false"
    assert os.environ["TOKENIZERS_PARALLELISM"] == "true"


def test_default_run_leaves_tokenizer_threads_on() -> None:
    import subprocess
    import sys

    code = (
        "import os; from lmctl.data.load import silence_libraries; silence_libraries(); "
        "print(os.environ.get('TOKENIZERS_PARALLELISM'))"
    )
    env = {k: v for k, v in os.environ.items() if k != "TOKENIZERS_PARALLELISM"}
    out = subprocess.run(
        [sys.executable, "-c", code], env=env, capture_output=True, text=True, check=True
    )
    assert out.stdout.strip() == "None"


def _final(run: Path) -> dict[str, Any]:
    results: dict[str, Any] = json.loads((run / "all_results.json").read_text())
    return results


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("engine", slow_except(["trainer", "accelerate"], "trainer"))
def test_mlm_loss_with_length_grouping_matches_random_batches(
    tmp_path: Path, text_files: tuple[Path, Path], wordpiece_tokenizer: Path, engine: str
) -> None:
    train, valid = text_files
    losses = {}
    for grouping in ("--group-by-length", "--no-group-by-length"):
        out = tmp_path / grouping
        proc = lmctl(
            "train", "mlm", *TINY_BERT, "--tokenizer-name", wordpiece_tokenizer,
            "--train-file", train, "--validation-file", valid, "--line-by-line",
            "--max-seq-length", "64", "--max-train-samples", "128", "--max-eval-samples", "32",
            "--num-train-epochs", "2", "--learning-rate", "2e-3",
            "--engine", engine, grouping, "-o", out, cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        losses[grouping] = _final(out)
    grouped, plain = losses["--group-by-length"], losses["--no-group-by-length"]
    assert grouped["train_loss"] == pytest.approx(plain["train_loss"], rel=0.05)
    assert grouped["eval_loss"] == pytest.approx(plain["eval_loss"], rel=0.05)


@pytest.mark.slow
@pytest.mark.e2e
@pytest.mark.parametrize("engine", slow_except(["trainer", "accelerate"], "trainer"))
def test_bf16_loss_curve_stays_within_tolerance_of_fp32(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path, engine: str
) -> None:
    train, valid = text_files
    curves = {}
    for precision in ("fp32", "bf16"):
        out = tmp_path / precision
        proc = lmctl(
            "train", "clm", *TINY_GPT2, "--tokenizer-name", bpe_tokenizer, "--train-file", train,
            "--validation-file", valid, "--block-size", "64", "--max-steps", "30",
            "--max-eval-samples", "16",
            "--logging-steps", "5", "--learning-rate", "2e-3", "--precision", precision,
            "--engine", engine, "-o", out, cwd=tmp_path,
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        records = [json.loads(line) for line in (out / "metrics.jsonl").read_text().splitlines()]
        curves[precision] = [r["loss"] for r in records if "loss" in r]
        curves[precision + "-eval"] = [_final(out)["eval_loss"]]
    assert len(curves["fp32"]) == len(curves["bf16"]) == 6
    for fp32, bf16 in zip(curves["fp32"], curves["bf16"], strict=True):
        assert bf16 == pytest.approx(fp32, rel=0.03)
    assert curves["bf16-eval"][0] == pytest.approx(curves["fp32-eval"][0], rel=0.03)


@pytest.mark.parametrize("kind", ["clm", "mlm", "swag"])
def test_evaluation_one_sample_at_a_time_gives_the_batch_loss(kind: str) -> None:
    import torch
    import transformers

    from lmctl.evaluation.loop import batch_loss
    from lmctl.metrics import BatchMetrics
    from lmctl.objectives.collate import masked_positions

    torch.manual_seed(0)
    small = {"hidden_size": 32, "num_hidden_layers": 2, "num_attention_heads": 2,
             "intermediate_size": 64, "vocab_size": 97}  # fmt: skip
    ids = torch.randint(3, 97, (5, 12))
    if kind == "clm":
        model: Any = transformers.GPT2LMHeadModel(
            transformers.GPT2Config(n_embd=32, n_layer=2, n_head=2, vocab_size=97)
        )
        labels = ids.clone()
        labels[1, 7:] = -100  # a padded sample scores fewer positions
        inputs = {"input_ids": ids, "labels": labels}
    elif kind == "mlm":
        model = transformers.BertForMaskedLM(transformers.BertConfig(**small))
        labels = torch.full_like(ids, -100)
        labels[torch.rand(ids.shape) < 0.3] = 5
        labels[2] = -100  # a sample without masked positions
        inputs = {"input_ids": ids, "labels": labels}
    else:
        model = transformers.BertForMultipleChoice(transformers.BertConfig(**small))
        inputs = {"input_ids": ids.view(5, 1, 12).repeat(1, 3, 1), "labels": torch.arange(5) % 3}
    model.eval()
    with torch.inference_mode():
        expected = float(model(**inputs).loss)
        metrics = BatchMetrics(masked_positions)
        got = batch_loss(model, inputs, metrics, shifted=kind == "clm")
    assert got == pytest.approx(expected, rel=1e-5)
