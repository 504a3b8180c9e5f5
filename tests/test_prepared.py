"""The prepared-data cache: reused only when data, tokenizer and parameters all match."""

from __future__ import annotations

import json
import os
import time
from pathlib import Path
from typing import Any

import pytest

from lmctl.config.loader import build_config
from lmctl.config.slices import Access, DataSpec, LoopSpec, take
from lmctl.console import Console, OutputOptions
from lmctl.data import prepared
from lmctl.data.load import load_raw
from lmctl.data.prepared import MANIFEST, cache_root
from lmctl.objectives.clm import OBJECTIVE, ClmConfig, ClmOptions
from lmctl.objectives.common import tokenize_and_group
from tests.conftest import corpus_lines


@pytest.fixture
def corpus(tmp_path: Path) -> Path:
    path = tmp_path / "corpus.txt"
    path.write_text("\n".join(corpus_lines()[:800]) + "\n")
    return path


def _prepare(
    corpus: Path, tokenizer_dir: Path, cache: Path, block_size: int = 32, **values: Any
) -> tuple[Any, str]:
    """Run tokenize_and_group as training would; return the datasets and the log."""
    import contextlib
    import io

    from transformers import AutoTokenizer

    config = build_config(
        ClmConfig,
        cli_values={
            "train_file": str(corpus),
            "model_type": "gpt2",
            "tokenizer_name": str(tokenizer_dir),
            "prepared_cache_dir": str(cache),
            **values,
        },
    )
    raw = load_raw(
        take(DataSpec, config),
        take(Access, config),
        do_train=config.do_train,
        need_eval=config.do_eval,
        text_options={"keep_linebreaks": True},
    )
    tokenizer = AutoTokenizer.from_pretrained(tokenizer_dir)
    log = io.StringIO()
    with contextlib.redirect_stderr(log):
        console = Console(OutputOptions(no_progress=True))
        datasets = tokenize_and_group(
            raw,
            tokenizer,
            block_size,
            console,
            data=take(DataSpec, config),
            loop=take(LoopSpec, config),
            text_options=OBJECTIVE.text_options(take(ClmOptions, config)),
        )
    return datasets, log.getvalue()


def _entries(cache: Path) -> list[dict[str, Any]]:
    return [json.loads(path.read_text()) for path in sorted(cache.glob(f"*/{MANIFEST}"))]


