"""The fast-path table: each path runs by default only on the device types it was measured
faster on (a CPU, so far), never where the model is wrapped or the settings exclude it;
``--fast-paths off`` leaves the model's and PyTorch's own code everywhere, and a list turns
on the paths it names. Decided from the device type and the settings: no GPU needed."""

from __future__ import annotations

import dataclasses
from pathlib import Path
from typing import Any, get_args

import pytest
import torch
from transformers import BertConfig, BertForMaskedLM, GPT2Config, GPT2LMHeadModel
from transformers.activations import GELUTanh, NewGELUActivation

from lmctl.config.base import FastPathName
from lmctl.config.loader import build_config
from lmctl.engine.optim import make_optimizer
from lmctl.errors import ConfigError
from lmctl.fastpaths import table as fastpaths
from lmctl.fastpaths.dropout import CpuDropout
from lmctl.fastpaths.install import install_fast_paths
from lmctl.fastpaths.table import PATHS, TABLE, FastPaths, Setting, decide
from lmctl.objectives.clm import OBJECTIVE as CLM
from lmctl.objectives.clm import ClmConfig
from lmctl.objectives.mlm import OBJECTIVE as MLM
from lmctl.run.runtime import decide_fast_paths, wrappers

from .conftest import lmctl, sliced

NAMES = get_args(FastPathName)
#: The paths that run on a CPU (all but the GPU-only fused linear loss).
CPU_NAMES = tuple(p.name for p in TABLE if p.runs_on is None or "cpu" in p.runs_on)


def _setting(**changes: Any) -> Setting:
    values: dict[str, Any] = {
        "device": "cpu",
        "precision": "fp32",
        "engine": "trainer",
        "wrappers": (),
        "processes": 1,
        "checkpointing": False,
        "requested": "auto",
    }
    return Setting(**{**values, **changes})


def _config(tmp_path: Path, **values: Any) -> ClmConfig:
    train = tmp_path / "t.txt"
    train.write_text("a\n")
    minimal = {"model_type": "gpt2", "tokenizer_name": "tok", "train_file": str(train)}
    return build_config(ClmConfig, cli_values={**minimal, **values})


def _gpt2() -> GPT2LMHeadModel:
    """Tied embeddings, dropout, Python tanh GELU and a linear output layer: every path fits."""
    torch.manual_seed(0)
    config = GPT2Config(vocab_size=97, n_layer=1, n_embd=16, n_head=2, n_positions=32)
    return GPT2LMHeadModel(config)


def test_every_path_has_one_row_and_was_measured_on_a_cpu_only() -> None:
    assert [path.name for path in TABLE] == list(NAMES)
    assert all(PATHS[name].measured_on == {"cpu"} for name in CPU_NAMES)
    # The GPU-only path runs on CUDA alone and is on by default nowhere until measured there.
    gpu_only = PATHS["fused-linear-loss"]
    assert gpu_only.runs_on == {"cuda"}
    assert gpu_only.measured_on == frozenset()
    assert set(NAMES) - set(CPU_NAMES) == {"fused-linear-loss"}


@pytest.mark.parametrize("engine", ["trainer", "accelerate"])
@pytest.mark.parametrize("precision", ["fp32", "bf16", "fp16"])
def test_on_a_cuda_device_every_cpu_measured_path_is_off(engine: str, precision: str) -> None:
    setting = _setting(device="cuda", precision=precision, engine=engine)
    for path in TABLE:
        decision = decide(path, setting)
        assert not decision.on, path.name
        assert decision.reason in ("not measured faster on cuda", f"not checked in {precision}")


def test_on_a_cpu_every_path_is_on_by_default_but_those_that_change_the_results() -> None:
    for path in TABLE:
        decision = decide(path, _setting())
        if path.name not in CPU_NAMES:
            assert not decision.on and decision.reason == "runs on cuda only"
            assert not decide(path, _setting(requested=frozenset({path.name}))).on
            continue
        if path.name == "fast-dropout":
            # Other random numbers than PyTorch's dropout: results other than upstream's.
            assert not decision.on and "other random numbers" in decision.reason
            assert decide(path, _setting(requested=frozenset({path.name}))).on
            continue
        assert decision.on, (path.name, decision)
        assert "measured faster on cpu" in decision.reason


