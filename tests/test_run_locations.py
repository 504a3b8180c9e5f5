"""A storage URL given to a folder option is never created as a local folder named after it
(``s3://bucket/run`` as ``./s3:/bucket/run``): it is refused before any work, naming the option
and what it takes."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import assert_clean_failure, lmctl, tiny_clm_args

pytestmark = pytest.mark.e2e


def _train(tokenizer: Path, texts: tuple[Path, Path], *extra: str | Path) -> list[str | Path]:
    return tiny_clm_args(tokenizer, (texts[0], None), *extra, block_size=None, steps=1)


def _no_url_folder(cwd: Path) -> None:
    made = sorted(p.name for p in cwd.iterdir())
    assert not any(name.endswith(":") for name in made), made


@pytest.mark.parametrize(
    ("flags", "needle"),
    [
        (("--resume-from-checkpoint", "s3://models/run/checkpoint-2"), "--resume-from-checkpoint"),
        (("--prepared-cache-dir", "s3://models/prepared"), "--prepared-cache-dir"),
        (("--prepared-cache-dir", "gs://models/prepared"), "gs://"),
        (("--cache-dir", "hf://user/cache"), "--cache-dir"),
    ],
    ids=["resume-s3", "prepared-s3", "prepared-gs", "cache-hf"],
)
def test_local_folder_options_refuse_urls(
    tmp_path: Path,
    bpe_tokenizer: Path,
    text_files: tuple[Path, Path],
    flags: tuple[str, str],
    needle: str,
) -> None:
    args = _train(bpe_tokenizer, text_files, "--output-dir", tmp_path / "run", *flags)
    proc = lmctl(*args, cwd=tmp_path)
    assert_clean_failure(proc, 2, needle, "local directory")
    assert not (tmp_path / "run").exists()
    _no_url_folder(tmp_path)


def test_logging_dir_url_is_refused(
    tmp_path: Path, bpe_tokenizer: Path, text_files: tuple[Path, Path]
) -> None:
    config = tmp_path / "args.yaml"
    config.write_text("training_args:\n  logging_dir: s3://models/logs\n")
    args = _train(bpe_tokenizer, text_files, "--output-dir", tmp_path / "run", "--config", config)
    proc = lmctl(*args, cwd=tmp_path)
    assert_clean_failure(proc, 2, "training_args.logging_dir s3://models/logs")
    assert not (tmp_path / "run").exists()
    _no_url_folder(tmp_path)


def test_file_url_names_the_local_folder(
    tmp_path: Path, bpe_tokenizer: Path, text_files: tuple[Path, Path]
) -> None:
    """``file:///abs`` is that local folder, for the options that take a local folder."""
    cache = tmp_path / "prepared"
    args = _train(
        bpe_tokenizer,
        text_files,
        "--output-dir",
        tmp_path / "run",
        "--prepared-cache-dir",
        f"file://{cache}",
    )
    proc = lmctl(*args, cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert cache.is_dir() and any(cache.iterdir())
    _no_url_folder(tmp_path)


def test_runs_refuses_an_unsupported_url(tmp_path: Path) -> None:
    proc = lmctl("runs", "hf://user/runs", cwd=tmp_path)
    assert_clean_failure(proc, 2, "DIR hf://user/runs", "Hub cannot hold a run directory")
    _no_url_folder(tmp_path)


def test_runs_reads_a_file_url(tiny_clm_run: Path, tmp_path: Path) -> None:
    proc = lmctl("runs", f"file://{tiny_clm_run.parent}", "--json", cwd=tmp_path)
    assert proc.returncode == 0, proc.stderr
    assert '"finished"' in proc.stdout
