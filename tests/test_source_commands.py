"""Named sources in ``lmctl prepare`` (a mixture's files and versioned readers are prepared
once and reused by ``train``) and in ``lmctl data inspect`` (each source's share of the
samples and tokens)."""

from __future__ import annotations

import json
import re
from pathlib import Path

import pytest

from tests.conftest import TINY_GPT2, lmctl

#: A reader whose records are known: ``count`` lines of ``words`` times "the" per shard.
READER = '''
def lines(words=(2,), count=4):
    """``words`` is a shard list: one shard per length."""
    for length in words:
        for _ in range(count):
            yield {"text": " ".join(["the"] * length)}


def versioned(words=(2,), count=4):
    yield from lines(words, count)


versioned.version = "1"
'''


@pytest.fixture
def work(tmp_path: Path) -> Path:
    (tmp_path / "readers.py").write_text(READER, encoding="utf-8")
    # Lines of k single-token words: k + 2 tokens each with [CLS] and [SEP].
    (tmp_path / "a.txt").write_text(
        "\n".join(" ".join(["the"] * k) for k in range(1, 7)) + "\n", encoding="utf-8"
    )
    (tmp_path / "b.txt").write_text("the\nthe the\n", encoding="utf-8")
    return tmp_path


def test_inspect_reports_each_source_share(work: Path, wordpiece_tokenizer: Path) -> None:
    proc = lmctl(
        "data", "inspect", "mlm", "--line-by-line", "--tokenizer-name", wordpiece_tokenizer,
        "--train-source", "a.txt", "--train-source", "table=readers.py:lines",
        "--mix", "3,1", "--validation-source", "a.txt", "--validation-source", "b.txt",
        "--max-seq-length", "32", "--json", cwd=work,
    )  # fmt: skip
    assert proc.returncode == 0, proc.stderr
    splits = json.loads(proc.stdout)["splits"]

    train = splits["train"]
    a_tokens = sum(k + 2 for k in range(1, 7))  # 6 lines, 33 tokens
    table_tokens = 4 * (2 + 2)  # 4 records of 4 tokens
    assert (train["samples"], train["tokens"]) == (6 + 4, a_tokens + table_tokens)
    a, table = train["sources"]["a"], train["sources"]["table"]
    assert (a["samples"], a["tokens"], table["samples"], table["tokens"]) == (6, 33, 4, 16)
    # Drawn by weight: 3/4 of the samples are a's, with 5.5 tokens each against 4.
    assert (a["sample_share"], table["sample_share"]) == (0.75, 0.25)
    assert a["token_share"] == pytest.approx(0.75 * 5.5 / (0.75 * 5.5 + 0.25 * 4), abs=1e-4)
    assert a["by"] == "weight"

    validation = splits["validation"]["sources"]
    assert validation["a"]["sample_share"] == pytest.approx(6 / 8, abs=1e-4)
    assert validation["b"]["token_share"] == pytest.approx(7 / (33 + 7), abs=1e-4)

    plain = lmctl(
        "data", "inspect", "mlm", "--line-by-line", "--tokenizer-name", wordpiece_tokenizer,
        "--train-source", "a.txt", "--train-source", "table=readers.py:lines",
        "--mix", "3,1", cwd=work,
    )  # fmt: skip
    assert plain.returncode == 0, plain.stderr
    assert "source table: 4 samples, 16 tokens" in plain.stdout
    assert "25.00% of the samples" in plain.stdout


def test_inspect_a_reader_error_exits_3(work: Path, wordpiece_tokenizer: Path) -> None:
    (work / "broken.py").write_text("def rows():\n    raise OSError('table gone')\n    yield\n")
    proc = lmctl(
        "data", "inspect", "mlm", "--tokenizer-name", wordpiece_tokenizer,
        "--train-source", "broken.py:rows", cwd=work,
    )  # fmt: skip
    assert proc.returncode == 3, proc.stderr
    assert "Traceback" not in proc.stderr
    assert "the reader rows raised on shard its one call: OSError: table gone" in proc.stderr


@pytest.mark.slow
@pytest.mark.e2e
def test_prepare_a_mixture_then_train_reuses_it(work: Path, bpe_tokenizer: Path) -> None:
    (work / "valid.txt").write_text("the sea and the ships\n" * 20, encoding="utf-8")
    sources = [
        "--train-source", "a.txt", "--train-source", "table=readers.py:versioned",
        "--mix", "0.7,0.3", "--validation-source", "valid.txt",
    ]  # fmt: skip
    common = ["--tokenizer-name", bpe_tokenizer, *sources, "--block-size", "8"]
    proc = lmctl("prepare", "clm", *common, cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert "train: prepared data cached in" in proc.stderr
    assert "validation_valid: prepared data cached in" in proc.stderr

    proc = lmctl("train", "clm", *TINY_GPT2, *common, "--max-steps", "1", cwd=work)
    assert proc.returncode == 0, proc.stderr
    (reused,) = [line for line in proc.stderr.splitlines() if "reusing prepared data" in line]
    assert re.search(r": train \d+ rows, validation", reused), reused
    assert "preparing data" not in proc.stderr

    # A reader without a version is read (and prepared) again each run, and the log says so.
    unversioned = [str(arg).replace("versioned", "lines") for arg in common]
    proc = lmctl("prepare", "clm", *unversioned, cwd=work)
    assert proc.returncode == 0, proc.stderr
    assert "source table: the reader declares no version" in proc.stderr
    assert "train: prepared data cached in" not in proc.stderr
