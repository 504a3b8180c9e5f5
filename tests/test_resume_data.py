"""A resume on changed data: the training files' identity is recorded when a run starts, and
a resume warns about each file changed since (or with --strict-resume refuses, exit 2)."""

from __future__ import annotations

import json
import os
import shutil
from pathlib import Path

import pytest

from lmctl.config.slices import DataSpec, take
from lmctl.console import Console, OutputOptions
from lmctl.errors import ConfigError
from lmctl.objectives.clm import ClmConfig
from lmctl.run import datafiles
from tests.conftest import assert_clean_failure, lmctl, tiny_clm_args


def _data(train: str) -> DataSpec:
    return take(DataSpec, ClmConfig.model_construct(train_file=train))


def test_changed_training_files_are_named(
    tmp_path: Path, capsys: pytest.CaptureFixture[str]
) -> None:
    """Unit: a grown file, a touched one and a new match of the pattern are each named with
    what changed; an unchanged set says nothing; --strict-resume refuses."""
    folder = tmp_path / "data"
    folder.mkdir()
    for name in ("a.txt", "b.txt", "c.txt"):
        (folder / name).write_text(f"{name} text\n")
    run = tmp_path / "run"
    run.mkdir()
    data = _data(str(folder / "*.txt"))
    datafiles.record_train_files(run, data)
    checkpoint = run / "checkpoint-2"
    console = Console(OutputOptions(no_progress=True))

    datafiles.check_train_files(checkpoint, data, strict=True, console=console)
    assert capsys.readouterr().err == ""

    (folder / "a.txt").write_text("a.txt text, and more\n")
    stat = (folder / "b.txt").stat()
    os.utime(folder / "b.txt", ns=(stat.st_atime_ns, stat.st_mtime_ns + 5_000_000_000))
    (folder / "d.txt").write_text("new\n")
    (folder / "c.txt").unlink()
    datafiles.check_train_files(checkpoint, data, strict=False, console=console)
    warning = capsys.readouterr().err.strip()
    assert warning.count("\n") == 0 and " WARN " in warning
    assert f"{folder / 'a.txt'} (size 11 -> 21 bytes)" in warning
    assert f"{folder / 'b.txt'} (modified at " in warning
    assert f"{folder / 'c.txt'} (gone)" in warning
    assert f"{folder / 'd.txt'} (new)" in warning
    assert "does not see the examples the uninterrupted run would have" in warning

    with pytest.raises(ConfigError) as refused:
        datafiles.check_train_files(checkpoint, data, strict=True, console=console)
    assert refused.value.message.startswith("--strict-resume: training files changed")

    # The record is the run's start: a later start (a resume) does not replace it.
    datafiles.record_train_files(run, data)
    recorded = json.loads((run / datafiles.DATA_FILES).read_text())["train_file"]
    assert {Path(item["path"]).name for item in recorded} == {"a.txt", "b.txt", "c.txt"}


def test_remote_training_files_are_not_recorded(tmp_path: Path) -> None:
    datafiles.record_train_files(tmp_path, _data("s3://bucket/train.txt"))
    assert not (tmp_path / datafiles.DATA_FILES).exists()


@pytest.mark.e2e
@pytest.mark.faults
def test_resume_on_changed_data_warns_and_strict_refuses(
    tmp_path: Path, bpe_tokenizer: Path, text_files: tuple[Path, Path]
) -> None:
    train = tmp_path / "train.txt"
    shutil.copy(text_files[0], train)
    run = tmp_path / "run"
    args = tiny_clm_args(
        bpe_tokenizer, (train, None), "--save-steps", "1", "--output-dir", run, steps=2
    )
    first = lmctl(*args, "--max-train-samples", "64", "--no-eval")
    assert first.returncode == 0, first.stderr
    assert (run / datafiles.DATA_FILES).is_file()
    with train.open("a", encoding="utf-8") as handle:
        handle.write("a line added after the run started\n")

    kept = sorted(path.name for path in run.iterdir())
    refused = lmctl("resume", run, "--max-steps", "3", "--strict-resume")
    assert_clean_failure(refused, 2, "--strict-resume", str(train.resolve()))
    assert sorted(path.name for path in run.iterdir()) == kept

    resumed = lmctl("resume", run, "--max-steps", "3")
    assert resumed.returncode == 0, resumed.stderr
    warnings = [line for line in resumed.stderr.splitlines() if " WARN " in line]
    assert len(warnings) == 1, resumed.stderr
    assert str(train.resolve()) in warnings[0] and "uninterrupted run" in warnings[0]
