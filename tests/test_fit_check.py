"""The fit check: the memory estimate of a run against the free memory, before any work."""

from __future__ import annotations

import json
import resource
import time
from dataclasses import replace
from pathlib import Path

import pytest
import yaml

from lmctl.errors import ConfigError
from lmctl.run.fit import (
    FitCheck,
    ModelSize,
    Shape,
    alternatives,
    estimate,
    format_bytes,
    parse_bytes,
    refusal,
    zero_stage,
)
from tests.conftest import assert_clean_failure, lmctl, tiny_clm_args

#: About 20 billion parameters of GPT-2.
HUGE_GPT2 = ["--model-type", "gpt2", "--config-overrides", "n_layer=48,n_embd=6144,n_head=48"]

SIZE = ModelSize(parameters=100_000_000, layers=12, hidden=768, vocab=50_000, heads=12)
SHAPE = Shape(batch=8, length=512)


def test_fp32_adamw_is_sixteen_bytes_per_parameter_plus_activations() -> None:
    e = estimate(SIZE, SHAPE)
    assert (e.weights, e.gradients, e.optimizer) == (400_000_000, 400_000_000, 800_000_000)
    assert e.activations > 0
    assert e.total == e.weights + e.gradients + e.optimizer + e.activations


def test_zero_stages_divide_optimizer_then_gradients_then_weights() -> None:
    n = 4
    plain = estimate(SIZE, replace(SHAPE, processes=n))
    one = estimate(SIZE, replace(SHAPE, processes=n, zero=1))
    two = estimate(SIZE, replace(SHAPE, processes=n, zero=2))
    three = estimate(SIZE, replace(SHAPE, processes=n, zero=3))
    assert one.optimizer == plain.optimizer // n
    assert (one.gradients, one.weights) == (plain.gradients, plain.weights)
    assert two.gradients == plain.gradients // n and two.weights == plain.weights
    assert three.weights == plain.weights // n
    assert plain.total > one.total > two.total > three.total
    assert plain.activations == three.activations  # ZeRO does not shard activations


def test_zero_with_bf16_keeps_an_fp32_master_copy_in_the_optimizer_state() -> None:
    e = estimate(SIZE, replace(SHAPE, processes=2, zero=1, precision="bf16"))
    assert e.weights == 2 * SIZE.parameters
    assert e.optimizer == 12 * SIZE.parameters // 2


def test_fsdp_full_shards_everything_grad_op_keeps_the_weights() -> None:
    plain = estimate(SIZE, replace(SHAPE, processes=2))
    full = estimate(SIZE, replace(SHAPE, processes=2, fsdp="full"))
    grad_op = estimate(SIZE, replace(SHAPE, processes=2, fsdp="grad-op"))
    assert full.weights == plain.weights // 2 and full.optimizer == plain.optimizer // 2
    assert grad_op.weights == plain.weights and grad_op.gradients == plain.gradients // 2


def test_lora_trains_only_the_adapters_share() -> None:
    full = estimate(SIZE, SHAPE)
    lora = estimate(SIZE, replace(SHAPE, lora_rank=8))
    trained = 4 * 8 * SIZE.hidden * SIZE.layers
    assert lora.weights == full.weights  # the frozen base model is still there
    assert lora.gradients == 4 * trained and lora.optimizer == 8 * trained
    assert lora.total < full.total


def test_checkpointing_stores_less_activation_memory() -> None:
    plain = estimate(SIZE, SHAPE)
    checkpointed = estimate(SIZE, replace(SHAPE, checkpointing=True))
    assert checkpointed.activations < plain.activations
    assert checkpointed.weights == plain.weights


def test_activations_grow_with_batch_and_faster_with_length_and_shrink_in_bf16() -> None:
    base = estimate(SIZE, SHAPE).activations
    assert estimate(SIZE, replace(SHAPE, batch=16)).activations == 2 * base
    assert estimate(SIZE, replace(SHAPE, length=1024)).activations > 2 * base  # scores: s²
    assert estimate(SIZE, replace(SHAPE, precision="bf16")).activations < base


@pytest.mark.parametrize(
    ("text", "expected"),
    [("1024", 1024), ("1MiB", 1024**2), ("2GiB", 2 * 1024**3), ("1.5 GB", 1_500_000_000)],
)
def test_free_memory_amounts(text: str, expected: int) -> None:
    assert parse_bytes(text) == expected


def test_a_bad_free_memory_amount_is_a_config_error() -> None:
    with pytest.raises(ConfigError, match="LMCTL_FREE_MEMORY"):
        parse_bytes("lots")


def test_zero_stage_of_a_stage_or_a_config_file(tmp_path: Path) -> None:
    path = tmp_path / "ds.json"
    path.write_text(json.dumps({"zero_optimization": {"stage": 2}}))
    assert (zero_stage(None), zero_stage("3"), zero_stage(str(path))) == (0, 3, 2)
    assert format_bytes(3 * 1024**3) == "3.0 GiB"


