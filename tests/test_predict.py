"""``lmctl predict PATH``: continuations, filled masks and scored endings of real tiny runs,
through the command as a user runs it; PATH refused exactly as ``lmctl eval`` refuses it.

The inputs' reading and the plain rendering are checked in-process; every prediction goes
through ``python -m lmctl`` like CI.
"""

from __future__ import annotations

import io
import json
import math
import shutil
import subprocess
from pathlib import Path
from typing import Any

import pytest

from lmctl.errors import ConfigError, DataError
from tests.conftest import TINY_BERT, TINY_XLNET, lmctl, write_jsonl

# The command ----------------------------------------------------------------------------------


def predict_json(*args: str | Path) -> dict[str, Any]:
    proc = lmctl("predict", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    payload = json.loads(proc.stdout)  # stdout is exactly one JSON object
    assert isinstance(payload, dict) and payload["status"] == "ok", payload
    assert payload["command"] == "predict"
    return payload


def predict_plain(*args: str | Path) -> str:
    proc = lmctl("predict", *args)
    assert proc.returncode == 0, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "\x1b[" not in proc.stdout  # not a terminal: plain lines
    return proc.stdout


def error_line(proc: subprocess.CompletedProcess[str]) -> str:
    assert "Traceback" not in proc.stdout + proc.stderr
    errors = [line for line in proc.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, proc.stderr
    return errors[0].split(" ERROR ", 1)[1]


@pytest.mark.e2e
def test_clm_run_continues_each_prompt_and_a_file_url_gives_the_same(tiny_clm_run: Path) -> None:
    prompts = ["ROMEO:", "To be, or not"]
    plain = predict_plain(
        tiny_clm_run, "--prompt", prompts[0], "--prompt", prompts[1], "--max-new-tokens", "4"
    )
    lines = plain.splitlines()
    assert [line for line in lines if line.startswith("prompt: ")] == [
        f"prompt: {prompt}" for prompt in prompts
    ]
    # One line each: a line break in a continuation is shown as \n.
    shown = [
        line.removeprefix("continuation: ").replace("\\n", "\n")
        for line in lines
        if line.startswith("continuation: ")
    ]
    assert len(shown) == 2

    # The same run named by a file:// URL, as JSON: the same greedy continuations.
    payload = predict_json(
        f"file://{tiny_clm_run.resolve()}",
        "--prompt", prompts[0], "--prompt", prompts[1], "--max-new-tokens", "4",
    )  # fmt: skip
    assert payload["objective"] == "clm" and payload["kind"] == "run"
    assert payload["settings"] == {"max_new_tokens": 4, "do_sample": False, "seed": 42}
    predictions = payload["predictions"]
    assert [p["prompt"] for p in predictions] == prompts
    assert all(1 <= p["new_tokens"] <= 4 for p in predictions)
    assert [p["continuation"] for p in predictions] == shown


@pytest.mark.e2e
def test_plm_run_samples_from_the_seed_afresh_for_each_prompt(
    tmp_path: Path, text_files: tuple[Path, Path]
) -> None:
    run = tmp_path / "run"
    proc = lmctl(
        "train", "plm", *TINY_XLNET, "--train-tokenizer", "300",
        "--train-file", text_files[0], "--no-eval", "--max-seq-length", "32",
        "--max-train-samples", "32", "--max-steps", "2", "-o", run,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    payload = predict_json(
        run, "--prompt", "the king", "--prompt", "the king", "--prompt", "a queen",
        "--do-sample", "--seed", "3", "--max-new-tokens", "3",
    )  # fmt: skip
    assert payload["objective"] == "plm"
    assert payload["settings"]["do_sample"] is True
    first, again, other = payload["predictions"]
    assert all(1 <= p["new_tokens"] <= 3 for p in payload["predictions"])
    assert first["continuation"] == again["continuation"]  # the same draws for the same prompt
    assert other["prompt"] == "a queen"


@pytest.fixture(scope="module")
def tiny_mlm_run(
    tmp_path_factory: pytest.TempPathFactory,
    text_files: tuple[Path, Path],
    wordpiece_tokenizer: Path,
) -> Path:
    out = tmp_path_factory.mktemp("predict-mlm") / "run"
    proc = lmctl(
        "train", "mlm", *TINY_BERT, "--tokenizer-name", wordpiece_tokenizer,
        "--train-file", text_files[0], "--no-eval", "--max-seq-length", "32",
        "--max-train-samples", "32", "--max-steps", "2", "-o", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.e2e
def test_mlm_run_shows_the_top_k_of_each_mask(tiny_mlm_run: Path) -> None:
    text = "the [MASK] of the king is [MASK] ."
    payload = predict_json(tiny_mlm_run, "--prompt", text, "--top-k", "3")
    assert payload["objective"] == "mlm"
    (prediction,) = payload["predictions"]
    assert prediction["text"] == text
    assert [mask["mask"] for mask in prediction["masks"]] == [1, 2]
    for mask in prediction["masks"]:
        probabilities = [c["probability"] for c in mask["candidates"]]
        assert len(probabilities) == 3
        assert probabilities == sorted(probabilities, reverse=True)
        assert all(0 < p <= 1 for p in probabilities) and sum(probabilities) <= 1 + 1e-6
    best = [mask["candidates"][0]["token"] for mask in prediction["masks"]]
    assert "[MASK]" not in prediction["filled"]
    assert prediction["filled"] == f"the {best[0]} of the king is {best[1]} ."

    plain = predict_plain(tiny_mlm_run, "--prompt", text, "--top-k", "3").splitlines()
    assert f"text: {text}" in plain
    for number, mask in enumerate(prediction["masks"], start=1):
        expected = ", ".join(f"{c['token']} {c['probability']:.4f}" for c in mask["candidates"])
        assert f"mask {number}: {expected}" in plain


@pytest.mark.e2e
def test_mlm_text_without_the_mask_token_exits_2(tiny_mlm_run: Path) -> None:
    proc = lmctl("predict", tiny_mlm_run, "--prompt", "the king is dead")
    assert proc.returncode == 2, proc.stderr
    message = error_line(proc)
    assert "--prompt: no mask token [MASK]" in message
    assert "put [MASK] where" in message


@pytest.fixture(scope="module")
def tiny_swag_run(
    tmp_path_factory: pytest.TempPathFactory,
    swag_files: tuple[Path, Path],
    wordpiece_tokenizer: Path,
) -> Path:
    out = tmp_path_factory.mktemp("predict-swag") / "run"
    proc = lmctl(
        "train", "swag", *TINY_BERT, "--tokenizer-name", wordpiece_tokenizer,
        "--train-file", swag_files[0], "--no-eval", "--max-seq-length", "32",
        "--max-train-samples", "32", "--max-steps", "2", "-o", out,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    return out


@pytest.mark.e2e
def test_swag_run_gives_each_endings_probability(
    tiny_swag_run: Path, swag_files: tuple[Path, Path], tmp_path: Path
) -> None:
    records = [json.loads(line) for line in swag_files[1].read_text().splitlines()[:3]]
    records[1].pop("label")  # a record to predict need not have one
    records_file = write_jsonl(tmp_path / "records.jsonl", records)
    payload = predict_json(tiny_swag_run, "--input", records_file)
    assert payload["objective"] == "swag"
    predictions = payload["predictions"]
    assert len(predictions) == 3
    for record, prediction in zip(records, predictions, strict=True):
        endings = [ending["ending"] for ending in prediction["endings"]]
        assert endings == [record[f"ending{i}"] for i in range(4)]
        probabilities = [ending["probability"] for ending in prediction["endings"]]
        assert math.isclose(sum(probabilities), 1.0, abs_tol=1e-4)
        assert prediction["choice"] == probabilities.index(max(probabilities))
        assert prediction["chosen"] == endings[prediction["choice"]]
        assert ("label" in prediction) == ("label" in record)

    plain = predict_plain(tiny_swag_run, "--input", records_file).splitlines()
    assert sum("(chosen" in line for line in plain) == 3
    for prediction in predictions:
        for ending in prediction["endings"]:
            assert any(
                line.startswith(f"  {ending['probability']:.4f}  {ending['ending']}")
                for line in plain
            ), plain


# Refusals: PATH as lmctl eval refuses it; inputs before any model loads ---------------------------


def _run_without_model(folder: Path, _: Path) -> Path:
    folder.mkdir()
    (folder / "lmctl.yaml").write_text("objective: clm\n")
    return folder


def _corrupted_model(folder: Path, run: Path) -> Path:
    shutil.copytree(run, folder)
    weights = folder / "model.safetensors"
    weights.write_bytes(weights.read_bytes()[:100])
    return folder


@pytest.mark.e2e
@pytest.mark.parametrize(
    ("setup", "code"),
    [
        (lambda folder, _: folder, 2),  # no such directory
        (lambda folder, _: folder.mkdir() or folder, 2),  # an empty directory
        (_run_without_model, 2),
        (_corrupted_model, 5),
    ],
    ids=["missing", "empty", "run-without-model", "corrupted-model"],
)
def test_a_path_without_a_model_is_refused_as_eval_refuses_it(
    setup: Any, code: int, tiny_clm_run: Path, tmp_path: Path
) -> None:
    path = setup(tmp_path / "target", tiny_clm_run)
    predicted = lmctl("predict", path, "--prompt", "ROMEO:", "--json")
    evaluated = lmctl("eval", path, "--json")
    assert predicted.returncode == evaluated.returncode == code, predicted.stderr
    assert error_line(predicted) == error_line(evaluated)
    assert json.loads(predicted.stdout)["exit_code"] == code


def test_no_input_exits_2(tmp_path: Path) -> None:
    proc = lmctl("predict", tmp_path)
    assert proc.returncode == 2
    assert "no --prompt and no --input" in error_line(proc)


def test_a_missing_input_file_exits_2(tmp_path: Path) -> None:
    model = tmp_path / "model"  # a model directory, as far as PATH goes
    model.mkdir()
    (model / "config.json").write_text(json.dumps({"architectures": ["GPT2LMHeadModel"]}))
    proc = lmctl("predict", model, "--input", tmp_path / "prompts.txt")
    assert proc.returncode == 2
    assert f"--input {tmp_path / 'prompts.txt'}: no such file" in error_line(proc)


# Inputs and rendering, in-process -------------------------------------------------------------


def test_text_inputs_skip_blank_lines_and_name_each_line(tmp_path: Path) -> None:
    from lmctl.prediction.inputs import read_texts

    file = tmp_path / "prompts.txt"
    file.write_text("first\n\n  \nsecond\n", encoding="utf-8")
    items = read_texts(["given"], str(file))
    assert [(item.where, item.text) for item in items] == [
        ("--prompt", "given"),
        (f"{file} line 1", "first"),
        (f"{file} line 4", "second"),
    ]
    blank = tmp_path / "blank.txt"
    blank.write_text("\n \n", encoding="utf-8")
    with pytest.raises(DataError, match="no text in it"):
        read_texts([], str(blank))
    with pytest.raises(ConfigError, match="--prompt 2 is empty"):
        read_texts(["a", " "], None)


def test_records_from_csv_json_lines_and_prompts(tmp_path: Path) -> None:
    from lmctl.prediction.choices import check_records, record_options
    from lmctl.prediction.inputs import read_records

    csv_file = tmp_path / "dev.csv"
    csv_file.write_text('q,a,b\n"a, b",x,y\n\nc,z,w\n', encoding="utf-8")
    items = read_records(['{"q": "p", "a": "1", "b": "2"}'], str(csv_file))
    assert [item.record for item in items] == [
        {"q": "p", "a": "1", "b": "2"},
        {"q": "a, b", "a": "x", "b": "y"},
        {"q": "c", "a": "z", "b": "w"},
    ]
    options = record_options({"context_column": "q", "ending_columns": "a,b"})
    check_records(items, options)  # the run's own columns: accepted
    with pytest.raises(DataError, match="no column 'sent1', 'ending0', 'ending1'"):
        check_records(items, record_options({}))  # train swag's defaults
    bad = tmp_path / "bad.jsonl"
    bad.write_text('{"q": "p"}\nnot json\n', encoding="utf-8")
    with pytest.raises(DataError, match=r"bad\.jsonl line 2: not a JSON object"):
        read_records([], str(bad))
    with pytest.raises(ConfigError, match="not plain text"):
        read_records([], _txt(tmp_path))


def _txt(folder: Path) -> str:
    path = folder / "records.txt"
    path.write_text("a line\n", encoding="utf-8")
    return str(path)


def test_plain_rendering_of_masks() -> None:
    from lmctl.console import Console, OutputOptions
    from lmctl.prediction.show import show

    out = io.StringIO()
    console = Console(OutputOptions(no_progress=True), out)
    prediction = {
        "text": "a [MASK] b",
        "filled": "a x b",
        "masks": [
            {
                "mask": 1,
                "position": 2,
                "candidates": [
                    {"token": "x", "probability": 0.5},
                    {"token": "y", "probability": 0.25},
                ],
            }
        ],
    }
    show(console, "masks", [prediction])
    assert out.getvalue() == "text: a [MASK] b\nfilled: a x b\nmask 1: x 0.5000, y 0.2500\n"


def test_only_the_embedded_default_ends_with_a_sample(tmp_path: Path) -> None:
    from lmctl.cli.train import SAMPLE_PROMPTS, runs_embedded_default

    assert "clm" in SAMPLE_PROMPTS
    assert runs_embedded_default("clm", {"max_steps": 3}, None)
    assert not runs_embedded_default("clm", {"train_file": "a.txt"}, None)
    config = tmp_path / "c.yaml"
    config.write_text("model_type: gpt2\n", encoding="utf-8")
    assert not runs_embedded_default("clm", {}, str(config))
    assert not runs_embedded_default("mlm", {}, None)  # mlm has no embedded default


@pytest.mark.e2e
def test_sample_line_says_a_continuation_and_never_fails(
    tiny_clm_run: Path, tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    from lmctl.console import Console, OutputOptions
    from lmctl.prediction import sample_line

    console = Console(OutputOptions(no_progress=True))
    sample_line(str(tiny_clm_run), "ROMEO:", console, max_new_tokens=3)
    err = capsys.readouterr().err
    said = [line for line in err.splitlines() if " sample: ROMEO: → " in line]
    assert len(said) == 1, err
    assert said[0].split(" → ", 1)[1].strip()  # a continuation

    sample_line(str(tmp_path / "nothing"), "ROMEO:", console)  # no run there: a warning
    err = capsys.readouterr().err
    assert " WARN " in err and "no sample continuation" in err
