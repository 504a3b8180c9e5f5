"""LoRA adapters (--peft lora): only the adapter trains; the run directory holds an adapter
that peft loads, that ``lmctl eval`` evaluates, and with --merge-adapter full weights."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from tests.conftest import assert_clean_failure, lmctl


@pytest.fixture(scope="module")
def small_gpt2(bpe_tokenizer: Path, tmp_path_factory: pytest.TempPathFactory) -> Path:
    """A "pretrained" GPT-2 (2 layers, hidden 32) saved with its tokenizer."""
    import torch
    from transformers import AutoTokenizer, GPT2Config, GPT2LMHeadModel

    torch.manual_seed(0)
    tokenizer = AutoTokenizer.from_pretrained(bpe_tokenizer)
    model = GPT2LMHeadModel(
        GPT2Config(vocab_size=len(tokenizer), n_layer=2, n_embd=32, n_head=2, n_positions=64)
    )
    path = tmp_path_factory.mktemp("small-gpt2")
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _weights(folder: Path) -> dict[str, object]:
    from safetensors.torch import load_file

    return load_file(folder / "model.safetensors")


@pytest.mark.e2e
def test_lora_trains_only_the_adapter_and_evaluates_the_same(
    small_gpt2: Path, text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    import torch
    from peft import PeftModel
    from safetensors.torch import load_file
    from transformers import AutoModelForCausalLM

    train, valid = text_files
    run = tmp_path / "run"
    proc = lmctl(
        "train", "clm", "--model", small_gpt2, "--train-file", train, "--validation-file",
        valid, "--block-size", "32", "--max-steps", "8", "--learning-rate", "1e-2",
        "--peft", "lora", "--lora-r", "4", "--merge-adapter", "-o", run, "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "trainable of" in proc.stderr  # trainable vs total parameters
    # A wrapped model keeps its own forward, loss and embedding gradient.
    line = next(line for line in proc.stderr.splitlines() if "fast paths (" in line)
    off = line.split(" off: ", 1)[1]
    assert "tiled-loss" in off and "sparse-embedding" in off, line
    assert "LoRA runs the model's own forward" in off, line
    trained_loss = json.loads(proc.stdout)["metrics"]["eval_loss"]

    adapter = load_file(run / "adapter_model.safetensors")
    assert adapter and all("lora_" in key for key in adapter), sorted(adapter)
    assert not (run / "model.safetensors").exists()  # no full copy of the weights

    base = AutoModelForCausalLM.from_pretrained(small_gpt2)
    original = {key: value.clone() for key, value in base.state_dict().items()}
    model = PeftModel.from_pretrained(base, run)
    assert any(value.abs().sum() > 0 for key, value in adapter.items() if "lora_B" in key)
    for key, value in model.get_base_model().state_dict().items():
        if "lora_" not in key:
            plain = key.replace(".base_layer", "")
            assert torch.equal(value, original[plain]), f"{plain} changed"

    evaluated = lmctl("eval", run, "--json")
    assert evaluated.returncode == 0, evaluated.stderr
    assert json.loads(evaluated.stdout)["metrics"]["eval_loss"] == pytest.approx(
        trained_loss, rel=1e-5
    )

    merged = run / "merged"
    full = AutoModelForCausalLM.from_pretrained(merged)  # plain transformers, no peft
    assert not any("lora" in key for key in _weights(merged))
    on_merged = lmctl("eval", merged, "--validation-file", valid, "--block-size", "32", "--json")
    assert on_merged.returncode == 0, on_merged.stderr
    assert json.loads(on_merged.stdout)["metrics"]["eval_loss"] == pytest.approx(
        trained_loss, rel=1e-4
    )
    assert full.config.n_layer == 2


def test_lora_options_need_peft_lora(tmp_path: Path) -> None:
    corpus = tmp_path / "a.txt"
    corpus.write_text("hello world\n")
    proc = lmctl(
        "train", "clm", "--model-type", "gpt2", "--tokenizer", "x", "--train-file", corpus,
        "--lora-r", "4", "--merge-adapter", "--dry-run",
    )  # fmt: skip
    assert_clean_failure(proc, 2, "--lora-r needs --peft lora", "--merge-adapter needs --peft")


def test_peft_adapts_a_pretrained_model_only(tmp_path: Path) -> None:
    corpus = tmp_path / "a.txt"
    corpus.write_text("hello world\n")
    proc = lmctl(
        "train", "clm", "--model-type", "gpt2", "--tokenizer", "x", "--train-file", corpus,
        "--peft", "lora", "--dry-run",
    )  # fmt: skip
    assert_clean_failure(proc, 2, "--peft lora adapts a pretrained model")


@pytest.mark.parametrize("objective", ["mlm", "swag"])
def test_lora_on_bert_adapts_attention_and_trains_a_new_head(
    objective: str, tmp_path: Path
) -> None:
    """peft's default targets for the BERT family; the multiple-choice classifier, absent
    from a pretrained checkpoint, trains in full beside the adapter."""
    from transformers import BertConfig, BertForMaskedLM, BertForMultipleChoice

    from lmctl.config.loader import build_config
    from lmctl.config.slices import AdapterSpec, take
    from lmctl.console import Console, OutputOptions
    from lmctl.models.adapters import apply_lora, new_modules
    from lmctl.objectives import get_objective

    bert = BertConfig(
        vocab_size=60, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
        intermediate_size=64,
    )  # fmt: skip
    model = BertForMaskedLM(bert) if objective == "mlm" else BertForMultipleChoice(bert)
    missing = [] if objective == "mlm" else ["classifier.weight", "classifier.bias"]
    assert new_modules(missing, model) == ([] if objective == "mlm" else ["classifier"])
    (tmp_path / "model").mkdir()
    train = tmp_path / ("a.txt" if objective == "mlm" else "a.jsonl")
    train.write_text("hello\n")
    config = build_config(
        get_objective(objective).config_class,
        cli_values={
            "model_name_or_path": str(tmp_path / "model"),
            "train_file": str(train),
            "peft": "lora",
            "lora_r": 2,
            "do_eval": False,
        },
    )
    adapted = apply_lora(
        take(AdapterSpec, config),
        str(tmp_path / "model"),
        model,
        missing,
        Console(OutputOptions(quiet=True)),
        objective=config.objective,
    )
    trainable = {name for name, p in adapted.named_parameters() if p.requires_grad}
    assert trainable
    assert all("lora_" in name or "classifier" in name for name in trainable), trainable
    assert any(".query." in name for name in trainable)
    assert any("classifier" in name for name in trainable) == (objective == "swag")
