"""``lmctl config show|validate|schema``: the resolved config round-trips through --config,
every problem of a file is reported at once, and the schema describes every key."""

from __future__ import annotations

import json
from pathlib import Path

import yaml

from tests.conftest import lmctl


def test_show_round_trips_through_config(text_files: tuple[Path, Path], tmp_path: Path) -> None:
    train, valid = text_files
    flags = [
        "--model-type", "gpt2",
        "--config-overrides", "n_layer=2,n_embd=32,n_head=2",
        "--train-tokenizer", "300",
        "--train-file", str(train),
        "--validation-file", str(valid),
        "--learning-rate", "1e-3",
        "--lr-scheduler-type", "cosine",
        "--report-to", "tensorboard",
        "--no-eval",
    ]  # fmt: skip
    shown = lmctl("config", "show", "clm", *flags, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
    first = yaml.safe_load(shown.stdout)
    assert first["objective"] == "clm"
    assert first["learning_rate"] == 1e-3
    assert first["lr_scheduler_type"] == "cosine"
    assert first["do_eval"] is False
    assert first["output_dir"].startswith("runs/clm-")
    saved = tmp_path / "shown.yaml"
    saved.write_text(shown.stdout)
    again = lmctl("config", "show", "clm", "--config", saved, cwd=tmp_path)
    assert again.returncode == 0, again.stderr
    assert yaml.safe_load(again.stdout) == first
    as_json = lmctl("config", "show", "clm", "--config", saved, "--format", "json", cwd=tmp_path)
    assert json.loads(as_json.stdout) == first
    # The same merge as train: a flag given with the file overrides it.
    override = lmctl("config", "show", "clm", "--config", saved, "--seed", "7", cwd=tmp_path)
    assert yaml.safe_load(override.stdout) == {**first, "seed": 7}


def test_show_matches_train_dry_run(tmp_path: Path) -> None:
    """With no model and no data, show resolves the embedded default as train does."""
    shown = yaml.safe_load(lmctl("config", "show", "clm", "-o", "out", cwd=tmp_path).stdout)
    dry = lmctl("train", "clm", "-o", "out", "--dry-run", cwd=tmp_path)
    assert dry.returncode == 0, dry.stderr
    assert shown == yaml.safe_load(dry.stdout)


def test_validate_lists_every_problem_with_hints(
    text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    train, _ = text_files
    config = tmp_path / "run.yaml"
    config.write_text(
        "objective: clm\n"
        "model_type: gpt2\n"
        "train_tokenizer: 300\n"
        f"train_file: {train}\n"
        "learning_rat: 0.001\n"  # unknown key
        "lr_scheduler_type: cosin\n"  # not a schedule
        "per_device_train_batch_size: 0\n"  # out of range
    )
    proc = lmctl("config", "validate", config, cwd=tmp_path)
    assert proc.returncode == 2, proc.stderr
    assert "3 problems" in proc.stdout
    assert "'learning_rat' (did you mean 'learning_rate'?)" in proc.stdout
    assert "did you mean 'cosine'?" in proc.stdout
    assert "'per_device_train_batch_size'" in proc.stdout
    assert proc.stdout.count("hint:") == 3
    assert "Traceback" not in proc.stderr
    data = json.loads(lmctl("config", "validate", config, "--json", cwd=tmp_path).stdout)
    assert data["exit_code"] == 2
    assert data["valid"] is False
    assert len(data["problems"]) == 3
    assert all(problem["hint"] for problem in data["problems"])


def test_validate_checks_cross_field_rules_and_accepts_a_good_file(
    text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    train, _ = text_files
    config = tmp_path / "args.json"
    config.write_text(json.dumps({"model_type": "gpt2", "train_file": str(train)}))
    proc = lmctl("config", "validate", config, "--task", "clm", cwd=tmp_path)
    assert proc.returncode == 2
    assert "training from scratch needs a tokenizer" in proc.stdout
    config.write_text(
        json.dumps({"model_type": "gpt2", "train_file": str(train), "train_tokenizer": 300})
    )
    proc = lmctl("config", "validate", config, "--task", "clm", cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    assert "valid" in proc.stdout
    untagged = lmctl("config", "validate", config, cwd=tmp_path)
    assert untagged.returncode == 2
    assert "--task" in untagged.stderr


def test_schema_describes_every_config_key(tmp_path: Path) -> None:
    proc = lmctl("config", "schema", "mlm", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    schema = json.loads(proc.stdout)
    assert schema["$schema"].startswith("https://json-schema.org/")
    assert schema["additionalProperties"] is False
    properties = schema["properties"]
    assert properties["objective"] == {
        "const": "mlm",
        "description": "The objective this config trains.",
    }
    assert "mlm_probability" in properties
    assert properties["learning_rate"]["description"].startswith("Peak learning rate")
    assert "panel" not in properties["learning_rate"]
