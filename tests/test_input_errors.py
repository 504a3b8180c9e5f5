"""What a new user got wrong in the first hour, each told at once and right: a model directory
without a tokenizer, a data directory given as a file, a missing local model, a SWAG layout
other than the default, an unfinished run pushed, a config key spelled as its flag."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from lmctl.config.loader import build_config, config_file_problems
from lmctl.config.slices import ModelSpec, TokenizerSpec, take
from lmctl.errors import ConfigError, DataError, ExitCode, ModelError
from lmctl.models.tokenizer import check_tokenizer_files
from lmctl.objectives.clm import ClmConfig
from lmctl.objectives.mlm import MlmConfig
from lmctl.objectives.swag import SwagOptions, check_columns
from lmctl.publish.files import select_files
from lmctl.run import rundir
from tests.conftest import assert_clean_failure, lmctl


@pytest.fixture
def train_file(tmp_path: Path) -> str:
    path = tmp_path / "t.txt"
    path.write_text("some words here\n")
    return str(path)


def _model_dir(tmp_path: Path, *files: str) -> Path:
    """A model directory (config and weights) holding ``files`` besides."""
    model = tmp_path / "notok"
    model.mkdir()
    for name in ("config.json", "model.safetensors", *files):
        (model / name).write_text("{}")
    return model


def _tokenizer_check(model: str, **values: object) -> None:
    config = MlmConfig.model_construct(model_name_or_path=model, **values)
    check_tokenizer_files(take(TokenizerSpec, config), take(ModelSpec, config))


# A model directory without tokenizer files ------------------------------------------------------


def test_model_dir_without_tokenizer_files_is_a_model_error(tmp_path: Path) -> None:
    model = _model_dir(tmp_path)
    with pytest.raises(ModelError) as caught:
        _tokenizer_check(str(model))
    assert f"{model} has no tokenizer files: give --tokenizer-name" in caught.value.message
    assert caught.value.exit_code == ExitCode.MODEL


@pytest.mark.parametrize(
    "files", [("tokenizer_config.json",), ("tokenizer.json",), ("vocab.txt",), ("spiece.model",)]
)
def test_model_dir_with_a_tokenizer_file_passes(tmp_path: Path, files: tuple[str, ...]) -> None:
    _tokenizer_check(str(_model_dir(tmp_path, *files)))


@pytest.mark.parametrize(
    "values", [{"tokenizer_name": "elsewhere"}, {"train_tokenizer": 100, "tokenizer_name": None}]
)
def test_another_tokenizer_named_passes(tmp_path: Path, values: dict[str, object]) -> None:
    _tokenizer_check(str(_model_dir(tmp_path)), **values)


def test_hub_models_keep_their_own_checks() -> None:
    _tokenizer_check("org/some-model")
    _tokenizer_check("s3://bucket/model")


def test_cli_refuses_a_model_without_tokenizer_before_any_work(tmp_path: Path) -> None:
    from transformers import BertConfig, BertForMaskedLM

    model = tmp_path / "notok"
    config = BertConfig(
        vocab_size=64,
        hidden_size=16,
        num_hidden_layers=1,
        num_attention_heads=2,
        intermediate_size=32,
        max_position_embeddings=32,
    )
    BertForMaskedLM(config).save_pretrained(model)
    (tmp_path / "t.txt").write_text("one line of words\n" * 8)
    proc = lmctl(
        "train", "mlm", "--model", "notok", "--train-file", "t.txt", "--line-by-line",
        "--max-steps", "5", "-o", "out", "--json", cwd=tmp_path,
    )  # fmt: skip
    assert_clean_failure(proc, 5, "notok has no tokenizer files: give --tokenizer-name")
    assert json.loads(proc.stdout)["exit_code"] == 5
    assert not (tmp_path / "out").exists()
    assert "data ready" not in proc.stderr


# A bad config file reports every problem --------------------------------------------------------


def test_build_config_reports_every_problem(tmp_path: Path, train_file: str) -> None:
    path = tmp_path / "bad.yaml"
    path.write_text("learning_rat: 0.1\nlr_scheduler_type: cosin\nmax_steps: abc\n")
    values = {"model_type": "gpt2", "train_tokenizer": 100, "train_file": train_file}
    with pytest.raises(ConfigError) as caught:
        build_config(ClmConfig, cli_values=values, config_file=str(path))
    problems = [problem["message"] for problem in caught.value.details["problems"]]
    assert len(problems) == 3, problems
    for word in ("'learning_rat'", "'lr_scheduler_type'", "'max_steps'"):
        assert sum(word in message for message in problems) == 1, problems
    assert caught.value.message.startswith("3 problems")
    assert "did you mean 'learning_rate'" in caught.value.message


def test_cross_field_rules_are_reported_with_invalid_values(tmp_path: Path) -> None:
    """pydantic skips the cross-field rules when a value is invalid; the user sees both."""
    with pytest.raises(ConfigError) as caught:
        build_config(ClmConfig, cli_values={"max_steps": "abc"})
    messages = [p["message"] for p in caught.value.details["problems"]]
    assert any("--max-steps" in m for m in messages)
    assert any(m.startswith("no model") for m in messages)
    assert any(m.startswith("no data") for m in messages)


# A data directory, a missing local model --------------------------------------------------------


def test_a_data_directory_is_named_as_one(tmp_path: Path) -> None:
    (tmp_path / "data").mkdir()
    values = {"model_type": "gpt2", "train_tokenizer": 100, "train_file": str(tmp_path / "data")}
    with pytest.raises(ConfigError) as caught:
        build_config(ClmConfig, cli_values=values)
    assert "is a directory" in caught.value.message
    assert "unsupported file type" not in caught.value.message
    assert f"'{tmp_path / 'data' / '*.txt'}'" in str(caught.value.hint)


def test_a_missing_local_model_is_found_by_validation(tmp_path: Path, train_file: str) -> None:
    missing = str(tmp_path / "minilm")
    with pytest.raises(ConfigError) as caught:
        build_config(
            MlmConfig, cli_values={"model_name_or_path": missing, "train_file": train_file}
        )
    assert f"--model-name-or-path {missing}: no such directory" in caught.value.message
    # a Hub id is not a local path: it is looked up later
    build_config(MlmConfig, cli_values={"model_name_or_path": "org/x", "train_file": train_file})


def test_a_missing_local_model_is_reported_before_heavy_imports(tmp_path: Path) -> None:
    (tmp_path / "t.txt").write_text("words\n")
    probe = (
        "import sys\n"
        "from lmctl.cli.app import main\n"
        "try:\n"
        "    main(['train', 'mlm', '--model', './minilm', '--train-file', 't.txt'])\n"
        "except SystemExit as done:\n"
        "    print('torch' in sys.modules, done.code)\n"
    )
    import subprocess
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", probe], cwd=tmp_path, capture_output=True, text=True, check=False
    )
    assert proc.stdout.split() == ["False", "2"], proc.stdout + proc.stderr
    assert "./minilm: no such directory" in proc.stderr


# Every missing SWAG column at once --------------------------------------------------------------


def test_swag_names_every_missing_column() -> None:
    options = SwagOptions(
        context_column="sent1",
        question_column="sent2",
        ending_columns="ending0,ending1,ending2,ending3",
        label_column="label",
        max_seq_length=None,
        pad_to_max_length=False,
    )
    with pytest.raises(DataError) as caught:
        check_columns(options, ["question", "a", "b", "answer"], "train.jsonl")
    message = caught.value.message
    for column in ("sent1", "ending0", "ending1", "ending2", "ending3", "label"):
        assert f"'{column}'" in message
    assert "(columns: question, a, b, answer)" in message
    for flag in ("--context-column", "--ending-columns", "--label-column"):
        assert flag in str(caught.value.hint)


# Pushing an unfinished run ----------------------------------------------------------------------


def _unfinished_run(tmp_path: Path, *, checkpoint: bool) -> Path:
    run = tmp_path / "x5"
    run.mkdir()
    (run / rundir.CONFIG_FILE).write_text("objective: clm\n")
    if checkpoint:
        (run / "checkpoint-2").mkdir()
        (run / "checkpoint-2" / "trainer_state.json").write_text("{}")
    return run


def test_push_of_a_run_without_checkpoint_says_how_to_start_it_again(tmp_path: Path) -> None:
    run = _unfinished_run(tmp_path, checkpoint=False)
    with pytest.raises(ConfigError) as caught:
        select_files(run, include_checkpoints=False, include_optimizer=False)
    hint = str(caught.value.hint)
    assert "lmctl resume" not in hint
    assert f"lmctl train clm --config {run / rundir.CONFIG_FILE}" in hint


def test_push_of_a_run_with_a_checkpoint_suggests_resume(tmp_path: Path) -> None:
    run = _unfinished_run(tmp_path, checkpoint=True)
    with pytest.raises(ConfigError) as caught:
        select_files(run, include_checkpoints=False, include_optimizer=False)
    assert f"lmctl resume {run}" in str(caught.value.hint)


# A config key spelled as its flag's alias -------------------------------------------------------


def test_config_keys_may_be_flag_aliases(tmp_path: Path, train_file: str) -> None:
    model = _model_dir(tmp_path, "tokenizer.json")
    path = tmp_path / "c.yaml"
    path.write_text(
        f"model: {model}\ntokenizer: {model}\nimport: [json]\ntrain_file: {train_file}\n"
    )
    config = build_config(MlmConfig, cli_values={}, config_file=str(path))
    assert config.model_name_or_path == str(model)
    assert config.tokenizer_name == str(model)
    assert config.imports == ["json"]
    assert config_file_problems(MlmConfig, str(path), "mlm") == []


def test_a_config_key_given_under_two_names_is_refused(tmp_path: Path) -> None:
    path = tmp_path / "c.yaml"
    path.write_text("model: ./a\nmodel_name_or_path: ./b\n")
    with pytest.raises(ConfigError) as caught:
        build_config(MlmConfig, cli_values={}, config_file=str(path))
    assert caught.value.exit_code == ExitCode.USAGE
    assert "'model' and 'model_name_or_path' both set --model-name-or-path" in caught.value.message
