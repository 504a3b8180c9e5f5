"""The config layer: merge order, strictness, upstream args files, cross-field rules."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmctl.config.loader import build_config
from lmctl.errors import ConfigError
from lmctl.objectives.clm import ClmConfig
from tests.conftest import lmctl


@pytest.fixture
def data(tmp_path: Path) -> dict[str, str]:
    train = tmp_path / "a.txt"
    train.write_text("hello world\n")
    return {"train_file": str(train), "model_type": "gpt2", "train_tokenizer": 100}


def test_merge_order_defaults_file_flags(tmp_path: Path, data: dict[str, str]) -> None:
    config_file = tmp_path / "c.yaml"
    config_file.write_text("learning_rate: 1e-3\nseed: 7\nmax_steps: 5\n")
    config = build_config(
        ClmConfig,
        cli_values={**data, "seed": 9},
        config_file=str(config_file),
    )
    assert config.learning_rate == pytest.approx(1e-3)  # file beats default
    assert config.seed == 9  # flag beats file
    assert config.max_steps == 5
    assert config.weight_decay == 0.0  # default


def test_upstream_json_args_file(tmp_path: Path, data: dict[str, str]) -> None:
    args = {
        "model_type": "gpt2",
        "config_overrides": "n_embd=10,n_head=2",
        "tokenizer_name": "gpt2",
        "train_file": data["train_file"],
        "per_device_train_batch_size": 8,
        "do_train": True,
        "do_eval": "False",
        "output_dir": str(tmp_path / "out"),
        "overwrite_output_dir": True,
        "max_steps": -1,
        "gradient_checkpointing": True,
        "use_slow_tokenizer": True,
        "fsdp": "full_shard auto_wrap",
    }
    path = tmp_path / "args.json"
    path.write_text(json.dumps(args))
    config = build_config(ClmConfig, cli_values={}, config_file=str(path))
    assert config.do_eval is False  # "False" means false (upstream type=bool defect avoided)
    assert config.max_steps is None
    assert config.use_fast_tokenizer is False
    assert config.gradient_checkpointing is True  # a first-class option now
    assert (config.fsdp, config.fsdp_sharding, config.fsdp_auto_wrap) == (True, "full", True)
    assert config.training_args == {}


def test_unknown_key_did_you_mean(tmp_path: Path, data: dict[str, str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("lerning_rate: 0.1\n")
    with pytest.raises(ConfigError) as info:
        build_config(ClmConfig, cli_values=data, config_file=str(path))
    assert "lerning_rate" in info.value.message
    assert "did you mean 'learning_rate'" in info.value.message


@pytest.mark.parametrize(
    "suffix,text",
    [
        (".toml", "learning_rate = 0.01\nseed = 3\n"),
        (".json", '{"learning_rate": 0.01, "seed": 3}'),
    ],
)
def test_toml_and_json(tmp_path: Path, data: dict[str, str], suffix: str, text: str) -> None:
    path = tmp_path / f"c{suffix}"
    path.write_text(text)
    config = build_config(ClmConfig, cli_values=data, config_file=str(path))
    assert (config.learning_rate, config.seed) == (0.01, 3)


def test_yaml_syntax_error_names_line(tmp_path: Path, data: dict[str, str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("seed: 1\nlearning_rate: [\n")
    with pytest.raises(ConfigError, match=r"c\.yaml, line \d+: invalid YAML"):
        build_config(ClmConfig, cli_values=data, config_file=str(path))


@pytest.mark.parametrize(
    "values,needle",
    [
        (
            {"model_name_or_path": "./m", "config_overrides": "n_layer=2"},
            "--config-overrides can't",
        ),
        ({"train_tokenizer": None, "tokenizer_name": None}, "needs a tokenizer"),
        ({"train_file": None}, "no data"),
        ({"learning_rate": -1}, "--learning-rate"),
        ({"lr_scheduler_type": "fancy"}, "--lr-scheduler-type"),
        ({"bf16": True, "fp16": True}, "--bf16 and --fp16"),
        ({"config_overrides": "n_layer"}, "is not key=value"),
        ({"eval_strategy": "steps"}, "--eval-steps"),
        ({"warmup_ratio": 0.1, "warmup_steps": 5}, "--warmup-ratio"),
        ({"train_tokenizer": 10, "tokenizer_name": "gpt2"}, "--train-tokenizer and --tokenizer"),
    ],
)
def test_cross_field_rules(data: dict[str, str], values: dict[str, object], needle: str) -> None:
    merged = {**data, **values}
    merged = {k: v for k, v in merged.items() if v is not None}
    with pytest.raises(ConfigError) as info:
        build_config(ClmConfig, cli_values=merged)
    assert needle in info.value.message


def test_all_problems_reported_together(data: dict[str, str]) -> None:
    with pytest.raises(ConfigError) as info:
        build_config(
            ClmConfig,
            cli_values={**data, "bf16": True, "fp16": True, "warmup_ratio": 0.1, "warmup_steps": 3},
        )
    assert info.value.message.startswith("2 problems: (1) --bf16 and --fp16")
    assert "(2) --warmup-ratio" in info.value.message


def test_token_never_dumped(data: dict[str, str]) -> None:
    from lmctl.config.loader import dump_config

    config = build_config(ClmConfig, cli_values={**data, "token": "hf_secret_value"})
    assert config.token_value() == "hf_secret_value"
    assert "hf_secret_value" not in json.dumps(dump_config(config))
    assert "hf_secret_value" not in repr(config)


def test_dry_run_prints_resolved_config(tmp_path: Path, data: dict[str, str]) -> None:
    proc = lmctl(
        "train",
        "clm",
        "--model-type",
        "gpt2",
        "--train-tokenizer",
        "100",
        "--train-file",
        data["train_file"],
        "--seed",
        "5",
        "--dry-run",
        "--json",
        cwd=tmp_path,
    )
    assert proc.returncode == 0, proc.stderr
    payload = json.loads(proc.stdout)
    assert payload["config"]["seed"] == 5
    assert payload["config"]["output_dir"].startswith("runs/clm-")
    assert not (tmp_path / "runs").exists()


def test_config_for_other_objective_refused(tmp_path: Path, data: dict[str, str]) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("objective: mlm\n")
    with pytest.raises(ConfigError, match="is for 'mlm'"):
        build_config(ClmConfig, cli_values=data, config_file=str(path), objective="clm")


def test_training_argument_fields_are_the_installed_dataclass() -> None:
    import dataclasses

    from transformers import TrainingArguments

    from lmctl.config.upstream import training_argument_fields

    installed = {field.name for field in dataclasses.fields(TrainingArguments) if field.init}
    assert set(training_argument_fields()) == installed


def test_an_enormous_wrong_value_is_shown_shortened(tmp_path: Path, data: dict[str, str]) -> None:
    from lmctl.config.loader import build_config
    from lmctl.errors import ConfigError
    from lmctl.objectives.clm import ClmConfig

    config = tmp_path / "huge.yaml"
    config.write_text("warmup_steps: " + "9x" * 100_000 + "\n")
    with pytest.raises(ConfigError) as caught:
        # a model and data given: the wrong value is the only problem to report
        build_config(ClmConfig, cli_values=data, config_file=str(config))
    assert "'warmup_steps' in" in caught.value.message
    assert "(200002 characters)" in caught.value.message  # the repr, quotes included
    assert len(caught.value.message) < 400


def test_training_args_are_checked_like_their_flags(tmp_path: Path, data: dict[str, str]) -> None:
    """A ``training_args:`` value meets its flag's rules (or its TrainingArguments type) and
    message, naming the nested key; good values come out as their types."""
    config_file = tmp_path / "c.yaml"
    config_file.write_text(
        "training_args:\n  per_device_train_batch_size: -4\n  logging_first_step: 3\n"
        "  learning_rat: 0.1\n"
    )
    with pytest.raises(ConfigError) as caught:
        build_config(ClmConfig, cli_values=data, config_file=str(config_file))
    message = caught.value.message
    assert "3 problems" in message
    assert "training_args.per_device_train_batch_size: Input should be greater than 0" in message
    assert "training_args.logging_first_step 3: TrainingArguments.logging_first_step is bool" in (
        message
    )
    assert "training_args.learning_rat: not a TrainingArguments field" in message
    assert "did you mean 'learning_rate'?" in message
    with pytest.raises(ConfigError) as flag:
        build_config(ClmConfig, cli_values={**data, "per_device_train_batch_size": -4})
    nested = "training_args.per_device_train_batch_size"
    assert flag.value.message.replace("--per-device-train-batch-size", nested) in message

    config_file.write_text(
        "training_args:\n  per_device_train_batch_size: '4'\n  logging_first_step: 'true'\n"
        "  fsdp: full_shard\n  deepspeed: {zero_optimization: {stage: 2}}\n"
    )
    config = build_config(ClmConfig, cli_values=data, config_file=str(config_file))
    assert config.training_args == {
        "per_device_train_batch_size": 4,
        "logging_first_step": True,
        "fsdp": "full_shard",
        "deepspeed": {"zero_optimization": {"stage": 2}},
    }