@pytest.mark.parametrize(
    ("changes", "off", "reason"),
    [
        (
            {"wrappers": ("deepspeed",)},
            {"tiled-loss", "masked-head", "skip-padding", "sparse-embedding", "fast-dropout"},
            "DeepSpeed runs the model's own forward",
        ),
        (
            {"wrappers": ("lora", "compile")},
            {"tiled-loss", "masked-head", "skip-padding", "sparse-embedding", "fast-dropout"},
            "LoRA, torch.compile runs the model's own forward",
        ),
        ({"processes": 2}, {"sparse-embedding"}, "2 processes"),
        ({"checkpointing": True}, {"skip-padding", "fast-dropout"}, "gradient checkpointing"),
    ],
)
def test_settings_that_exclude_a_path_turn_it_off_on_any_device(
    changes: dict[str, Any], off: set[str], reason: str
) -> None:
    for requested in ("auto", frozenset(NAMES)):
        setting = _setting(**changes, requested=requested)
        decisions = {name: decide(PATHS[name], setting) for name in CPU_NAMES}
        expected = off
        if requested == "auto":  # off by default, whatever the setting
            decisions = {n: d for n, d in decisions.items() if not PATHS[n].not_by_default}
            expected = {n for n in off if not PATHS[n].not_by_default}
        assert {name for name, d in decisions.items() if not d.on} == expected
        assert all(decisions[name].reason == reason for name in expected)


def test_a_list_turns_on_the_paths_it_names_on_any_device_and_no_others() -> None:
    setting = _setting(device="cuda", precision="bf16", requested=frozenset({"tiled-loss"}))
    decisions = {path.name: decide(path, setting) for path in TABLE}
    assert decisions["tiled-loss"].on and decisions["tiled-loss"].reason == "named by --fast-paths"
    assert all(
        not d.on and d.reason == "not in --fast-paths"
        for n, d in decisions.items()
        if n != "tiled-loss"
    )
    # fp16 autocast was never checked with the tiled loss: naming it does not make it so.
    fp16 = dataclasses.replace(setting, precision="fp16")
    assert not decide(fastpaths.PATHS["tiled-loss"], fp16).on


