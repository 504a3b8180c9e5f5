"""``lmctl eval``: what PATH is, which objective, identical numbers, where results go.

Evaluation runs in-process (``CliRunner``) so that the heavy libraries are imported once;
the one training run it needs goes through ``python -m lmctl`` like CI.
"""

from __future__ import annotations

import csv
import json
import shutil
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from lmctl.cli.app import app
from lmctl.config.fields import flag_name
from lmctl.objectives import OBJECTIVES, get_objective
from lmctl.run import checkpoints, history, rundir
from tests.conftest import corpus_lines, lmctl

TIMING_KEYS = {"eval_runtime", "eval_samples_per_second", "eval_steps_per_second"}


def run_eval(*args: str | Path) -> tuple[int, dict[str, Any], str]:
    result = CliRunner().invoke(app, ["eval", *map(str, args), "--json"])
    payload = json.loads(result.stdout) if result.stdout.strip() else {}
    return result.exit_code, payload, result.stderr


def metrics_of(payload: dict[str, Any]) -> dict[str, Any]:
    assert payload.get("status") == "ok", payload
    return {k: v for k, v in payload["metrics"].items() if k not in TIMING_KEYS}


# A tiny model per objective, built locally ---------------------------------------------------


@dataclass
class Recipe:
    model_type: str
    overrides: dict[str, Any]
    tokenizer: str
    data: str
    options: dict[str, Any] = field(default_factory=dict)


BERT = {
    "hidden_size": 32,
    "num_hidden_layers": 2,
    "num_attention_heads": 2,
    "intermediate_size": 64,
    "max_position_embeddings": 64,
}
RECIPES = {
    "clm": Recipe(
        "gpt2",
        {"n_layer": 2, "n_embd": 32, "n_head": 2, "n_positions": 64},
        "bpe",
        "text",
        {"block_size": 32},
    ),
    "mlm": Recipe("bert", BERT, "wordpiece", "text", {"max_seq_length": 32}),
    "plm": Recipe(
        "xlnet",
        {"d_model": 32, "n_layer": 2, "n_head": 2, "d_inner": 64},
        "unigram",
        "text",
        {"max_seq_length": 32},
    ),
    "swag": Recipe("bert", BERT, "wordpiece", "swag", {"max_seq_length": 32}),
}


def _data_file(folder: Path, kind: str) -> Path:
    lines = corpus_lines()[2000:2060]
    if kind == "text":
        path = folder / "valid.txt"
        path.write_text("\n".join(lines) + "\n", encoding="utf-8")
        return path
    path = folder / "valid.csv"
    with open(path, "w", newline="", encoding="utf-8") as handle:
        writer = csv.writer(handle)
        writer.writerow(["sent1", "sent2", "ending0", "ending1", "ending2", "ending3", "label"])
        for i in range(12):
            row = lines[i * 5 : i * 5 + 5]
            writer.writerow([row[0], row[1][:20], row[2], row[3], row[4], row[0][::-1], i % 4])
    return path


def _model_dir(folder: Path, objective_name: str, recipe: Recipe) -> Path:
    import torch
    from transformers import CONFIG_MAPPING

    from lmctl.console import Console, OutputOptions
    from lmctl.models.tokenizer import train_tokenizer

    lines = corpus_lines()[:3000]
    tokenizer = train_tokenizer(
        lambda: iter([lines]),
        vocab_size=300,
        algorithm=recipe.tokenizer,
        model_max_length=64,
        console=Console(OutputOptions(quiet=True)),
        world_size=1,
    )
    config = CONFIG_MAPPING[recipe.model_type](**recipe.overrides, vocab_size=len(tokenizer))
    for name in ("pad_token_id", "bos_token_id", "eos_token_id"):
        value = getattr(tokenizer, name, None)
        if value is not None and hasattr(config, name):
            setattr(config, name, value)
    torch.manual_seed(0)
    model_class = get_objective(objective_name).auto_model_class()
    model = (
        model_class.from_config(config)
        if hasattr(model_class, "from_config")
        else model_class(config)
    )
    path = folder / "model"
    model.save_pretrained(path)
    tokenizer.save_pretrained(path)
    return path


def _copy_model(source: Path, target: Path) -> None:
    target.mkdir(parents=True, exist_ok=True)
    for file in source.iterdir():
        shutil.copy2(file, target / file.name)


