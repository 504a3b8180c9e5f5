"""Mistakes on the command line itself (lmctl.cli.usage): one message with a hint, exit 2, and
with ``--json`` the one JSON object on stdout, through both entry points: ``python -m lmctl``
(``main``, which first rewrites upstream flags) and the Typer app itself."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from typer.testing import CliRunner

from lmctl.cli.app import app, main

#: (argv, words the message must hold)
PARSING_MISTAKES = [
    (["train", "mlm", "--lerning-rate", "3"], ["--lerning-rate", "--learning-rate"]),
    (["train", "bert"], ["'bert'", "clm, mlm, plm, swag"]),
    (["trian"], ["'trian'", "'lmctl train'"]),
    (["--bogus"], ["--bogus"]),
    (["train", "clm", "--block-size"], ["--block-size"]),
    (["resume"], ["RUN_DIR"]),
    (["runs", "a", "b"], ["unexpected extra argument"]),
]
MISTAKE_IDS = [" ".join(argv) for argv, _ in PARSING_MISTAKES]


def _one_json_object(stdout: str) -> dict[str, object]:
    lines = [line for line in stdout.splitlines() if line.strip()]
    assert len(lines) == 1, stdout
    payload = json.loads(lines[0])
    assert isinstance(payload, dict)
    return payload


def _through_main(
    argv: list[str], capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> tuple[int, str, str]:
    monkeypatch.setenv("CI", "1")
    monkeypatch.delenv("LMCTL_DEBUG", raising=False)
    with pytest.raises(SystemExit) as done:
        main(argv)
    captured = capsys.readouterr()
    return int(done.value.code or 0), captured.out, captured.err


@pytest.mark.parametrize(("argv", "words"), PARSING_MISTAKES, ids=MISTAKE_IDS)
def test_parsing_mistake_with_json_prints_one_object(
    argv: list[str],
    words: list[str],
    capsys: pytest.CaptureFixture[str],
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    code, out, err = _through_main([*argv, "--json"], capsys, monkeypatch)
    assert code == 2, err
    payload = _one_json_object(out)
    assert payload["status"] == "error" and payload["exit_code"] == 2
    for word in words:
        assert word in str(payload["error"]), payload
    assert payload["hint"]
    assert "Traceback" not in err


@pytest.mark.parametrize(("argv", "words"), PARSING_MISTAKES, ids=MISTAKE_IDS)
def test_parsing_mistake_is_one_error_line_with_a_hint(argv: list[str], words: list[str]) -> None:
    """The Typer app on its own (as the reliability harness runs it) tells them the same way;
    without --json, stdout stays empty."""
    result = CliRunner(env={"CI": "1"}).invoke(app, argv, prog_name="lmctl")
    assert result.exit_code == 2, result.output
    assert result.stdout == ""
    errors = [line for line in result.stderr.splitlines() if " ERROR " in line]
    assert len(errors) == 1, result.stderr
    assert "(hint: " in errors[0]
    for word in words:
        assert word in errors[0]


def test_json_is_found_anywhere_on_the_command_line() -> None:
    result = CliRunner(env={"CI": "1"}).invoke(app, ["train", "--json", "bert"], prog_name="lmctl")
    assert result.exit_code == 2
    assert _one_json_object(result.stdout)["command"] == "train"


def test_suggestions_name_only_flags_that_help_shows() -> None:
    """``--training-args`` is hidden: a typo close to it suggests what --help lists."""
    result = CliRunner(env={"CI": "1"}).invoke(
        app, ["train", "mlm", "--trainng-args", "x"], prog_name="lmctl"
    )
    assert result.exit_code == 2
    assert "--trainng-args" in result.stderr
    assert "--training-args" not in result.stderr


def test_a_bad_config_with_json_lists_every_problem(
    tmp_path: Path, capsys: pytest.CaptureFixture[str], monkeypatch: pytest.MonkeyPatch
) -> None:
    config = tmp_path / "bad.yaml"
    config.write_text("learning_rat: 0.1\nlr_scheduler_type: cosin\nmax_steps: abc\n")
    train = tmp_path / "t.txt"
    train.write_text("some words\n")
    argv = ["train", "clm", "--model-type", "gpt2", "--train-tokenizer", "100"]
    argv += ["--train-file", str(train), "--config", str(config), "--json"]
    code, out, _ = _through_main(argv, capsys, monkeypatch)
    assert code == 2
    payload = _one_json_object(out)
    problems = payload["problems"]
    assert isinstance(problems, list) and len(problems) == 3, payload
    shown = json.dumps(problems)
    for word in ("learning_rat", "cosin", "max_steps"):
        assert word in shown
    assert str(payload["error"]).startswith("3 problems")