def test_the_device_type_comes_from_the_accelerator_unless_the_cpu_is_asked_for(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    monkeypatch.setattr(torch.accelerator, "is_available", lambda: True)
    monkeypatch.setattr(torch.accelerator, "current_accelerator", lambda: torch.device("cuda"))
    paths = decide_fast_paths(sliced(_config(tmp_path)))
    assert paths.setting.device == "cuda"
    assert not any(paths.on(name) for name in NAMES)
    cpu = decide_fast_paths(sliced(_config(tmp_path, training_args={"use_cpu": True})))
    assert cpu.setting.device == "cpu"
    assert all(cpu.on(name) for name in CPU_NAMES if not PATHS[name].not_by_default)
    assert not cpu.on("fused-linear-loss")
    monkeypatch.setenv("ACCELERATE_USE_CPU", "true")
    assert decide_fast_paths(sliced(_config(tmp_path))).setting.device == "cpu"


def test_wrappers_are_read_from_flags_training_args_and_the_launcher(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    assert wrappers(sliced(_config(tmp_path))) == ()
    assert wrappers(sliced(_config(tmp_path, torch_compile=True))) == ("compile",)
    assert wrappers(sliced(_config(tmp_path, training_args={"fsdp": "full_shard"}))) == ("fsdp",)
    monkeypatch.setenv("ACCELERATE_USE_DEEPSPEED", "true")
    assert wrappers(sliced(_config(tmp_path))) == ("deepspeed",)


def _patched(model: GPT2LMHeadModel) -> dict[str, bool]:
    """Which of lmctl's changes the model carries."""
    return {
        "forward": "forward" in vars(model),
        "gelu": any(isinstance(m, GELUTanh) for m in model.modules()),
        "dropout": any(type(m) is CpuDropout for m in model.modules()),
        "sparse": model.get_input_embeddings().sparse,
        "attention": model.config._attn_implementation != "sdpa",
    }


def _loss(model: GPT2LMHeadModel) -> tuple[torch.Tensor, list[torch.Tensor]]:
    model.train()
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(1))
    torch.manual_seed(2)  # the same dropout masks for both models
    model.zero_grad()
    loss = model(input_ids=ids, labels=ids).loss
    loss.backward()
    return loss.detach(), [p.grad.to_dense() for p in model.parameters()]


@pytest.mark.parametrize(
    "setting",
    [_setting(requested="off"), _setting(device="cuda"), _setting(device="cuda", precision="bf16")],
    ids=["off", "cuda", "cuda-bf16"],
)
def test_where_every_path_is_off_the_model_trains_through_its_own_code(
    tmp_path: Path, setting: Setting
) -> None:
    config = _config(
        tmp_path, fast_paths=setting.requested if setting.requested == "off" else "auto"
    )
    paths = FastPaths.of(setting)
    model, stock = _gpt2(), _gpt2()
    install_fast_paths(paths, CLM, model, training=True)
    assert not any(_patched(model).values()), _patched(model)
    assert any(isinstance(m, NewGELUActivation) for m in model.modules())
    assert type(model).forward is GPT2LMHeadModel.forward
    assert (
        make_optimizer(sliced(config).optimizer, {}, model, fused=paths.fused_adamw()).defaults[
            "fused"
        ]
        is None
    )
    loss, grads = _loss(model)
    stock_loss, stock_grads = _loss(stock)
    assert torch.equal(loss, stock_loss)
    assert all(torch.equal(a, b) for a, b in zip(grads, stock_grads, strict=True))
    line = paths.summary()
    assert "on:" not in line
    for name in ("tiled-loss", "fast-dropout", "sparse-embedding", "fused-gelu", "fused-adamw"):
        assert name in line


def test_on_a_cpu_the_same_model_gets_every_path_and_the_log_line_says_so(tmp_path: Path) -> None:
    paths = FastPaths.of(_setting(requested=frozenset(CPU_NAMES)))
    model = _gpt2()
    install_fast_paths(paths, CLM, model, training=True)
    assert all(_patched(model).values()), _patched(model)
    line = paths.summary()
    assert line.startswith("fast paths (cpu, fp32, trainer engine; --fast-paths chooses): on: ")
    # GPT-2 is not an encoder whose padding positions only attention masks.
    assert line.endswith(
        "; off: fused-linear-loss (not in --fast-paths), skip-padding (not an encoder whose "
        "padding only attention masks (BERT, RoBERTa, DistilBERT, ELECTRA))"
    )
    default = FastPaths.of(_setting())
    install_fast_paths(default, CLM, _gpt2(), training=True)
    assert not default.on("fast-dropout")
    assert "fast-dropout (other random numbers" in default.summary().split("; off: ")[1]
    for name in ("tiled-loss", "fast-dropout", "sparse-embedding", "fused-gelu"):
        assert name in line
    assert "masked-head" not in line, "a clm run never asks for the mlm head"


@pytest.mark.parametrize(("device", "installed"), [("cpu", True), ("cuda", False)])
def test_the_masked_head_runs_on_a_cpu_only(tmp_path: Path, device: str, installed: bool) -> None:
    torch.manual_seed(0)
    model = BertForMaskedLM(
        BertConfig(
            vocab_size=97,
            hidden_size=16,
            num_hidden_layers=1,
            num_attention_heads=2,
            intermediate_size=32,
            max_position_embeddings=32,
        )
    )
    paths = FastPaths.of(_setting(device=device))
    install_fast_paths(paths, MLM, model, training=True)
    assert ("forward" in vars(model)) is installed
    assert paths.on("masked-head") is installed
    assert "masked-head" in paths.summary()


def test_a_model_that_does_not_fit_a_path_is_said_to_be_off_for_that_reason(
    tmp_path: Path,
) -> None:
    torch.manual_seed(0)
    untied = GPT2LMHeadModel(
        GPT2Config(
            vocab_size=97,
            n_layer=1,
            n_embd=16,
            n_head=2,
            n_positions=32,
            tie_word_embeddings=False,
            resid_pdrop=0.0,
            embd_pdrop=0.0,
            attn_pdrop=0.0,
            activation_function="gelu",
        )
    )
    paths = FastPaths.of(_setting(requested=frozenset(NAMES)))
    install_fast_paths(paths, CLM, untied, training=True)
    assert paths.on("tiled-loss")
    for name in ("fast-dropout", "sparse-embedding", "fused-gelu"):
        assert not paths.on(name)
    line = paths.summary()
    assert "fast-dropout (the model has no dropout)" in line
    assert "sparse-embedding (no trained input embedding tied to the output layer)" in line
    assert "fused-gelu (the model has no tanh GELU in Python)" in line


def test_fast_paths_accepts_auto_off_and_names(tmp_path: Path) -> None:
    assert _config(tmp_path).fast_paths == "auto"
    assert _config(tmp_path, fast_paths="off").fast_path_names() is None
    listed = _config(tmp_path, fast_paths="Tiled-Loss, fused-gelu")
    assert listed.fast_paths == "tiled-loss,fused-gelu"
    assert listed.fast_path_names() == {"tiled-loss", "fused-gelu"}


@pytest.mark.parametrize("value", ["tiled-los", "auto,tiled-loss", ""])
def test_an_unknown_fast_path_is_a_config_error_naming_the_valid_ones(
    tmp_path: Path, value: str
) -> None:
    with pytest.raises(ConfigError) as caught:
        _config(tmp_path, fast_paths=value)
    assert "--fast-paths" in caught.value.message
    assert all(name in (caught.value.hint or "") for name in NAMES)


def test_an_unknown_fast_path_on_the_command_line_exits_2(tmp_path: Path) -> None:
    train = tmp_path / "t.txt"
    train.write_text("a\n")
    proc = lmctl(
        "train", "clm", "--model-type", "gpt2", "--tokenizer", "tok", "--train-file", train,
        "--fast-paths", "tiled-loss,bogus",
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "'bogus' is not a fast path" in proc.stderr
    assert "fused-adamw" in proc.stderr


def test_the_fused_linear_loss_is_wired_to_give_the_models_own_loss_and_gradients(
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    """lmctl hands liger-kernel's documented function ``liger_fused_linear_cross_entropy``
    the positions' hidden states, the output layer and the next tokens, and divides a summed
    loss by the batch's item count. Its Triton kernels need a GPU, so here the function is
    computed by PyTorch's own linear layer and cross-entropy: what is checked is lmctl's side
    of the call (the loss and every gradient equal the model's own, both reductions)."""
    import sys
    import types

    from lmctl.fastpaths.losses import fused_linear_training_loss

    calls: list[str] = []

    def reference(
        states: torch.Tensor,
        weight: torch.Tensor,
        targets: torch.Tensor,
        bias: torch.Tensor | None = None,
        *,
        reduction: str = "mean",
    ) -> torch.Tensor:
        calls.append(reduction)
        assert states.shape == (targets.shape[0], weight.shape[1])
        logits = torch.nn.functional.linear(states, weight, bias).float()
        return torch.nn.functional.cross_entropy(logits, targets, reduction=reduction)

    functional = types.ModuleType("liger_kernel.transformers.functional")
    functional.liger_fused_linear_cross_entropy = reference  # type: ignore[attr-defined]
    for name in ("liger_kernel", "liger_kernel.transformers"):
        monkeypatch.setitem(sys.modules, name, types.ModuleType(name))
    monkeypatch.setitem(sys.modules, functional.__name__, functional)

    model, stock = _gpt2(), _gpt2()
    assert fused_linear_training_loss(model)
    loss, grads = _loss(model)
    stock_loss, stock_grads = _loss(stock)
    assert calls == ["mean"]
    torch.testing.assert_close(loss, stock_loss)
    for grad, stock_grad in zip(grads, stock_grads, strict=True):
        torch.testing.assert_close(grad, stock_grad)
    ids = torch.randint(0, 97, (2, 24), generator=torch.Generator().manual_seed(3))
    torch.manual_seed(4)  # the same dropout masks for both models
    summed = model(input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(40)).loss
    torch.manual_seed(4)
    own = stock(input_ids=ids, labels=ids, num_items_in_batch=torch.tensor(40)).loss
    assert calls[-1] == "sum"
    torch.testing.assert_close(summed, own)


def test_without_liger_kernel_the_fused_linear_loss_is_said_not_to_fit(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    import sys

    monkeypatch.setitem(sys.modules, "liger_kernel", None)  # an import of it fails
    setting = _setting(device="cuda", precision="bf16", requested=frozenset({"fused-linear-loss"}))
    paths = FastPaths.of(setting)
    model = _gpt2()
    install_fast_paths(paths, CLM, model, training=True)
    assert not paths.on("fused-linear-loss")
    assert "fused-linear-loss (liger-kernel is not installed" in paths.summary()
    assert type(model).forward is GPT2LMHeadModel.forward or "forward" not in vars(model)


def test_the_start_of_run_line_is_short_and_the_metadata_keeps_every_reason(
    tmp_path: Path,
) -> None:
    paths = FastPaths.of(_setting())
    install_fast_paths(paths, CLM, _gpt2(), training=True)
    line = paths.summary(brief=True)
    assert (
        line == "fast paths (cpu, fp32): on: fused-gelu, tiled-loss, sparse-embedding, fused-adamw"
    )
    record = paths.record()
    assert record["setting"]["device"] == "cpu" and record["setting"]["requested"] == "auto"
    assert record["paths"]["fast-dropout"]["on"] is False
    assert "other random numbers" in record["paths"]["fast-dropout"]["reason"]
    assert set(record["paths"]) == set(paths.asked)
    # A setting of the run that turns paths off is said in the line, with the paths it took.
    wrapped = FastPaths.of(_setting(wrappers=("lora",), requested=frozenset(NAMES)))
    install_fast_paths(wrapped, CLM, _gpt2(), training=True)
    assert wrapped.summary(brief=True) == (
        "fast paths (cpu, fp32): on: fused-gelu, fused-adamw (named by --fast-paths); off: "
        "tiled-loss, skip-padding, "
        "fast-dropout, sparse-embedding (LoRA runs the model's own forward)"
    )
    assert wrapped.record()["setting"]["requested"] == sorted(NAMES)
    off = FastPaths.of(_setting(requested="off"))
    install_fast_paths(off, CLM, _gpt2(), training=True)
    assert off.summary(brief=True) == "fast paths (cpu, fp32): none on"
