"""Every bad input gets its documented exit code and one clear line, never a traceback."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import TINY_GPT2, assert_clean_failure, lmctl


@pytest.fixture
def files(tmp_path: Path, text_files: tuple[Path, Path]) -> dict[str, Path]:
    empty = tmp_path / "empty.txt"
    empty.write_text("")
    numbers = tmp_path / "numbers.csv"
    numbers.write_text("id,score\n1,0.5\n2,0.7\n3,0.1\n")
    docx = tmp_path / "notes.docx"
    docx.write_bytes(b"PK\x03\x04")
    bad_jsonl = tmp_path / "bad.jsonl"
    bad_jsonl.write_text('{"text": "one"}\n{"text": "two"\n{"text": "three"}\n')
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("precious")
    return {
        "train": text_files[0],
        "valid": text_files[1],
        "empty": empty,
        "numbers": numbers,
        "docx": docx,
        "bad_jsonl": bad_jsonl,
        "busy": busy,
    }


def _scratch(files: dict[str, Path], tokenizer: Path, **over: str) -> list[str]:
    args = {
        "--train-file": str(files["train"]),
        "--validation-file": str(files["valid"]),
        "--tokenizer-name": str(tokenizer),
        "--max-steps": "2",
    }
    args.update(over)
    out = list(TINY_GPT2)
    for key, value in args.items():
        if value:
            out += [key, value]
    return out


CASES = {
    "missing train file": (
        dict(**{"--train-file": "nope.txt", "--validation-file": ""}),
        2,
        ("--train-file nope.txt", "no such file"),
    ),
    "empty train file": ({"--train-file": "{empty}", "--validation-file": ""}, 3, ("empty",)),
    "csv without a text column": (
        {"--train-file": "{numbers}", "--validation-file": ""},
        3,
        ("numbers.csv", "'id'", "not text"),
    ),
    "docx train file": (
        {"--train-file": "{docx}", "--validation-file": ""},
        2,
        ("notes.docx", "unsupported file type"),
    ),
    "malformed jsonl": (
        {"--train-file": "{bad_jsonl}", "--validation-file": ""},
        3,
        ("bad.jsonl, line 2", "invalid JSON"),
    ),
    "negative learning rate": ({"--learning-rate": "-1"}, 2, ("--learning-rate",)),
    "unknown scheduler": ({"--lr-scheduler-type": "fancy"}, 2, ("--lr-scheduler-type", "fancy")),
    "from scratch without tokenizer": ({"--tokenizer-name": ""}, 2, ("needs a tokenizer",)),
    "non-empty output dir": ({"--output-dir": "{busy}"}, 2, ("busy is not empty",)),
    "unknown model type": ({"--model-type": "gpt3"}, 2, ("--model-type gpt3",)),
    "unknown config override": ({"--config-overrides": "n_lyer=2"}, 2, ("--config-overrides",)),
}


@pytest.mark.parametrize("case", list(CASES))
def test_bad_input(case: str, files: dict[str, Path], bpe_tokenizer: Path, tmp_path: Path) -> None:
    over, code, needles = CASES[case]
    over = {k: v.format(**{n: str(p) for n, p in files.items()}) for k, v in over.items()}
    if "--output-dir" not in over:
        over["--output-dir"] = str(tmp_path / "out")
    proc = lmctl("train", "clm", *_scratch(files, bpe_tokenizer, **over), cwd=tmp_path)
    assert_clean_failure(proc, code, *needles)
    if case == "non-empty output dir":
        assert (files["busy"] / "keep.txt").read_text() == "precious"
    else:
        assert not (tmp_path / "out").exists()  # a run that cannot start leaves nothing behind


def test_overrides_with_pretrained_model(tmp_path: Path, files: dict[str, Path]) -> None:
    proc = lmctl(
        "train",
        "clm",
        "--model",
        str(tmp_path),
        "--config-overrides",
        "n_layer=2",
        "--train-file",
        str(files["train"]),
        cwd=tmp_path,
    )
    assert_clean_failure(proc, 2, "--config-overrides can't be used with --model-name-or-path")


def test_hub_model_offline_fails_fast(tmp_path: Path, files: dict[str, Path]) -> None:
    proc = lmctl(
        "train",
        "clm",
        "--model",
        "gpt2",
        "--train-file",
        str(files["train"]),
        "--output-dir",
        str(tmp_path / "out"),
        cwd=tmp_path,
        env={"HF_ENDPOINT": "http://127.0.0.1:9"},
        timeout=120,
    )
    assert_clean_failure(proc, 6, "--model-name-or-path gpt2", "unreachable")


def test_misspelled_yaml_key_exits_2(tmp_path: Path, files: dict[str, Path]) -> None:
    config = tmp_path / "c.yaml"
    config.write_text(f"model_type: gpt2\ntrain_file: {files['train']}\nnum_train_epoch: 2\n")
    proc = lmctl("train", "clm", "--config", config, cwd=tmp_path)
    assert_clean_failure(proc, 2, "'num_train_epoch'", "did you mean 'num_train_epochs'")


def test_unknown_flag_is_usage_error(tmp_path: Path) -> None:
    proc = lmctl("train", "clm", "--lerning-rate", "1", cwd=tmp_path)
    assert proc.returncode == 2
    assert "Traceback" not in proc.stderr
    assert "--lerning-rate" in proc.stderr


def test_json_error_object(tmp_path: Path) -> None:
    import json

    proc = lmctl(
        "train",
        "clm",
        "--model-type",
        "gpt2",
        "--train-file",
        "missing.txt",
        "--train-tokenizer",
        "50",
        "--json",
        cwd=tmp_path,
    )
    assert proc.returncode == 2
    payload = json.loads(proc.stdout)
    assert payload["status"] == "error" and payload["exit_code"] == 2
    assert "missing.txt" in payload["error"]


def test_hub_dataset_offline_fails_fast(tmp_path: Path, bpe_tokenizer: Path) -> None:
    proc = lmctl(
        "train",
        "clm",
        *TINY_GPT2,
        "--tokenizer-name",
        bpe_tokenizer,
        "--dataset-name",
        "wikitext",
        "--dataset-config-name",
        "wikitext-2-raw-v1",
        "--output-dir",
        tmp_path / "out",
        cwd=tmp_path,
        env={"HF_ENDPOINT": "http://127.0.0.1:9"},
        timeout=120,
    )
    assert_clean_failure(proc, 6, "--dataset-name wikitext", "unreachable")


def test_interrupt_outside_training_says_how_to_go_on(
    capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    """Ctrl-C (or SIGTERM) outside the training loop: exit 130, one line that does not claim
    the run never trained (it may come after the last step, while results are written)."""
    import io
    import json
    import signal
    import warnings

    from lmctl.cli.runner import _run
    from lmctl.console import Console, OutputOptions
    from lmctl.errors import ExitCode

    def body(console: Console) -> None:
        raise KeyboardInterrupt

    # The runner installs its SIGTERM handler and warning display: both undone after the test.
    monkeypatch.setattr(warnings, "showwarning", warnings.showwarning)
    previous = signal.getsignal(signal.SIGTERM)
    out = io.StringIO()
    try:
        code = _run(body, Console(OutputOptions(json=True), out), "train clm")
    finally:
        signal.signal(signal.SIGTERM, previous)
    assert code == ExitCode.INTERRUPTED == 130
    result = json.loads(out.getvalue())
    assert result["status"] == "error" and result["exit_code"] == 130
    err = capsys.readouterr().err
    assert "interrupted outside the training loop" in err
    assert "lmctl resume" in err and "Traceback" not in err


def test_train_tokenizer_on_several_processes_without_a_shared_store(
    tmp_path: Path, files: dict[str, Path]
) -> None:
    """Launched by something other than torchrun, each process would train its own WordPiece
    vocabulary, and two trainings differ: refused before anything is written."""
    from tests.conftest import TINY_BERT

    out = tmp_path / "out"
    proc = lmctl(
        "train", "mlm", *TINY_BERT, "--train-tokenizer", "300", "--train-file", files["train"],
        "--line-by-line", "--max-seq-length", "32", "--max-steps", "2", "-o", out,
        cwd=tmp_path,
        env={"RANK": "0", "LOCAL_RANK": "0", "WORLD_SIZE": "2"},
    )  # fmt: skip
    assert_clean_failure(proc, 2, "--train-tokenizer", "2 processes", "--tokenizer-name")
    assert not out.exists()
