"""Upstream spellings on the command line: what each becomes, and the mistakes refused."""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any

import pytest

from lmctl.cli.app import main
from lmctl.cli.upstream import TRAINING_ARGS_FLAG, upstream_command_line
from lmctl.config.upstream import (
    MANAGED_TRAINING_ARGUMENTS,
    REFUSED_TRAINING_ARGUMENTS,
    training_argument_fields,
)
from lmctl.errors import ConfigError
from lmctl.objectives.clm import ClmConfig
from tests.conftest import assert_clean_failure, lmctl, runtime_of, sliced

SAMPLES = {"bool": "true", "int": "3", "float": "0.5", "str": "word", "dict": '{"a": 1}'}


def _passthrough(words: list[str]) -> dict[str, Any]:
    if TRAINING_ARGS_FLAG not in words:
        return {}
    result: dict[str, Any] = json.loads(words[words.index(TRAINING_ARGS_FLAG) + 1])
    return result


def test_every_training_arguments_field_is_a_flag_or_refused_with_a_reason() -> None:
    from transformers import TrainingArguments

    lmctl_fields = set(ClmConfig.model_fields)
    for field in dataclasses.fields(TrainingArguments):
        if not field.init:
            continue
        kind = training_argument_fields()[field.name].kind
        flag = f"--{field.name}"
        words = (
            [flag]
            if kind == "bool"
            else [flag, *([SAMPLES[kind]] if kind in SAMPLES else ["a", "b"])]
        )
        if field.name in REFUSED_TRAINING_ARGUMENTS:
            with pytest.raises(ConfigError) as info:
                upstream_command_line([flag, "value"], ClmConfig)
            assert REFUSED_TRAINING_ARGUMENTS[field.name] in info.value.message
            continue
        if field.name == "push_to_hub":
            words += ["--hub_model_id", "me/repo"]
        if field.name == "hub_model_id":
            words += ["--push_to_hub"]
        out = upstream_command_line(words, ClmConfig)
        passed = _passthrough(out)
        if field.name in passed:
            # (an --fsdp combination that lmctl's FSDP flags do not express goes to the Trainer)
            assert field.name not in lmctl_fields or field.name == "fsdp", flag
            assert not isinstance(passed[field.name], str) or kind in ("str", "dict")
        elif field.name in MANAGED_TRAINING_ARGUMENTS:
            assert not passed
        else:
            # lmctl's own option: spelled its own way, never passed on as well
            assert not passed, (flag, out)
            assert out and all(not word.startswith("--") or "_" not in word for word in out), out


@pytest.mark.parametrize(
    "words,expected",
    [
        (["--do_train"], ["--do-train"]),
        (["--do_train", "true"], ["--do-train"]),
        (["--do_train=False"], ["--no-train"]),
        (["--no_do_train"], ["--no-train"]),
        (["--do_eval", "False"], ["--no-eval"]),
        (["--keep_linebreaks", "false"], ["--no-keep-linebreaks"]),
        (
            ["--report_to", "tensorboard", "wandb"],
            ["--report-to", "tensorboard", "--report-to", "wandb"],
        ),
        (["--report_to", "none"], ["--report-to", "none"]),
        (["--report_to=all"], ["--report-to", "all"]),
        (["--num_train_epochs=1"], ["--num-train-epochs", "1"]),
        (["--per_device_train_batch_size", "2"], ["--per-device-train-batch-size", "2"]),
        (["--max_train_steps", "20"], ["--max-steps", "20"]),
        (["--num_warmup_steps=2"], ["--warmup-steps", "2"]),
        (["--use_slow_tokenizer"], ["--no-use-fast-tokenizer"]),
        (["--checkpointing_steps", "epoch"], ["--checkpointing-steps", "epoch"]),
        (["--with_tracking"], ["--with-tracking"]),
        (["--hub_token", "hf_x"], ["--token", "hf_x"]),
        (["--push_to_hub", "--hub_model_id", "me/lm"], ["--push-to", "hf://me/lm"]),
        (
            ["--fsdp", "full_shard auto_wrap"],
            ["--fsdp", "--fsdp-sharding", "full", "--fsdp-auto-wrap"],
        ),
        (["--disable_tqdm", "true"], ["--no-progress"]),
        (["--local_rank=0"], []),
        (["args.json", "--seed", "3"], ["--config", "args.json", "--seed", "3"]),
        (["--max-steps", "5", "--max_steps", "5"], ["--max-steps", "5", "--max-steps", "5"]),
    ],
)
def test_upstream_spellings_become_lmctl_flags(words: list[str], expected: list[str]) -> None:
    assert upstream_command_line(words, ClmConfig) == expected


@pytest.mark.parametrize(
    "words,expected",
    [
        (["--use_cpu"], {"use_cpu": True}),
        (["--no_cuda"], {"use_cpu": True}),
        (["--dataloader_pin_memory", "false"], {"dataloader_pin_memory": False}),
        (["--prediction_loss_only"], {"prediction_loss_only": True}),
        (["--no_dataloader_pin_memory"], {"dataloader_pin_memory": False}),
        (["--optim", "adamw_torch_fused"], {"optim": "adamw_torch_fused"}),
        (["--lr_scheduler_kwargs", '{"power": 2.0}'], {"lr_scheduler_kwargs": {"power": 2.0}}),
        (["--eval_accumulation_steps=4"], {"eval_accumulation_steps": 4}),
        (["--label_names", "labels", "extra"], {"label_names": ["labels", "extra"]}),
        (["--adam_beta2", "0.98"], {"adam_beta2": 0.98}),
    ],
)
def test_training_arguments_fields_are_parsed_with_their_types(
    words: list[str], expected: dict[str, Any]
) -> None:
    assert _passthrough(upstream_command_line(words, ClmConfig)) == expected


