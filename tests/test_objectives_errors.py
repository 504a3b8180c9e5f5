"""Bad input for every objective: its documented exit code, one line, no traceback."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import (
    TINY_BERT,
    TINY_GPT2,
    TINY_XLNET,
    assert_clean_failure,
    lmctl,
    minilm_path,
    swag_records,
    write_jsonl,
)

MODELS = {"clm": TINY_GPT2, "mlm": TINY_BERT, "plm": TINY_XLNET, "swag": TINY_BERT}


@pytest.fixture
def files(tmp_path: Path, text_files: tuple[Path, Path]) -> dict[str, Path]:
    empty_txt = tmp_path / "empty.txt"
    empty_txt.write_text("")
    empty_jsonl = tmp_path / "empty.jsonl"
    empty_jsonl.write_text("")
    numbers = tmp_path / "numbers.csv"
    numbers.write_text("id,score\n1,0.5\n2,0.7\n3,0.1\n")
    docx = tmp_path / "notes.docx"
    docx.write_bytes(b"PK\x03\x04")
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("precious")
    return {
        "train.txt": text_files[0],
        "valid.txt": text_files[1],
        "train.jsonl": write_jsonl(tmp_path / "train.jsonl", swag_records(20, seed=1)),
        "valid.jsonl": write_jsonl(tmp_path / "valid.jsonl", swag_records(5, seed=2)),
        "empty.txt": empty_txt,
        "empty.jsonl": empty_jsonl,
        "numbers": numbers,
        "docx": docx,
        "busy": busy,
    }


def _args(objective: str, files: dict[str, Path], tokenizer: Path, **over: str) -> list[str]:
    kind = "jsonl" if objective == "swag" else "txt"
    args = {
        "--train-file": str(files[f"train.{kind}"]),
        "--validation-file": str(files[f"valid.{kind}"]),
        "--tokenizer-name": str(tokenizer),
        "--max-steps": "2",
    }
    args.update(over)
    out = list(MODELS[objective])
    for key, value in args.items():
        if value:
            out += [key, value]
    return out


# name -> (overrides, exit code, needles); {kind} is txt for text objectives, jsonl for swag.
CASES: dict[str, tuple[dict[str, str], int, tuple[str, ...]]] = {
    "missing train file": (
        {"--train-file": "nope.{kind}", "--validation-file": ""},
        2,
        ("--train-file nope.", "no such file"),
    ),
    "empty train file": (
        {"--train-file": "{empty}", "--validation-file": ""},
        3,
        ("empty", "no records"),
    ),
    "csv without the text column": (
        {"--train-file": "{numbers}", "--validation-file": ""},
        3,
        ("numbers.csv", "'id'"),
    ),
    "docx train file": (
        {"--train-file": "{docx}", "--validation-file": ""},
        2,
        ("notes.docx", "unsupported file type"),
    ),
    "from scratch without tokenizer": ({"--tokenizer-name": ""}, 2, ("needs a tokenizer",)),
    "negative learning rate": ({"--learning-rate": "-1"}, 2, ("--learning-rate",)),
    "unknown scheduler": ({"--lr-scheduler-type": "fancy"}, 2, ("--lr-scheduler-type", "fancy")),
    "non-empty output dir": ({"--output-dir": "{busy}"}, 2, ("busy is not empty",)),
}


def _run(
    objective: str,
    files: dict[str, Path],
    tokenizer: Path,
    tmp_path: Path,
    over: dict[str, str] | None = None,
) -> subprocess.CompletedProcess[str]:
    over = {"--output-dir": str(tmp_path / "out"), **(over or {})}
    return lmctl("train", objective, *_args(objective, files, tokenizer, **over), cwd=tmp_path)


@pytest.mark.parametrize("objective", ["mlm", "plm", "swag"])
@pytest.mark.parametrize("case", list(CASES))
def test_bad_input_table(
    objective: str,
    case: str,
    files: dict[str, Path],
    wordpiece_tokenizer: Path,
    tmp_path: Path,
) -> None:
    over, code, needles = CASES[case]
    kind = "jsonl" if objective == "swag" else "txt"
    names = {"kind": kind, "empty": str(files[f"empty.{kind}"])}
    names.update({key: str(path) for key, path in files.items() if "." not in key})
    over = {flag: value.format(**names) for flag, value in over.items()}
    proc = _run(objective, files, wordpiece_tokenizer, tmp_path, over)
    if objective == "swag" and case == "csv without the text column":
        needles = ("numbers.csv", "no column 'sent1'", "--context-column")
    assert_clean_failure(proc, code, *needles)
    if case == "non-empty output dir":
        assert (files["busy"] / "keep.txt").read_text() == "precious"


@pytest.mark.parametrize("objective", ["mlm", "plm", "swag"])
def test_overrides_with_pretrained_model(
    objective: str, tmp_path: Path, files: dict[str, Path]
) -> None:
    kind = "jsonl" if objective == "swag" else "txt"
    train = str(files[f"train.{kind}"])
    model = ("--model", str(tmp_path), "--config-overrides", "n_layer=2")
    proc = lmctl("train", objective, *model, "--train-file", train, cwd=tmp_path)
    assert_clean_failure(proc, 2, "--config-overrides can't be used with --model-name-or-path")


def test_plm_odd_max_seq_length(
    tmp_path: Path, files: dict[str, Path], wordpiece_tokenizer: Path
) -> None:
    proc = _run("plm", files, wordpiece_tokenizer, tmp_path, {"--max-seq-length": "63"})
    assert_clean_failure(proc, 2, "--max-seq-length 63", "even")
    assert not (tmp_path / "out").exists()  # rejected before anything was written


def test_plm_with_a_bert_model(tmp_path: Path, files: dict[str, Path]) -> None:
    model = ("--model", str(minilm_path()))
    train = ("--train-file", str(files["train.txt"]))
    proc = lmctl("train", "plm", *model, *train, "-o", str(tmp_path / "out"), cwd=tmp_path)
    assert_clean_failure(proc, 2, "--model-name-or-path", "bert", "XLNet", "--model-type xlnet")


def test_plm_with_bert_model_type(
    tmp_path: Path, files: dict[str, Path], wordpiece_tokenizer: Path
) -> None:
    args = _args("plm", files, wordpiece_tokenizer, **{"--output-dir": str(tmp_path / "out")})
    args[1] = "bert"
    args[3] = "hidden_size=32"
    proc = lmctl("train", "plm", *args, cwd=tmp_path)
    assert_clean_failure(proc, 2, "--model-type bert: plm trains XLNet models only")


def test_plm_tokenizer_without_mask_token(
    tmp_path: Path, files: dict[str, Path], bpe_tokenizer: Path
) -> None:
    proc = _run("plm", files, bpe_tokenizer, tmp_path)
    assert_clean_failure(proc, 2, "--tokenizer-name", "no mask token")


def test_mlm_with_a_decoder_only_architecture(
    tmp_path: Path, files: dict[str, Path], wordpiece_tokenizer: Path
) -> None:
    args = _args("mlm", files, wordpiece_tokenizer, **{"--output-dir": str(tmp_path / "out")})
    args[1:4] = ["gpt2", "--config-overrides", "n_layer=1"]
    proc = lmctl("train", "mlm", *args, cwd=tmp_path)
    assert_clean_failure(proc, 2, "--model-type gpt2", "AutoModelForMaskedLM", "bert")


def test_swag_missing_ending_column(
    tmp_path: Path, files: dict[str, Path], wordpiece_tokenizer: Path
) -> None:
    endings = "ending0,ending1,ending9"
    proc = _run("swag", files, wordpiece_tokenizer, tmp_path, {"--ending-columns": endings})
    assert_clean_failure(proc, 3, "train.jsonl", "no column 'ending9'", "--ending-columns")


def test_swag_label_outside_the_choices_names_the_line(
    tmp_path: Path, wordpiece_tokenizer: Path, files: dict[str, Path]
) -> None:
    records = swag_records(12, seed=3)
    records[6]["label"] = 4
    records[9]["label"] = -1
    train = write_jsonl(tmp_path / "bad.jsonl", records)
    proc = _run("swag", files, wordpiece_tokenizer, tmp_path, {"--train-file": str(train)})
    assert_clean_failure(proc, 3, "bad.jsonl, line 7", "label 4", "0 to 3", "1 more bad record")


def test_swag_missing_ending_value_in_csv_names_the_line(
    tmp_path: Path, wordpiece_tokenizer: Path, files: dict[str, Path]
) -> None:
    import csv

    records = swag_records(8, seed=4)
    records[4]["ending2"] = ""
    train = tmp_path / "bad.csv"
    valid = tmp_path / "valid.csv"
    for path, rows in ((train, records), (valid, swag_records(3, seed=5))):
        with open(path, "w", newline="") as handle:
            writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
            writer.writeheader()
            writer.writerows(rows)
    proc = _run(
        "swag",
        files,
        wordpiece_tokenizer,
        tmp_path,
        {"--train-file": str(train), "--validation-file": str(valid)},
    )
    assert_clean_failure(proc, 3, "bad.csv, line 6", "'ending2' is missing")


def test_json_error_object_for_every_objective(tmp_path: Path) -> None:
    for objective in ("mlm", "plm", "swag"):
        args = ("--model-type", "xlnet", "--train-file", "gone.csv", "--train-tokenizer", "50")
        proc = lmctl("train", objective, *args, "--json", cwd=tmp_path)
        assert proc.returncode == 2
        payload = json.loads(proc.stdout)
        assert payload["status"] == "error" and "gone.csv" in payload["error"]


@pytest.mark.parametrize("objective", ["mlm", "plm", "swag"])
def test_help_and_config_errors_import_nothing_heavy(objective: str) -> None:
    from tests.test_cli_help import _heavy_modules

    for args in (
        ("train", objective, "--help"),
        ("train", objective, "--learning-rate", "-1", "--train-file", "x.txt"),
        # A dry run shows the fit check's memory estimate, which builds the model on the meta
        # device; without the fit check it stays light.
        ("train", objective, "--model-type", "xlnet", "--train-tokenizer", "9", "--dry-run",
         "--no-fit-check"),
    ):  # fmt: skip
        heavy, output = _heavy_modules(*args)
        assert heavy == [], f"{args} imported {heavy}"
        assert output.strip()


@pytest.mark.parametrize(
    "objective,flags",
    [
        ("mlm", ("--line-by-line", "--pad-to-max-length", "--max-seq-length",
                 "--mlm-probability", "--whole-word-mask", "--import")),
        ("plm", ("--line-by-line", "--pad-to-max-length", "--max-seq-length",
                 "--plm-probability", "--max-span-length")),
        ("swag", ("--context-column", "--question-column", "--ending-columns",
                  "--label-column", "--max-seq-length", "--pad-to-max-length")),
    ],
)  # fmt: skip
def test_help_lists_the_upstream_options(objective: str, flags: tuple[str, ...]) -> None:
    proc = subprocess.run(
        [sys.executable, "-m", "lmctl", "train", objective, "--help"],
        capture_output=True,
        text=True,
        check=True,
        env={**os.environ, "COLUMNS": "250", "TERM": "dumb"},
    )
    for flag in flags:
        assert flag in proc.stdout, flag
