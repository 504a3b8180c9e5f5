"""benchmarks/device.py, the GPU benchmark: its runs and their commands, its inputs, and one
tiny run end to end on whatever device is here (a check of the benchmark, not a figure)."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from benchmarks import device_page, device_runs

ROOT = Path(__file__).resolve().parent.parent


def _script(*args: str) -> subprocess.CompletedProcess[str]:
    return subprocess.run(
        [sys.executable, str(ROOT / "benchmarks" / "device.py"), *args],
        capture_output=True,
        text=True,
        timeout=300,
        check=False,
    )


def test_the_runs_cover_both_models_engines_and_settings_and_the_sharded_ones() -> None:
    labels = [run.label for run in device_runs.plan(smoke=False)]
    for model in ("gpt2", "bert"):
        for engine in ("trainer", "accelerate"):
            assert f"{model}-{engine}-off" in labels and f"{model}-{engine}-all" in labels
    sharded = [label for label in labels if label.split("-")[1] in ("fsdp1", "fsdp2", "zero2")]
    assert sorted(sharded) == ["gpt2-fsdp1", "gpt2-fsdp2", "gpt2-zero2"]
    # Every path alone, against the same model and engine with every path off.
    alone = {label.split("-", 2)[2] for label in labels if label.startswith("gpt2-trainer-")}
    assert {"tiled-loss", "fused-linear-loss", "sparse-embedding", "fused-gelu"} <= alone
    assert "bert-trainer-masked-head" in labels
    # The most telling runs first: a budget cut drops the last ones.
    assert labels[:3] == ["gpt2-trainer-off", "gpt2-trainer-all", "gpt2-trainer-fused-linear-loss"]
    assert len(labels) == len(set(labels))
    assert device_runs.GPT2.vocab == 50257 and device_runs.BERT.vocab == 30522


def test_dry_run_lists_every_run_with_its_lmctl_command() -> None:
    proc = _script("--dry-run")
    assert proc.returncode == 0, proc.stderr
    lines = dict(line.split(": ", 1) for line in proc.stdout.splitlines())
    assert len(lines) == len(device_runs.plan(smoke=False))
    every = ",".join(name for name in device_runs.FAST_PATHS if name != "fused-linear-loss")
    assert f"--fast-paths {every} " in lines["gpt2-trainer-all"]
    assert "--fast-paths fused-linear-loss " in lines["gpt2-trainer-fused-linear-loss"]
    assert "--fast-paths off " in lines["bert-accelerate-off"]
    assert "--engine accelerate" in lines["bert-accelerate-off"]
    assert lines["gpt2-zero2"].startswith("torchrun --nproc_per_node 1 -m lmctl train clm")
    assert "--deepspeed WORK/zero2.json" in lines["gpt2-zero2"]
    assert "--precision bf16" in lines["gpt2-fsdp1"]


def test_an_unknown_run_is_refused_with_the_names() -> None:
    proc = _script("--dry-run", "--only", "gpt2-nowhere")
    assert proc.returncode != 0
    assert "gpt2-nowhere" in proc.stderr and "gpt2-trainer-off" in proc.stderr


def test_the_inputs_have_the_models_vocabulary_and_the_sharding_configs(tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    small = device_runs.Model("gpt2", "tiny", "clm", "gpt2", 16, 2, 50)
    device_runs.write_inputs(tmp_path, device_runs.Run(small, "trainer", "auto", "fsdp1"), steps=3)
    tokenizer_dir, text = device_runs.data_paths(tmp_path, small)
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    assert len(tokenizer) == 50 and tokenizer.eos_token_id == 49
    ids = tokenizer(text.read_text().splitlines()[0])["input_ids"]
    assert len(ids) == 64 and max(ids) < 49
    options = json.loads((tmp_path / "fsdp1.json").read_text())["training_args"]
    assert options == {"fsdp": "full_shard", "fsdp_config": {"version": 1}}
    device_runs.write_inputs(tmp_path, device_runs.Run(small, "trainer", "auto", "zero2"), steps=3)
    zero2 = json.loads((tmp_path / "zero2.json").read_text())
    assert zero2["zero_optimization"]["stage"] == 2 and zero2["optimizer"]["type"] == "AdamW"


def test_mfu_counts_gpt2_124m_as_upstream_does() -> None:
    params, per_token = device_page.flops_per_token(device_runs.GPT2)
    assert 123e6 < params < 125e6
    assert per_token == 6 * params + 12 * 12 * 1024 * 768
    assert device_page.bf16_peak("NVIDIA H100 PCIe", None) == (
        756.5,
        "datasheet dense bf16 of the H100 PCIe",
    )
    assert device_page.bf16_peak("NVIDIA H100 80GB HBM3", None)[0] == 989.4
    assert device_page.bf16_peak("Some GPU", 100.0) == (100.0, "--peak-tflops")
    assert device_page.bf16_peak("Some GPU", None)[0] is None


def test_without_a_gpu_it_refuses_to_measure() -> None:
    import torch

    if torch.cuda.is_available():
        pytest.skip("a GPU is here")
    proc = _script("--only", "gpt2-trainer-off")
    assert proc.returncode == 2
    assert "--smoke" in proc.stderr


@pytest.mark.slow
@pytest.mark.e2e
def test_a_smoke_run_writes_the_page(tmp_path: Path) -> None:
    page = tmp_path / "gpu.md"
    proc = _script(
        "--smoke", "--only", "gpt2-trainer-all", "--steps", "3", "--log-every", "1",
        "--output", str(page),
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr[-3000:]
    text = page.read_text()
    row = next(line for line in text.splitlines() if line.startswith("| GPT-2 (1 x 64) |"))
    cells = [cell.strip() for cell in row.strip("|").split("|")]
    assert cells[1:4] == ["trainer", "all", "-"]
    assert float(cells[4].replace(",", "")) > 0  # tokens/s
    assert float(cells[6]) > 0  # peak memory
    assert "on: " in cells[8] and "tiled-loss" in cells[8]
    assert "bf16 peak for MFU" in text
