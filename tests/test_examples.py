"""Every file under examples/ is a config that validates (with the data it names put in
place), another config file (DeepSpeed, FSDP, accelerate) that parses, or a cluster
template whose shell syntax is right (tests/distributed/test_cluster_templates.py runs
them), or Python that compiles."""

from __future__ import annotations

import json
import subprocess
from pathlib import Path

import pytest
import yaml

from tests.conftest import corpus_lines, lmctl, swag_records, write_jsonl

EXAMPLES = Path(__file__).resolve().parent.parent / "examples"
FILES = sorted(path for path in EXAMPLES.rglob("*") if path.is_file())
CONFIG_SUFFIXES = {".yaml", ".yml", ".json", ".toml"}
SCRIPT_SUFFIXES = {".sh", ".sbatch"}


def parse(path: Path) -> object:
    if path.suffix == ".json":
        return json.loads(path.read_text())
    if path.suffix == ".toml":
        import tomllib

        return tomllib.loads(path.read_text())
    return yaml.safe_load(path.read_text())


def write_data(config: dict[str, object], folder: Path) -> None:
    """Put the files a config names in place: text for the LM objectives, multiple-choice
    records with the config's columns for swag."""
    for key in ("train_file", "validation_file"):
        name = config.get(key)
        if not isinstance(name, str):
            continue
        path = folder / name
        path.parent.mkdir(parents=True, exist_ok=True)
        if config.get("objective") == "swag":
            endings = str(config.get("ending_columns", "ending0,ending1,ending2,ending3"))
            columns = endings.split(",")
            records = []
            for record in swag_records(8, seed=1, choices=len(columns)):
                out = {str(config.get("context_column", "sent1")): record["sent1"]}
                if config.get("question_column", "sent2"):
                    out[str(config.get("question_column", "sent2"))] = record["sent2"]
                out.update({c: record[f"ending{i}"] for i, c in enumerate(columns)})
                out[str(config.get("label_column", "label"))] = record["label"]
                records.append(out)
            write_jsonl(path, records)
        else:
            path.write_text("\n".join(corpus_lines()[:50]) + "\n")


def test_every_objective_has_a_tiny_cpu_and_a_single_gpu_config() -> None:
    for objective in ("clm", "mlm", "plm", "swag"):
        for name in ("tiny-cpu.yaml", "single-gpu.yaml"):
            assert (EXAMPLES / objective / name).is_file(), f"{objective}/{name}"


@pytest.mark.parametrize("path", FILES, ids=[str(p.relative_to(EXAMPLES)) for p in FILES])
def test_example_file(path: Path, tmp_path: Path) -> None:
    if path.suffix == ".md":
        return
    if path.suffix in SCRIPT_SUFFIXES:
        checked = subprocess.run(["bash", "-n", path], capture_output=True, text=True, check=False)
        assert checked.returncode == 0, checked.stderr
        return
    if path.suffix == ".py":  # a reader or a script that builds an example's data
        compile(path.read_text(encoding="utf-8"), str(path), "exec")
        return
    assert path.suffix in CONFIG_SUFFIXES, f"{path}: not a config file lmctl knows"
    data = parse(path)
    assert isinstance(data, dict) and data, f"{path}: not a mapping"
    if "objective" not in data:
        return  # a DeepSpeed, FSDP or accelerate config: parsing is what can be checked here
    write_data(data, tmp_path)
    proc = lmctl("config", "validate", path, cwd=tmp_path)
    assert proc.returncode == 0, proc.stdout + proc.stderr
    shown = lmctl("config", "show", str(data["objective"]), "--config", path, cwd=tmp_path)
    assert shown.returncode == 0, shown.stderr