def _flags(options: dict[str, Any]) -> list[str]:
    return [item for name, value in options.items() for item in (flag_name(name), str(value))]


@pytest.fixture(scope="module", params=list(OBJECTIVES))
def tiny_model(
    request: pytest.FixtureRequest, tmp_path_factory: pytest.TempPathFactory
) -> tuple[str, Path, Path, Recipe]:
    name = request.param
    assert name in RECIPES, f"add a tiny-model recipe for objective '{name}' to {__file__}"
    recipe = RECIPES[name]
    folder = tmp_path_factory.mktemp(f"eval-{name}")
    return name, _model_dir(folder, name, recipe), _data_file(folder, recipe.data), recipe


def test_same_numbers_for_model_run_and_checkpoint(
    tiny_model: tuple[str, Path, Path, Recipe], tmp_path: Path
) -> None:
    """The same weights and data give identical metrics whichever way they are named, and
    twice in a row; the objective of a bare model is inferred from its architecture."""
    name, model, data, recipe = tiny_model
    code, bare, err = run_eval(model, "--validation-file", data, *_flags(recipe.options))
    assert code == 0, err
    assert bare["objective"] == name
    first = metrics_of(bare)
    assert first["eval_samples"] > 0
    assert 0.0 <= first["eval_accuracy"] <= 1.0
    assert (first.get("perplexity") is not None) == get_objective(name).reports_perplexity
    _, again, _ = run_eval(model, "--validation-file", data, *_flags(recipe.options))
    assert metrics_of(again) == first

    run = tmp_path / "run"
    train_file = tmp_path / f"train{data.suffix}"
    shutil.copy(data, train_file)
    config = get_objective(name).config_class(
        model_name_or_path=str(model),
        train_file=str(train_file),
        validation_file=str(data),
        output_dir=str(run),
        **recipe.options,
    )
    _copy_model(model, run)
    rundir.write_config(run, config)
    train_file.unlink()  # evaluation reads only the validation data
    with checkpoints.atomic_dir(run / "checkpoint-7") as staging:
        _copy_model(model, staging)
        (staging / history.STATE_FILE).write_text(json.dumps({"global_step": 7}))
    for path, kind in ((run, "run"), (run / "checkpoint-7", "checkpoint")):
        code, payload, err = run_eval(path)
        assert code == 0, err
        assert payload["kind"] == kind
        assert metrics_of(payload) == first, kind

    # an interrupted run (no final model yet) is evaluated at its newest checkpoint
    (run / "config.json").unlink()
    code, payload, err = run_eval(run)
    assert code == 0, err
    assert payload["model"] == str(run / "checkpoint-7")
    assert metrics_of(payload) == first


# Which objective a model directory is for -----------------------------------------------------


@pytest.mark.parametrize(
    "architecture,objective",
    [
        ("GPT2LMHeadModel", "clm"),
        ("LlamaForCausalLM", "clm"),
        ("MyCustomForCausalLM", "clm"),
        ("BertForMaskedLM", "mlm"),
        ("RobertaForMaskedLM", "mlm"),
        ("XLNetLMHeadModel", "plm"),
        ("BertForMultipleChoice", "swag"),
        ("BertForSequenceClassification", None),
    ],
)
def test_objective_from_architecture(architecture: str, objective: str | None) -> None:
    from lmctl.evaluation.target import infer_objective

    assert infer_objective([architecture]) == objective


def test_every_objective_is_inferred_from_its_own_models() -> None:
    from lmctl.evaluation.target import infer_objective

    for name in OBJECTIVES:
        names = get_objective(name).model_classes()
        assert names, name
        recipe_class = {
            "clm": "GPT2LMHeadModel",
            "mlm": "BertForMaskedLM",
            "plm": "XLNetLMHeadModel",
            "swag": "BertForMultipleChoice",
        }.get(name)
        if recipe_class is not None:
            assert infer_objective([recipe_class]) == name


# Refusals ---------------------------------------------------------------------------------------


def _bare_config(folder: Path, architectures: list[str]) -> Path:
    folder.mkdir()
    (folder / "config.json").write_text(json.dumps({"architectures": architectures}))
    return folder