@pytest.mark.parametrize(
    "words,needles",
    [
        (["--torch_empty_cache_steps", "x"], ["TrainingArguments.torch_empty_cache_steps", "int"]),
        (["--dataloader_pin_memory", "maybe"], ["--dataloader_pin_memory", "takes a boolean"]),
        (["--lr_scheduler_kwargs", "{power"], ["lr_scheduler_kwargs", "JSON object"]),
        (["--lerning_rate", "1"], ["--lerning_rate", "did you mean '--learning_rate'"]),
        (["--adam_bta1", "1"], ["did you mean '--adam_beta1'"]),
        (["--max_steps", "5", "--max-steps", "6"], ["--max_steps 5", "--max-steps 6"]),
        (["--max_train_steps", "5", "--max_steps", "6"], ["--max_train_steps 5", "--max_steps 6"]),
        (["--push_to_hub"], ["--hub_model_id"]),
        (["--no_optim"], ["--no_optim"]),
        (["args.json", "--config", "other.yaml"], ["args.json", "other.yaml"]),
    ],
)
def test_bad_upstream_input_is_one_config_error(words: list[str], needles: list[str]) -> None:
    with pytest.raises(ConfigError) as info:
        upstream_command_line(words, ClmConfig)
    for needle in needles:
        assert needle in info.value.message


@pytest.fixture
def data(tmp_path: Path) -> list[str]:
    train = tmp_path / "a.txt"
    train.write_text("one line of text\nand another one\n")
    return ["--model_type", "gpt2", "--train_tokenizer", "300", "--train_file", str(train)]


def resolved(capfd: pytest.CaptureFixture[str], *args: str) -> dict[str, Any]:
    """The config that ``lmctl train clm ARGS --dry-run`` resolves, in this process."""
    with pytest.raises(SystemExit) as exit_:
        main(["train", "clm", *args, "--dry-run", "--json"])
    out = capfd.readouterr().out
    assert exit_.value.code in (0, None), out
    config: dict[str, Any] = json.loads(out)["config"]
    return config


def test_positional_args_file_and_later_flags(
    tmp_path: Path, data: list[str], capfd: pytest.CaptureFixture[str]
) -> None:
    args = {"learning_rate": 0.001, "per_device_train_batch_size": 4, "optim": "adamw_torch"}
    for name, text in (("args.json", json.dumps(args)), ("args.yaml", "learning_rate: 0.001\n")):
        path = tmp_path / name
        path.write_text(text)
        config = resolved(capfd, str(path), *data, "--learning_rate=0.01", "--seed", "3")
        assert config["learning_rate"] == pytest.approx(0.01)  # the flag after it wins
        assert config["seed"] == 3
    assert config["training_args"] == {}  # the YAML file set no TrainingArguments field
    path = tmp_path / "args.json"
    config = resolved(capfd, str(path), *data, "--adam_beta1", "0.8")
    assert config["per_device_train_batch_size"] == 4
    assert config["training_args"] == {"optim": "adamw_torch", "adam_beta1": 0.8}


def test_trainer_gets_training_arguments_flags(
    tmp_path: Path, data: list[str], capfd: pytest.CaptureFixture[str]
) -> None:
    from lmctl.engine.trainer import training_arguments

    config = resolved(
        capfd,
        *data,
        "--optim",
        "adamw_torch",
        "--lr_scheduler_kwargs",
        '{"power": 2.0}',
        "--dataloader_pin_memory",
        "false",
        "--save_only_model",
        "--logging_first_step",
        "--torch_compile_mode",
        "default",
        "--use_cpu",
        "--prediction_loss_only",
        "--gradient_checkpointing",
        "--bf16",
        "--max_steps=7",
    )
    config.pop("objective")
    document = ClmConfig.model_validate(config)
    args = training_arguments(sliced(document), runtime_of(document, tmp_path), tmp_path / "run")
    assert args.optim == "adamw_torch"
    assert args.lr_scheduler_kwargs == {"power": 2.0}
    assert args.dataloader_pin_memory is False
    assert args.save_only_model and args.logging_first_step and args.prediction_loss_only
    assert args.torch_compile_mode == "default"
    assert args.use_cpu is True
    assert args.max_steps == 7
    assert config["gradient_checkpointing"] is True  # lmctl's own option, not a second copy
    assert config["bf16"] is True


@pytest.mark.parametrize(
    "extra,needles",
    [
        (["--torch_empty_cache_steps", "x"], ["--torch_empty_cache_steps", "int"]),
        (["--lerning_rate", "1"], ["did you mean '--learning_rate'"]),
        (["--bf16", "--fp16"], ["--bf16 and --fp16"]),
        (["--max_steps", "5", "--max-steps", "6"], ["--max_steps 5 and --max-steps 6"]),
        (["--engine", "accelerate", "--optim", "sgd"], ["--optim", "--engine accelerate"]),
    ],
)
def test_bad_upstream_input_exits_2_with_one_message(
    tmp_path: Path, data: list[str], extra: list[str], needles: list[str]
) -> None:
    proc = lmctl("train", "clm", *data, *extra, cwd=tmp_path)
    assert_clean_failure(proc, 2, *needles)


def test_migration_page_lists_every_field_without_an_effect_or_refused() -> None:
    from lmctl.config.upstream import NO_EFFECT_FLAGS

    page = (Path(__file__).parent.parent / "docs" / "migrating.md").read_text(encoding="utf-8")
    listed = {**MANAGED_TRAINING_ARGUMENTS, **NO_EFFECT_FLAGS, **REFUSED_TRAINING_ARGUMENTS}
    for name, reason in listed.items():
        assert f"| `{name}`" in page and reason in page, name
