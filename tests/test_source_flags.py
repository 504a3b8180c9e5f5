"""Named sources from the command line: ``--train-source [NAME=]VALUE`` (repeatable),
``--validation-source`` and ``--mix 0.7,0.3``, the same as ``train_sources`` with weights
in a config file."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest
import yaml

from lmctl.config.loader import build_config
from lmctl.errors import ConfigError
from lmctl.objectives.clm import ClmConfig
from tests.conftest import TINY_GPT2, lmctl

READER = '''
from pathlib import Path


def lines(path="books.txt", parts=(0, 1, 2, 3)):
    """The lines of ``path`` (beside this file), every fourth from each part on."""
    with open(Path(__file__).parent / path) as handle:
        rows = handle.read().splitlines()
    for part in parts:
        for row in rows[part::4]:
            yield {"text": "table " + row}
'''

#: A config that validates (the tokenizer is not read before a run).
TINY = {"model_type": "gpt2", "tokenizer_name": "gpt2"}


@pytest.fixture
def work(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Path:
    lines = [f"line {i} of a book about the sea and the ships" for i in range(300)]
    (tmp_path / "books.txt").write_text("\n".join(lines[:240]) + "\n", encoding="utf-8")
    (tmp_path / "books-valid.txt").write_text("\n".join(lines[240:]) + "\n", encoding="utf-8")
    (tmp_path / "readers.py").write_text(READER, encoding="utf-8")
    monkeypatch.chdir(tmp_path)
    return tmp_path


def configured(**flags: Any) -> ClmConfig:
    return build_config(ClmConfig, cli_values={**TINY, **flags})


@pytest.mark.parametrize(
    ("value", "expected"),
    [
        ("books.txt", {"name": "books", "file": "books.txt"}),
        ("web=books.txt", {"name": "web", "file": "books.txt"}),
        ("s3://bucket/web-*.jsonl", {"name": "web", "file": "s3://bucket/web-*.jsonl"}),
        ("table=readers.py:lines", {"name": "table", "reader": "readers.py:lines"}),
        ("my_pkg.sources:rows", {"name": "rows", "reader": "my_pkg.sources:rows"}),
        ("odps-table", {"name": "odps_table", "reader": "odps-table"}),
    ],
)
def test_a_train_source_value_names_a_file_or_a_reader(
    work: Path, value: str, expected: dict[str, str]
) -> None:
    (source,) = configured(train_sources=[value], do_eval=False).train_sources
    shown = source.model_dump(exclude_none=True, exclude={"args"})
    if "reader" in shown and shown["reader"].endswith(".py:lines"):
        shown["reader"] = "readers.py:lines"  # recorded by its absolute path
    assert shown == expected


def test_mix_weighs_the_sources_in_their_order(work: Path) -> None:
    config = configured(
        train_sources=["books.txt", "table=readers.py:lines"],
        mix=["0.7,0.3"],
        validation_sources=["books-valid.txt"],
    )
    assert [(s.name, s.weight) for s in config.train_sources] == [("books", 0.7), ("table", 0.3)]
    assert [s.name for s in config.validation_sources] == ["books_valid"]
    assert config.mix == []  # the weights live in the sources, as in a config file
    again = configured(train_sources=["books.txt", "readers.py:lines"], mix=["2", "1"])
    assert [s.weight for s in again.train_sources] == [2.0, 1.0]  # repeated --mix too


def test_mix_overrides_the_weights_of_a_config_file(work: Path) -> None:
    sources = [{"name": "a", "file": "books.txt", "weight": 1}, {"name": "b", "file": "books.txt"}]
    (work / "mix.yaml").write_text(yaml.safe_dump({"train_sources": sources}), encoding="utf-8")
    config = build_config(ClmConfig, cli_values={**TINY, "mix": ["1,3"]}, config_file="mix.yaml")
    assert [s.weight for s in config.train_sources] == [1.0, 3.0]


@pytest.mark.parametrize(
    ("flags", "expected"),
    [
        ({"mix": ["0.7,-0.3"]}, "--mix 0.7,-0.3: weights must be positive numbers"),
        ({"mix": ["0.7,0"]}, "--mix 0.7,0: weights must be positive numbers"),
        ({"mix": ["0.7,many"]}, "--mix 0.7,many: weights must be positive numbers"),
        ({"mix": ["0.5,0.3,0.2"]}, "--mix 0.5,0.3,0.2: 3 weights for 2 training sources"),
        ({"mix": ["1"], "train_sources": []}, "--mix 1: 1 weight for no training sources"),
        ({"train_sources": ["9web=books.txt"]}, "--train-source 9web=books.txt: '9web' cannot"),
        ({"train_sources": ["books.txt", "books.txt"]}, "'books' names another source"),
    ],
)
def test_flag_errors_name_the_flag(work: Path, flags: dict[str, Any], expected: str) -> None:
    values = {"train_sources": ["books.txt", "readers.py:lines"], **flags}
    with pytest.raises(ConfigError) as caught:
        configured(**values)
    assert expected in caught.value.message
    assert caught.value.exit_code == 2


def test_flag_errors_exit_2_in_one_line(work: Path) -> None:
    proc = lmctl(
        "train", "clm", *TINY_GPT2, "--train-source", "books.txt", "--train-source",
        "readers.py:lines", "--mix", "0.7", cwd=work,
    )  # fmt: skip
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1 and "--mix 0.7: 1 weight for 2 training sources" in errors[0]


@pytest.mark.slow
@pytest.mark.e2e
def test_a_mixture_from_flags_trains_evaluates_each_source_and_resumes_elsewhere(
    work: Path, bpe_tokenizer: Path
) -> None:
    run = work / "run"
    proc = lmctl(
        "train", "clm", *TINY_GPT2, "--tokenizer-name", bpe_tokenizer,
        "--train-source", "books=books.txt", "--train-source", "table=readers.py:lines",
        "--mix", "0.7,0.3", "--validation-source", "books=books-valid.txt",
        "--validation-source", "table=readers.py:lines", "--block-size", "16",
        "--max-steps", "2", "--save-steps", "2", "--output-dir", run, cwd=work,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    assert "training mixture: books (file books.txt) weight 0.7; table (reader" in proc.stderr
    results = json.loads((run / "all_results.json").read_text())
    for name in ("books", "table"):
        assert results[f"eval_{name}_loss"] > 0
        assert 0 < results[f"train_{name}_share"] < 1
    saved = yaml.safe_load((run / "lmctl.yaml").read_text())
    assert [s["weight"] for s in saved["train_sources"]] == [0.7, 0.3]
    assert saved["train_sources"][0]["file"] == str(work / "books.txt")  # resumable anywhere

    elsewhere = work / "elsewhere"
    elsewhere.mkdir()
    proc = lmctl("resume", run, "--max-steps", "3", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 3

    proc = lmctl("runs", run, "--json")
    (shown,) = json.loads(proc.stdout)["runs"]
    assert set(shown["train_shares"]) == {"books", "table"}
    assert set(shown["source_eval_loss"]) == {"books", "table"}