@pytest.mark.parametrize(
    "setup,message",
    [
        (lambda p: p / "missing", "no such directory"),
        (lambda p: p, "is neither a run directory (lmctl.yaml), a checkpoint nor a model"),
        (
            lambda p: _bare_config(p / "m", ["BertForSequenceClassification"]),
            "cannot tell which objective its architecture (BertForSequenceClassification)",
        ),
        (
            lambda p: _bare_config(p / "m", ["GPT2LMHeadModel"]),
            "is a model directory without a run config: it needs evaluation data",
        ),
    ],
)
def test_unusable_paths_exit_2(tmp_path: Path, setup: Any, message: str) -> None:
    code, payload, err = run_eval(setup(tmp_path))
    assert code == 2, err
    assert message in payload["error"]


def test_unknown_task_exits_2(tmp_path: Path) -> None:
    result = CliRunner().invoke(app, ["eval", str(tmp_path), "--task", "nope"])
    assert result.exit_code == 2


def test_incomplete_checkpoint_is_refused(tmp_path: Path) -> None:
    run = tmp_path / "run"
    run.mkdir()
    (run / rundir.CONFIG_FILE).write_text("objective: clm\n")
    (run / "checkpoint-5").mkdir()
    code, payload, _ = run_eval(run / "checkpoint-5")
    assert code == 2
    assert "incomplete or corrupted checkpoint" in payload["error"]


# A real run: numbers match training's own evaluation; results never clobbered ------------------


@pytest.fixture(scope="module")
def trained_run(
    tmp_path_factory: pytest.TempPathFactory, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> Path:
    train, valid = text_files
    out = tmp_path_factory.mktemp("eval-run") / "run"
    proc = lmctl(
        "train", "clm", "--model-type", "gpt2",
        "--config-overrides", "n_layer=2,n_embd=32,n_head=2,n_positions=64",
        "--tokenizer-name", bpe_tokenizer, "--train-file", train, "--validation-file", valid,
        "--max-train-samples", "200", "--block-size", "32", "--max-steps", "12",
        "--save-steps", "6", "--learning-rate", "1e-3", "-o", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.e2e
def test_run_eval_matches_training_and_keeps_results(trained_run: Path, tmp_path: Path) -> None:
    run = trained_run
    trained = json.loads((run / "all_results.json").read_text())
    eval_before = (run / "eval_results.json").read_text()

    code, payload, err = run_eval(run)
    assert code == 0, err
    metrics = payload["metrics"]
    assert metrics["eval_loss"] == pytest.approx(trained["eval_loss"], rel=1e-5)
    assert metrics["perplexity"] == pytest.approx(trained["perplexity"], rel=1e-4)
    assert metrics["eval_accuracy"] == pytest.approx(trained["eval_accuracy"], abs=1e-9)
    assert metrics["eval_samples"] == trained["eval_samples"]
    # training's eval_results.json is kept, and said so
    assert payload["results_file"] is None
    assert "exists" in err and "--overwrite-results" in err
    assert (run / "eval_results.json").read_text() == eval_before

    # the final checkpoint holds the same weights as the final model
    code, checkpoint, err = run_eval(run / "checkpoint-12")
    assert code == 0, err
    assert metrics_of(checkpoint) == metrics_of(payload)
    assert checkpoint["results_file"] == str(run / "checkpoint-12" / "eval_results.json")
    code, earlier, err = run_eval(run / "checkpoint-6")
    assert code == 0, err
    assert earlier["metrics"]["eval_loss"] != metrics["eval_loss"]

    out = tmp_path / "metrics.json"
    code, payload, err = run_eval(run, "--output", out, "--max-eval-samples", "20")
    assert code == 0, err
    assert (
        json.loads(out.read_text())["eval_samples"]
        == payload["metrics"]["eval_samples"]
        < (trained["eval_samples"])
    )

    code, payload, err = run_eval(run, "--max-eval-samples", "20", "--overwrite-results")
    assert code == 0, err
    results = json.loads((run / "all_results.json").read_text())
    assert results["eval_samples"] == payload["metrics"]["eval_samples"]
    for key in ("train_loss", "train_runtime", "train_samples", "epoch"):
        assert results[key] == trained[key], key
    assert (
        json.loads((run / "eval_results.json").read_text())["eval_samples"]
        == (payload["metrics"]["eval_samples"])
    )


@pytest.mark.e2e
def test_task_must_match_the_run(trained_run: Path) -> None:
    other = next(name for name in OBJECTIVES if name != "clm")
    code, payload, _ = run_eval(trained_run, "--task", other)
    assert code == 2
    assert f"--task {other}: this run trained a clm model" in payload["error"]
