"""Custom architectures: a user's own config/model classes, registered with the Auto classes,
trained from scratch through ``--import`` or an ``lmctl.models`` entry point."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
from pathlib import Path

import pytest

from tests.conftest import FIXTURES, lmctl

CUSTOM = FIXTURES / "custom_arch.py"
MODEL_TYPE = "lmctl-tiny-lm"


def _run(
    tmp_path: Path,
    text_files: tuple[Path, Path],
    tokenizer: Path,
    *extra: str,
    env: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    train, valid = text_files
    return lmctl(
        "train", "clm", *extra, "--model-type", MODEL_TYPE, "--config-overrides",
        "hidden_size=24", "--tokenizer-name", tokenizer, "--train-file", train,
        "--validation-file", valid, "--block-size", "64", "--max-steps", "6",
        "--output-dir", tmp_path / "run", cwd=tmp_path, env=env,
    )  # fmt: skip


@pytest.mark.e2e
def test_train_custom_architecture_from_a_py_file(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    import importlib.util

    from transformers import AutoModelForCausalLM

    proc = _run(tmp_path, text_files, bpe_tokenizer, "--import", str(CUSTOM))
    assert proc.returncode == 0, proc.stderr
    assert f"training a new {MODEL_TYPE} model from scratch" in proc.stderr
    run = tmp_path / "run"
    config = json.loads((run / "config.json").read_text())
    assert config["model_type"] == MODEL_TYPE and config["hidden_size"] == 24
    assert {"perplexity", "eval_accuracy"} <= set(
        json.loads((run / "all_results.json").read_text())
    )
    assert str(CUSTOM.resolve()) in (run / "lmctl.yaml").read_text()  # resume/eval re-import it

    spec = importlib.util.spec_from_file_location("custom_arch", CUSTOM)
    assert spec is not None and spec.loader is not None
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    model = AutoModelForCausalLM.from_pretrained(run)
    assert type(model).__name__ == "TinyLM"


@pytest.mark.slow
@pytest.mark.e2e
def test_module_name_and_entry_point(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    # --import by module name, found in the working directory.
    shutil.copy(CUSTOM, tmp_path / "my_models.py")
    proc = _run(tmp_path, text_files, bpe_tokenizer, "--import", "my_models")
    assert proc.returncode == 0, proc.stderr
    assert "imported my_models (--import my_models)" in proc.stderr

    # An installed package declaring an lmctl.models entry point: no flag needed.
    site = tmp_path / "site"
    site.mkdir()
    shutil.copy(CUSTOM, site / "tiny_lm_plugin.py")
    dist = site / "tiny_lm_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: tiny-lm-plugin\nVersion: 1.0\n")
    (dist / "entry_points.txt").write_text("[lmctl.models]\ntiny = tiny_lm_plugin\n")
    shutil.rmtree(tmp_path / "run")
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    path = os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])
    proc = _run(elsewhere, text_files, bpe_tokenizer, env={"PYTHONPATH": path})
    assert proc.returncode == 0, proc.stderr
    assert "loaded entry point tiny_lm_plugin" in proc.stderr


def test_unknown_custom_type_without_import(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    proc = _run(tmp_path, text_files, bpe_tokenizer)
    assert proc.returncode == 2, proc.stderr
    assert f"--model-type {MODEL_TYPE}: unknown architecture" in proc.stderr


IMPORT_ERRORS = {
    "unknown module": ("no_such_module_xyz", None, 2, "--import no_such_module_xyz: no module"),
    "missing file": ("missing.py", None, 2, "--import missing.py: no such file"),
    "module raises": ("broken.py", "raise RuntimeError('boom')\n", 5, "(RuntimeError: boom)"),
}


@pytest.mark.parametrize("case", list(IMPORT_ERRORS))
def test_import_errors(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path, case: str
) -> None:
    module, source, code, needle = IMPORT_ERRORS[case]
    if source is not None:
        (tmp_path / module).write_text(source)
    proc = _run(tmp_path, text_files, bpe_tokenizer, "--import", module)
    assert proc.returncode == code, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and needle in errors[0], proc.stderr
