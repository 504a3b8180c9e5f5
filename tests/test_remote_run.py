"""Run directories on object storage (``--output-dir s3://...``, ``file://...``)."""

from __future__ import annotations

from pathlib import Path

import pytest

from tests.conftest import assert_clean_failure, lmctl, tiny_clm_args

pytestmark = pytest.mark.e2e


@pytest.mark.parametrize(
    "url",
    ["s3://models/run", "gs://models/run", "file:///tmp/lmctl-nowhere/run", "hf://user/run"],
    ids=["s3", "gs", "file", "hf"],
)
def test_unsupported_output_url_is_refused(
    tmp_path: Path, bpe_tokenizer: Path, text_files: tuple[Path, Path], url: str
) -> None:
    proc = lmctl(*tiny_clm_args(bpe_tokenizer, text_files, "-o", url, steps=1), cwd=tmp_path)
    assert_clean_failure(proc, 2, f"--output-dir {url}")
    assert list(tmp_path.iterdir()) == []