def test_identical_run_reuses_the_cache(corpus: Path, bpe_tokenizer: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first, log = _prepare(corpus, bpe_tokenizer, cache)
    assert "preparing data" in log
    assert len(_entries(cache)) == 2  # train and held-out validation
    second, log = _prepare(corpus, bpe_tokenizer, cache)
    assert "reusing prepared data" in log
    assert "preparing" not in log
    assert second["train"]["input_ids"] == first["train"]["input_ids"]
    assert len(_entries(cache)) == 2


def test_block_size_change_invalidates(corpus: Path, bpe_tokenizer: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    _prepare(corpus, bpe_tokenizer, cache, block_size=32)
    datasets, log = _prepare(corpus, bpe_tokenizer, cache, block_size=16)
    assert "reusing" not in log
    assert "block_size 32 -> 16: preparing it again" in log
    assert len(datasets["train"][0]["input_ids"]) == 16


def test_tokenizer_change_invalidates(corpus: Path, bpe_tokenizer: Path, tmp_path: Path) -> None:
    from transformers import AutoTokenizer

    cache = tmp_path / "cache"
    _prepare(corpus, bpe_tokenizer, cache)
    changed = tmp_path / "tokenizer-changed"
    tokenizer = AutoTokenizer.from_pretrained(bpe_tokenizer)
    tokenizer.add_tokens(["Shakespeare"])
    tokenizer.save_pretrained(changed)
    _, log = _prepare(corpus, changed, cache)
    assert "reusing" not in log
    assert "the tokenizer changed: preparing it again" in log


def test_data_file_change_invalidates(corpus: Path, bpe_tokenizer: Path, tmp_path: Path) -> None:
    cache = tmp_path / "cache"
    first, _ = _prepare(corpus, bpe_tokenizer, cache)
    old_dirs = {path.parent for path in cache.glob(f"*/{MANIFEST}")}
    with corpus.open("a") as handle:
        handle.write("\n".join(corpus_lines()[800:1200]) + "\n")
    second, log = _prepare(corpus, bpe_tokenizer, cache)
    assert "reusing" not in log
    assert "the data changed" in log
    assert len(second["train"]) > len(first["train"])
    assert not any(path.exists() for path in old_dirs), "caches of a changed file are removed"


def test_same_size_rewrite_invalidates(corpus: Path, bpe_tokenizer: Path, tmp_path: Path) -> None:
    """Size alone is not the identity: a rewrite in place (new mtime) is a change too."""
    cache = tmp_path / "cache"
    _prepare(corpus, bpe_tokenizer, cache)
    text = corpus.read_text()
    corpus.write_text(text.replace("the", "The"))
    stat = corpus.stat()
    os.utime(corpus, ns=(stat.st_atime_ns, stat.st_mtime_ns + 1_000_000_000))
    _, log = _prepare(corpus, bpe_tokenizer, cache)
    assert "the data changed" in log


def test_other_settings_that_change_tokens_invalidate(
    corpus: Path, bpe_tokenizer: Path, tmp_path: Path
) -> None:
    cache = tmp_path / "cache"
    _prepare(corpus, bpe_tokenizer, cache)
    _, log = _prepare(corpus, bpe_tokenizer, cache, validation_split_percentage=10)
    assert "held out" in log and "reusing" not in log
    # A sample limit is applied to the cached samples (as upstream selects blocks after
    # grouping): it does not change what is cached.
    _, log = _prepare(corpus, bpe_tokenizer, cache, max_train_samples=100)
    assert "reusing" in log and "preparing" not in log


def test_overwrite_cache_rebuilds(
    corpus: Path, bpe_tokenizer: Path, tmp_path: Path, monkeypatch: pytest.MonkeyPatch
) -> None:
    cache = tmp_path / "cache"
    _prepare(corpus, bpe_tokenizer, cache)
    # As if this were a later run: the cache predates the process.
    monkeypatch.setattr(prepared, "_process_started", time.time)
    _, log = _prepare(corpus, bpe_tokenizer, cache, overwrite_cache=True)
    assert "reusing" not in log
    assert "prepared data cached in" in log


def test_overwrite_cache_keeps_what_another_rank_just_built(
    corpus: Path, bpe_tokenizer: Path, tmp_path: Path
) -> None:
    """Ranks of one run all pass --overwrite-cache; only the first one rebuilds."""
    cache = tmp_path / "cache"
    _prepare(corpus, bpe_tokenizer, cache, overwrite_cache=True)
    _, log = _prepare(corpus, bpe_tokenizer, cache, overwrite_cache=True)
    assert "reusing prepared data" in log


def test_cache_root_default_and_environment(monkeypatch: pytest.MonkeyPatch) -> None:
    config = ClmConfig.model_construct(prepared_cache_dir=None)
    monkeypatch.setenv("LMCTL_CACHE", "/somewhere")
    assert cache_root(take(DataSpec, config)) == Path("/somewhere/prepared")
    monkeypatch.delenv("LMCTL_CACHE")
    monkeypatch.setenv("XDG_CACHE_HOME", "/xdg")
    assert cache_root(take(DataSpec, config)) == Path("/xdg/lmctl/prepared")
    explicit = ClmConfig.model_construct(prepared_cache_dir="~/mine")
    assert cache_root(take(DataSpec, explicit)) == Path("~/mine").expanduser()


def test_remote_file_identity_follows_the_object() -> None:
    import fsspec

    from lmctl.data.prepared import file_identity

    memory = fsspec.filesystem("memory")
    memory.pipe("/lmctl-identity/a.txt", b"one\n")
    before = file_identity("memory://lmctl-identity/a.txt")
    memory.pipe("/lmctl-identity/a.txt", b"one\ntwo\n")
    after = file_identity("memory://lmctl-identity/a.txt")
    assert before["size"] == 4 and after["size"] == 8
    [matched] = file_identity("memory://lmctl-identity/*.txt")["files"]
    assert matched["size"] == 8


@pytest.mark.e2e
@pytest.mark.slow  # 8.5 MB tokenized three times
@pytest.mark.parametrize(
    ("objective", "options"),
    [("mlm", ["--line-by-line", "--max-seq-length", "32"]), ("clm", ["--block-size", "32"])],
)
def test_large_text_is_tokenized_in_processes_with_the_same_result(
    tmp_path: Path, wordpiece_tokenizer: Path, objective: str, options: list[str]
) -> None:
    """Without --preprocessing-num-workers, 'lmctl prepare' tokenizes 8.5 MB of text in one
    process per core (two at most: one per 4 MB), says so, and writes exactly the samples
    one process writes."""
    import datasets

    from tests.conftest import lmctl

    lines, size, number = corpus_lines(), 0, 0
    with (tmp_path / "big.txt").open("w", encoding="utf-8") as out:
        while size < 8.5 * 2**20:
            text = f"{number} {lines[number % len(lines)]}\n"
            out.write(text)
            size, number = size + len(text.encode()), number + 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count()
    expected = min(cores or 1, 2)

    def prepare(name: str, *extra: str) -> tuple[Any, str]:
        cache = tmp_path / name
        proc = lmctl(
            "prepare", objective, "--tokenizer-name", wordpiece_tokenizer, "--train-file",
            tmp_path / "big.txt", "--no-eval", *options, *extra,
            cwd=tmp_path, env={"LMCTL_CACHE": str(cache)},
        )  # fmt: skip
        assert proc.returncode == 0, proc.stderr
        (data,) = cache.glob("prepared/*/*.arrow")
        return datasets.Dataset.from_file(str(data)), proc.stderr

    chosen, log = prepare("default")
    single, single_log = prepare("single", "--preprocessing-num-workers", "1")
    said = f"train: tokenizing in {expected} processes"
    assert (said in log) == (expected > 1), log
    assert "tokenizing in" not in single_log
    assert len(chosen) > 60_000 if objective == "mlm" else len(chosen) > 50_000
    assert chosen.features == single.features
    assert chosen.data.table.equals(single.data.table)


def test_one_cache_root(
    monkeypatch: pytest.MonkeyPatch, capsys: pytest.CaptureFixture[str], tmp_path: Path
) -> None:
    """LMCTL_CACHE moves prepared data, staged remote runs and fetched files together; the
    older LMCTL_CACHE_DIR is still read, with one warning line, and yields to LMCTL_CACHE."""
    from lmctl.storage import paths
    from lmctl.storage.locations import run_staging_dir

    config = ClmConfig.model_construct(prepared_cache_dir=None)
    monkeypatch.delenv("LMCTL_CACHE_DIR", raising=False)
    monkeypatch.setenv("LMCTL_CACHE", str(tmp_path / "big"))
    assert cache_root(take(DataSpec, config)) == tmp_path / "big" / "prepared"
    assert run_staging_dir("s3://bucket/run", 0, 1).parent == tmp_path / "big" / "runs"
    assert paths.cache_root() == tmp_path / "big"

    monkeypatch.delenv("LMCTL_CACHE")
    monkeypatch.setenv("LMCTL_CACHE_DIR", str(tmp_path / "old"))
    paths._say_renamed.cache_clear()
    assert cache_root(take(DataSpec, config)) == tmp_path / "old" / "prepared"
    assert run_staging_dir("s3://bucket/run", 0, 1).parent == tmp_path / "old" / "runs"
    warnings = [line for line in capsys.readouterr().err.splitlines() if "LMCTL_CACHE_DIR" in line]
    assert len(warnings) == 1
    assert f"set LMCTL_CACHE={tmp_path / 'old'} instead" in warnings[0]

    monkeypatch.setenv("LMCTL_CACHE", str(tmp_path / "big"))
    assert cache_root(take(DataSpec, config)) == tmp_path / "big" / "prepared"
