"""Custom tokenizers: a ``PreTrainedTokenizer`` subclass of the user's own, registered with
``AutoTokenizer`` by an ``--import`` module or an ``lmctl.models`` entry point, trains, is
saved with the run, and loads again for ``eval``, ``resume``, ``predict`` and ``data
inspect`` (the run's lmctl.yaml records the import)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from tests.conftest import TINY_GPT2, lmctl

#: A character-level tokenizer with a fixed alphabet: no vocabulary file to save.
CHAR_TOKENIZER = """
from transformers import AutoConfig, AutoTokenizer, PretrainedConfig, PreTrainedTokenizer

SPECIALS = ["<pad>", "<unk>", "<eos>"]
ALPHABET = [chr(code) for code in range(32, 127)]


class CharConfig(PretrainedConfig):
    model_type = "lmctl-test-char"


class CharTokenizer(PreTrainedTokenizer):
    vocab_files_names = {}
    model_input_names = ["input_ids", "attention_mask"]

    def __init__(self, **kwargs):
        self.ids = {token: index for index, token in enumerate(SPECIALS + ALPHABET)}
        self.tokens = {index: token for token, index in self.ids.items()}
        for role, token in zip(("pad", "unk", "eos"), SPECIALS):
            kwargs.setdefault(f"{role}_token", token)
        super().__init__(**kwargs)

    @property
    def vocab_size(self):
        return len(self.ids)

    def get_vocab(self):
        return dict(self.ids)

    def _tokenize(self, text, **kwargs):
        return list(text)

    def _convert_token_to_id(self, token):
        return self.ids.get(token, self.ids["<unk>"])

    def _convert_id_to_token(self, index):
        return self.tokens.get(index, "<unk>")

    def convert_tokens_to_string(self, tokens):
        return "".join(tokens)

    def save_vocabulary(self, save_directory, filename_prefix=None):
        return ()


AutoConfig.register(CharConfig.model_type, CharConfig)
AutoTokenizer.register(CharConfig, slow_tokenizer_class=CharTokenizer)
"""


def _char_tokenizer(where: Path, module: str) -> tuple[Path, Path]:
    """The module file ``module``.py and a tokenizer directory saved by its class (in a
    subprocess: registering with the Auto classes is global)."""
    where.mkdir(parents=True, exist_ok=True)
    source = where / f"{module}.py"
    source.write_text(CHAR_TOKENIZER)
    saved = where / "char-tokenizer"
    tokenizer = f"{module}.CharTokenizer(model_max_length=256)"
    code = f"import {module}\n{tokenizer}.save_pretrained({str(saved)!r})"
    subprocess.run([sys.executable, "-c", code], cwd=where, check=True, timeout=120)
    return source, saved


def _train(
    tmp_path: Path, text_files: tuple[Path, Path], tokenizer: Path, *extra: str | Path, **kw: object
) -> subprocess.CompletedProcess[str]:
    train, valid = text_files
    return lmctl(
        "train", "clm", *TINY_GPT2, "--tokenizer-name", tokenizer, "--train-file", train,
        "--validation-file", valid, "--block-size", "64", "--save-steps", "2",
        "--output-dir", tmp_path / "run", *extra, **kw,  # type: ignore[arg-type]
    )  # fmt: skip


@pytest.mark.slow
@pytest.mark.e2e
def test_char_tokenizer_from_an_import_trains_evaluates_resumes_and_predicts(
    tmp_path: Path, text_files: tuple[Path, Path]
) -> None:
    module, tokenizer = _char_tokenizer(tmp_path / "user", "char_tokenizer")
    proc = _train(tmp_path, text_files, tokenizer, "--import", module, "--max-steps", "4")
    assert proc.returncode == 0, proc.stderr
    run = tmp_path / "run"
    saved = json.loads((run / "tokenizer_config.json").read_text())
    assert saved["tokenizer_class"] == "CharTokenizer"
    assert json.loads((run / "config.json").read_text())["vocab_size"] == 3 + 95
    assert str(module.resolve()) in (run / "lmctl.yaml").read_text()

    elsewhere = tmp_path / "elsewhere"  # the module is found through the recorded path
    elsewhere.mkdir()
    proc = lmctl("eval", run, "--json", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert "eval_loss" in json.loads(proc.stdout)["metrics"]

    proc = lmctl("resume", run, "--max-steps", "6", cwd=elsewhere)
    assert proc.returncode == 0, proc.stderr
    assert json.loads((run / "trainer_state.json").read_text())["global_step"] == 6

    proc = lmctl("predict", run, "--prompt", "the", "--max-new-tokens", "4", "--json")
    assert proc.returncode == 0, proc.stderr
    (prediction,) = json.loads(proc.stdout)["predictions"]
    assert prediction["prompt"] == "the" and 1 <= prediction["new_tokens"] <= 4


@pytest.mark.e2e
def test_char_tokenizer_in_data_inspect(tmp_path: Path, text_files: tuple[Path, Path]) -> None:
    module, tokenizer = _char_tokenizer(tmp_path, "char_tokenizer")
    train, _ = text_files
    proc = lmctl(
        "data", "inspect", "clm", "--import", module, "--tokenizer-name", tokenizer,
        "--train-file", train, "--block-size", "64", "--json",
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    report = json.loads(proc.stdout)
    characters = sum(len(line) for line in train.read_text().splitlines())
    assert report["splits"]["train"]["tokens"] == characters


@pytest.mark.slow
@pytest.mark.e2e
def test_char_tokenizer_from_an_entry_point(tmp_path: Path, text_files: tuple[Path, Path]) -> None:
    site = tmp_path / "site"
    _, tokenizer = _char_tokenizer(site, "char_tokenizer_plugin")
    dist = site / "char_tokenizer_plugin-1.0.dist-info"
    dist.mkdir()
    (dist / "METADATA").write_text("Metadata-Version: 2.1\nName: char-tokenizer-plugin\n")
    (dist / "entry_points.txt").write_text("[lmctl.models]\nchars = char_tokenizer_plugin\n")
    env = {"PYTHONPATH": os.pathsep.join([str(site), os.environ.get("PYTHONPATH", "")])}
    proc = _train(tmp_path, text_files, tokenizer, "--max-steps", "2", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "loaded entry point char_tokenizer_plugin" in proc.stderr
    proc = lmctl("eval", tmp_path / "run", "--json", env=env)
    assert proc.returncode == 0, proc.stderr
    assert "eval_loss" in json.loads(proc.stdout)["metrics"]
