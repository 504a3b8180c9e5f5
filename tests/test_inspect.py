"""``lmctl data inspect``: lengths, cuts, padding, unknown tokens and swag labels of a sample,
checked exactly against files built here with known token counts."""

from __future__ import annotations

import csv
import importlib.util
import json
from pathlib import Path

import pytest

from lmctl.inspection import measure
from tests.conftest import assert_clean_failure, lmctl, without_packages


def _single_token_words(tokenizer_path: Path, words: list[str]) -> None:
    from transformers import AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tokenizer_path))
    for word in words:
        assert len(tokenizer(word, add_special_tokens=False)["input_ids"]) == 1, word


def _inspect_json(*args: str | Path) -> dict[str, object]:
    proc = lmctl("data", "inspect", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    return json.loads(proc.stdout)


def test_percentiles_histogram_and_cut() -> None:
    lengths = [3, 4, 5, 6, 7, 8, 9, 10, 11, 12]
    described = measure.distribution(lengths)
    assert (described["p50"], described["p90"], described["p99"], described["max"]) == (
        7,
        11,
        12,
        12,
    )
    bins = measure.histogram(lengths, bins=4)
    assert [item["count"] for item in bins] == [1, 4, 4, 1]  # 0-3, 4-7, 8-11, 12
    assert sum(item["count"] for item in measure.histogram(lengths)) == len(lengths)
    cut = measure.cut(lengths, 8)
    assert (cut["samples_cut"], cut["tokens_cut"]) == (4, 10)
    grouped = measure.blocks(lengths, 8)
    assert (grouped["blocks"], grouped["tokens_cut"]) == (75 // 8, 75 % 8)


def test_padding_in_order_and_grouped() -> None:
    lengths = [1, 10] * 50
    padding = measure.padding(lengths, 2, seed=0)
    assert padding["padding_share"] == pytest.approx(9 * 50 / (20 * 50))
    # The sampler's mega-batches (12 batches for 100 samples) are sorted: few mixed pairs.
    assert padding["padding_share_grouped"] < 0.1


def test_text_head_reads_a_bounded_start(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    from lmctl.inspection import sample

    corpus = tmp_path / "c.txt"
    corpus.write_text("".join(f"line {i:04d}\n" for i in range(1000)), encoding="utf-8")
    lines, complete, estimate = sample.read_text_head(str(corpus), 100, "--train-file")
    assert lines[:2] == ["line 0000", "line 0001"] and len(lines) == 100
    assert (complete, estimate) == (False, 1000)
    lines, complete, estimate = sample.read_text_head(str(corpus), 5000, "--train-file")
    assert (len(lines), complete, estimate) == (1000, True, 1000)
    monkeypatch.setattr(sample, "MAX_HEAD_BYTES", 25)  # 2 lines of 10 bytes and 5 bytes
    lines, complete, _ = sample.read_text_head(str(corpus), 100, "--train-file")
    assert lines == ["line 0000", "line 0001", "line "] and not complete


def test_blank_and_duplicate_lines() -> None:
    counts = measure.line_counts(["a", "", "b", "a", "  ", "a"])
    assert counts == {"blank_lines": 2, "duplicate_lines": 2}


@pytest.mark.e2e
def test_mlm_line_by_line_lengths_and_cut(tmp_path: Path, wordpiece_tokenizer: Path) -> None:
    _single_token_words(wordpiece_tokenizer, ["the"])
    # k words of one token each: k + 2 tokens with [CLS] and [SEP]; one blank line.
    lines = [" ".join(["the"] * k) for k in range(1, 11)] + [""]
    train = tmp_path / "train.txt"
    train.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = _inspect_json(
        "mlm",
        "--train-file", train,
        "--tokenizer-name", wordpiece_tokenizer,
        "--line-by-line",
        "--max-seq-length", "8",
        "--per-device-train-batch-size", "2",
    )  # fmt: skip
    split = result["splits"]["train"]  # type: ignore[index]
    lengths = list(range(3, 13))
    assert split["samples"] == 10
    assert split["tokens"] == sum(lengths)
    assert (split["p50"], split["p90"], split["max"]) == (7, 11, 12)
    assert split["blank_lines"] == 1
    assert split["complete"] is True
    cut = split["cut"]
    assert cut["limit"] == 8
    assert cut["samples_cut"] == 4
    assert cut["samples_cut_share"] == pytest.approx(0.4)
    assert cut["tokens_cut"] == 1 + 2 + 3 + 4
    assert cut["tokens_cut_share"] == pytest.approx(10 / sum(lengths), abs=1e-6)
    # In order, pairs (3,4) (5,6) (7,8) (8,8) (8,8) after the cut at 8: 3 padded of 68.
    assert split["padding"]["padding_share"] == pytest.approx(3 / 68, abs=1e-6)
    assert result["warnings"] == []


@pytest.mark.e2e
def test_unknown_share_and_pieces(tmp_path: Path, wordpiece_tokenizer: Path) -> None:
    _single_token_words(wordpiece_tokenizer, ["the"])
    lines = [f"the ☃ the {'the ' * i}" for i in range(10)] + ["the th☃e"] * 2
    train = tmp_path / "train.txt"
    train.write_text("\n".join(lines) + "\n", encoding="utf-8")
    result = _inspect_json(
        "mlm", "--train-file", train, "--tokenizer-name", wordpiece_tokenizer, "--line-by-line"
    )
    split = result["splits"]["train"]  # type: ignore[index]
    text_tokens = sum(3 + i for i in range(10)) + 2 * 2
    unknown = split["unknown"]
    assert unknown["unk_token"] == "[UNK]"
    assert unknown["unknown_tokens"] == 12
    assert unknown["unknown_share"] == pytest.approx(12 / text_tokens, abs=1e-6)
    assert unknown["top_unknown"] == [{"text": "☃", "count": 10}, {"text": "th☃e", "count": 2}]
    assert split["duplicate_lines"] == 1
    assert any("unknown" in w and "--tokenizer-name" in w for w in result["warnings"])


@pytest.mark.e2e
def test_swag_label_balance(tmp_path: Path, wordpiece_tokenizer: Path) -> None:
    rows = [
        {"sent1": "the car is red .", "ending0": "red", "ending1": "blue", "label": 0},
        {"sent1": "the car is blue .", "ending0": "red", "ending1": "blue", "label": 1},
        {"sent1": "the ball is red .", "ending0": "red", "ending1": "blue", "label": 0},
        {"sent1": "the boat is red .", "ending0": "red", "ending1": "blue", "label": 0},
        {"sent1": "the door is red .", "ending0": "red", "ending1": "blue", "label": 0},
    ]
    train = tmp_path / "train.csv"
    with open(train, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=list(rows[0]))
        writer.writeheader()
        writer.writerows(rows)
    common = ["swag", "--train-file", train, "--tokenizer-name", wordpiece_tokenizer]
    common += ["--ending-columns", "ending0,ending1,ending2"]
    proc = lmctl("data", "inspect", *common)
    assert_clean_failure(proc, 3, "ending2")
    result = _inspect_json(*common[:-1], "ending0,ending1")
    split = result["splits"]["train"]  # type: ignore[index]
    assert split["endings"] == 2
    assert split["labels"] == {"0": 4, "1": 1}
    assert split["samples"] == 5
    assert result["warnings"] == []
    three = tmp_path / "three.csv"
    with open(three, "w", newline="", encoding="utf-8") as handle:
        writer = csv.DictWriter(handle, fieldnames=[*rows[0], "ending2"])
        writer.writeheader()
        writer.writerows({**row, "ending2": "green"} for row in rows)
    result = _inspect_json("swag", "--train-file", three, *common[3:-1], "ending0,ending1,ending2")
    split = result["splits"]["train"]  # type: ignore[index]
    assert split["labels"] == {"0": 4, "1": 1, "2": 0}
    assert split["missing_labels"] == [2]
    assert any("label 2 never appears" in w for w in result["warnings"])


@pytest.mark.e2e
def test_json_is_one_object_and_plain_output(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    train, valid = text_files
    args = ["clm", "--train-file", train, "--validation-file", valid]
    args += ["--tokenizer-name", bpe_tokenizer, "--block-size", "64", "--sample", "100"]
    proc = lmctl("data", "inspect", *args, "--json")
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert isinstance(result, dict) and set(result["splits"]) == {"train", "validation"}
    train_split = result["splits"]["train"]
    assert train_split["lines_read"] == 100
    assert train_split["read"].startswith("sampled 100 of ~")
    assert train_split["cut"]["grouped"] is True
    assert train_split["cut"]["blocks"] == train_split["tokens"] // 64
    plain = lmctl("data", "inspect", *args)
    assert plain.returncode == 0, plain.stderr
    assert "texts are concatenated and split into" in plain.stdout
    assert "sampled 100 of ~" in plain.stdout
    assert "p50" in plain.stdout and "histogram" in plain.stdout


@pytest.mark.e2e
@pytest.mark.skipif(
    importlib.util.find_spec("matplotlib") is None, reason="matplotlib (the plot extra) is absent"
)
def test_plot_writes_png(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    plot = tmp_path / "lengths.png"
    args = ["clm", "--train-file", text_files[0], "--tokenizer-name", bpe_tokenizer]
    result = _inspect_json(*args, "--sample", "200", "--plot", plot)
    assert result["plot"] == str(plot.resolve())
    data = plot.read_bytes()
    assert data.startswith(b"\x89PNG\r\n\x1a\n")
    assert b"Matplotlib" in data  # the Software text chunk that matplotlib writes


@pytest.mark.e2e
def test_errors_are_clean(tmp_path: Path, bpe_tokenizer: Path) -> None:
    missing = lmctl(
        "data", "inspect", "clm", "--train-file", tmp_path / "nope.txt",
        "--tokenizer-name", bpe_tokenizer,
    )  # fmt: skip
    assert missing.returncode in (2, 3)
    assert "Traceback" not in missing.stderr
    train = tmp_path / "a.txt"
    train.write_text("hello\n", encoding="utf-8")
    no_tokenizer = lmctl("data", "inspect", "clm", "--train-file", train)
    assert_clean_failure(no_tokenizer, 2, "needs a tokenizer")


@pytest.mark.e2e
def test_plot_without_matplotlib_names_the_extra(tmp_path: Path, bpe_tokenizer: Path) -> None:
    train = tmp_path / "a.txt"
    train.write_text("hello there\n", encoding="utf-8")
    proc = lmctl(
        "data", "inspect", "clm", "--train-file", train, "--tokenizer-name", bpe_tokenizer,
        "--plot", tmp_path / "h.png",
        env=without_packages(tmp_path, "matplotlib"),
    )  # fmt: skip
    assert_clean_failure(proc, 2, "matplotlib", "pip install 'lmctl-train[plot]'")
    assert not (tmp_path / "h.png").exists()


@pytest.mark.e2e
def test_warnings_name_the_length_flag(tmp_path: Path, wordpiece_tokenizer: Path) -> None:
    _single_token_words(wordpiece_tokenizer, ["the"])
    lines = [" ".join(["the"] * k) for k in range(1, 11)]
    train = tmp_path / "train.txt"
    train.write_text("\n".join(lines) + "\n", encoding="utf-8")
    common = ["--train-file", train, "--tokenizer-name", wordpiece_tokenizer]
    # 3..12 tokens per line; cut at 4: 36 of 75 tokens (48%), no warning.
    result = _inspect_json("mlm", *common, "--line-by-line", "--max-seq-length", "4")
    assert result["warnings"] == []
    # Cut at 3: 0 + 1 + ... + 9 = 45 of 75 tokens (60%).
    result = _inspect_json("mlm", *common, "--line-by-line", "--max-seq-length", "3")
    assert result["splits"]["train"]["cut"]["tokens_cut"] == 45  # type: ignore[index]
    assert any("--max-seq-length 3" in w and "raise" in w for w in result["warnings"])
    # Grouped into blocks of 64: one block, 11 of 75 tokens dropped; of 100: no block.
    result = _inspect_json("mlm", *common, "--max-seq-length", "64")
    assert result["splits"]["train"]["cut"]["blocks"] == 1  # type: ignore[index]
    assert result["warnings"] == []
    result = _inspect_json("clm", *common, "--block-size", "100")
    assert result["splits"]["train"]["cut"]["blocks"] == 0  # type: ignore[index]
    assert any("lower --block-size" in w for w in result["warnings"])
    proc = lmctl(
        "data", "inspect", "clm", "--dataset-name", "no-such/dataset", "--tokenizer-name",
        wordpiece_tokenizer, env={"HF_HUB_OFFLINE": "1"},
    )  # fmt: skip
    assert_clean_failure(proc, 6, "--dataset-name no-such/dataset")
