"""``lmctl eval URL``: a model or run published to an object store is evaluated through the
same local cache that ``train`` reads remote models from, with the same numbers as the local
copy. ``lmctl resume`` needs the run on local disk and says so."""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import pytest

from tests.conftest import S3Store, assert_clean_failure, lmctl

pytestmark = pytest.mark.e2e

#: Timings differ between two evaluations; every other number must be identical.
TIMINGS = ("eval_runtime", "eval_samples_per_second", "eval_steps_per_second")


def _metrics(proc: Any) -> dict[str, Any]:
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    return {key: value for key, value in result["metrics"].items() if key not in TIMINGS}


@pytest.fixture(scope="module")
def local_metrics(tiny_clm_run: Path, tmp_path_factory: pytest.TempPathFactory) -> dict[str, Any]:
    out = tmp_path_factory.mktemp("local-eval") / "metrics.json"
    return _metrics(lmctl("eval", tiny_clm_run, "--json", "--output", out))


@pytest.mark.slow
def test_eval_of_a_run_pushed_to_s3(
    tiny_clm_run: Path,
    s3_store: S3Store,
    local_metrics: dict[str, Any],
    text_files: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    env = {**s3_store.env(), "LMCTL_CACHE": str(tmp_path / "cache")}
    pushed = lmctl("push", tiny_clm_run, "--to", "s3://models/eval/tiny", env=env)
    assert pushed.returncode == 0, pushed.stderr
    before = sorted(p.relative_to(tiny_clm_run) for p in tiny_clm_run.rglob("*"))

    # A pushed run names its data by file name only (no local paths are published): the
    # validation file is the user's to give.
    unnamed = lmctl("eval", "s3://models/eval/tiny", "--json", env=env)
    assert_clean_failure(unnamed, 2, "published without the local paths", "--validation-file")
    _, valid = text_files
    data = ("--validation-file", str(valid))
    proc = lmctl("eval", "s3://models/eval/tiny", *data, "--json", env=env)
    assert _metrics(proc) == local_metrics
    result = json.loads(proc.stdout)
    assert result["kind"] == "run"
    assert result["results_file"] is None  # nothing written into the cache or the bucket
    assert "give --output FILE" in proc.stderr
    # Read-only credentials are enough, and a second evaluation reads from the cache.
    again = lmctl(
        "eval",
        "s3://models/eval/tiny/",
        *data,
        "--json",
        env={**env, **s3_store.env(s3_store.reader)},
    )
    assert _metrics(again) == local_metrics
    assert sorted(p.relative_to(tiny_clm_run) for p in tiny_clm_run.rglob("*")) == before

    out = tmp_path / "remote.json"
    written = lmctl("eval", "s3://models/eval/tiny", *data, "--output", out, env=env)
    assert written.returncode == 0, written.stderr
    saved = {k: v for k, v in json.loads(out.read_text()).items() if k not in TIMINGS}
    assert saved == local_metrics


@pytest.mark.slow
def test_eval_of_a_model_directory_on_s3_with_data_on_s3(
    tiny_clm_run: Path,
    s3_store: S3Store,
    text_files: tuple[Path, Path],
    tmp_path: Path,
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "tokenizer_config.json"):
        (model / name).write_bytes((tiny_clm_run / name).read_bytes())
    env = {**s3_store.env(), "LMCTL_CACHE": str(tmp_path / "cache")}
    assert lmctl("push", model, "--to", "s3://models/eval/bare", env=env).returncode == 0
    _, valid = text_files
    s3_store.client().upload_file(str(valid), s3_store.bucket, "eval/valid.txt")
    common = ("--block-size", "64", "--json")
    local = lmctl("eval", model, "--validation-file", valid, *common)
    remote = lmctl(
        "eval",
        "s3://models/eval/bare",
        "--validation-file",
        "s3://models/eval/valid.txt",
        *common,
        env=env,
    )
    assert _metrics(remote) == _metrics(local)
    assert json.loads(remote.stdout)["objective"] == "clm"  # inferred from config.json


def test_eval_of_a_file_url(
    tiny_clm_run: Path, local_metrics: dict[str, Any], text_files: tuple[Path, Path], tmp_path: Path
) -> None:
    dest = tmp_path / "published"
    assert lmctl("push", tiny_clm_run, "--to", f"file://{dest}").returncode == 0
    published = (dest / "lmctl.yaml").read_text()
    assert str(text_files[1]) not in published and "valid.txt" in published
    data = ("--validation-file", text_files[1])
    assert _metrics(lmctl("eval", f"file://{dest}", *data, "--json")) == local_metrics


def test_eval_of_a_missing_remote_model(s3_store: S3Store, tmp_path: Path) -> None:
    env = {**s3_store.env(), "LMCTL_CACHE": str(tmp_path / "cache")}
    proc = lmctl("eval", "s3://models/eval/nothing-here", env=env)
    assert_clean_failure(proc, 2, "s3://models/eval/nothing-here", "not found")


def test_resume_of_a_remote_folder_without_a_run_is_refused(
    s3_store: S3Store, tmp_path: Path
) -> None:
    """A remote run directory is resumed from the store (tests/test_remote_run.py); a
    folder there that holds no run lmctl uploaded is refused before any work."""
    env = {**s3_store.env(), "LMCTL_CACHE": str(tmp_path / "cache")}
    proc = lmctl("resume", "s3://models/eval/nothing-here", env=env)
    assert_clean_failure(proc, 2, "s3://models/eval/nothing-here", "not a run directory")
    assert not (tmp_path / "cache").exists()