def test_the_refusal_names_the_changes_that_fit_with_their_estimates() -> None:
    shape = replace(SHAPE, batch=32, accumulation=2, processes=4)
    needed = estimate(SIZE, shape)
    free = estimate(SIZE, replace(shape, batch=8)).total  # a quarter of the batch fits
    check = FitCheck(SIZE, shape, needed, free, "test")
    changes = dict(alternatives(check, can_lora=True))
    # The smaller batch keeps the global batch: 32 x 2 = 8 x 8.
    batch = "--per-device-train-batch-size 8 --gradient-accumulation-steps 8"
    assert changes[batch] == free
    assert {"--gradient-checkpointing", "--deepspeed 2", "--deepspeed 3", "--peft lora"} <= set(
        changes
    )
    error = refusal(check, can_lora=True)
    assert format_bytes(needed.total) in error.message and format_bytes(free) in error.message
    assert error.hint is not None and batch in error.hint
    for flags, total in changes.items():
        assert (flags in error.hint) == (total <= free)
    alone = replace(check, shape=replace(shape, processes=1))
    flags = [flags for flags, _ in alternatives(alone, can_lora=False)]
    assert not any(f.startswith(("--deepspeed", "--peft")) for f in flags), flags


@pytest.mark.e2e
def test_a_20b_model_is_refused_at_once(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    data = ["--tokenizer-name", str(bpe_tokenizer), "--train-file", str(text_files[0])]
    before = resource.getrusage(resource.RUSAGE_CHILDREN)
    started = time.monotonic()
    proc = lmctl("train", "clm", *HUGE_GPT2, *data, "-o", tmp_path / "run", cwd=tmp_path)
    elapsed = time.monotonic() - started
    after = resource.getrusage(resource.RUSAGE_CHILDREN)
    cpu = after.ru_utime + after.ru_stime - before.ru_utime - before.ru_stime
    assert_clean_failure(proc, 2, "needs about", "is free", "--gradient-checkpointing")
    error = next(line for line in proc.stderr.splitlines() if " ERROR " in line)
    assert "GiB" in error and "--per-device-train-batch-size" in error
    # Within 10 s of the process's own time (about 7 s here, mostly importing torch and
    # transformers); the wall clock also counts whatever else shares the machine's cores.
    assert cpu < 10, (cpu, elapsed)
    assert elapsed < 30, (cpu, elapsed)
    assert not (tmp_path / "run").exists()


@pytest.mark.e2e
def test_low_free_memory_refuses_and_no_fit_check_trains(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    args = tiny_clm_args(bpe_tokenizer, (text_files[0], None), "--no-eval", steps=1)
    low = {"LMCTL_FREE_MEMORY": "1MiB"}
    proc = lmctl(*args, "-o", tmp_path / "refused", env=low, cwd=tmp_path)
    assert_clean_failure(proc, 2, "1.0 MiB is free (LMCTL_FREE_MEMORY)")
    assert not (tmp_path / "refused").exists()
    proc = lmctl(*args, "--no-fit-check", "-o", tmp_path / "run", env=low, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert (tmp_path / "run" / "lmctl.yaml").is_file()


@pytest.mark.e2e
def test_dry_run_shows_the_memory_table(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    args = tiny_clm_args(bpe_tokenizer, text_files, "--dry-run")
    proc = lmctl(*args, "--json", env={"LMCTL_FREE_MEMORY": "1GiB"}, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    memory = json.loads(proc.stdout)["memory"]
    parts = ("weights", "gradients", "optimizer", "activations")
    assert memory["total"] == sum(memory[key] for key in parts)
    assert memory["free"] == 1024**3 and memory["fits"] is True
    assert memory["optimizer"] == 2 * memory["weights"] > 0
    # A dry run of a run that does not fit shows it and refuses nothing.
    data = ["--tokenizer-name", str(bpe_tokenizer), "--train-file", str(text_files[0])]
    proc = lmctl("train", "clm", *HUGE_GPT2, *data, "--dry-run", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert "does NOT fit" in proc.stdout and "#   activations" in proc.stdout
    assert yaml.safe_load(proc.stdout)["config_overrides"] == HUGE_GPT2[-1]


def test_the_check_runs_once_in_the_process_that_launches_the_others(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    from lmctl.cli.train import checks_fit_here
    from lmctl.run.launch import ARGUMENTS_ENV

    for name in ("RANK", "WORLD_SIZE", ARGUMENTS_ENV, "TORCHELASTIC_RESTART_COUNT"):
        monkeypatch.delenv(name, raising=False)
    assert checks_fit_here()  # the process the user started
    monkeypatch.setenv("RANK", "1")
    monkeypatch.setenv("WORLD_SIZE", "2")
    assert checks_fit_here()  # a process of a launcher the user started: each checks
    monkeypatch.setenv(ARGUMENTS_ENV, "train clm --nproc 2")
    assert not checks_fit_here()  # lmctl's own launcher checked before launching it
