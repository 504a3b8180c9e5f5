"""``--overwrite-output-dir`` removes only what an earlier lmctl run wrote, never a user file."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from tests.conftest import assert_clean_failure, lmctl, tiny_clm_args

pytestmark = pytest.mark.e2e


def checksums(root: Path) -> dict[str, str]:
    return {
        str(path.relative_to(root)): hashlib.sha256(path.read_bytes()).hexdigest()
        for path in sorted(root.rglob("*"))
        if path.is_file()
    }


def tiny_run(
    out: Path, text_files: tuple[Path, Path], tokenizer: Path, *extra: str, cwd: Path
) -> list[str | Path]:
    return tiny_clm_args(
        tokenizer, text_files, "--output-dir", out, *extra, block_size=32, steps=None
    )


def test_a_project_folder_is_never_emptied(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    project = tmp_path / "project"
    (project / ".git" / "objects").mkdir(parents=True)
    (project / ".git" / "HEAD").write_text("ref: refs/heads/main\n")
    (project / ".git" / "objects" / "ab").write_bytes(b"\x00\x01blob")
    (project / "src").mkdir()
    (project / "src" / "main.py").write_text("print('hello')\n")
    (project / "lmctl.yaml").write_text("# my own config\nlearning_rate: 0.001\nmax_steps: 2\n")
    (project / "README.md").write_text("# my project\n")
    before = checksums(project)
    args = tiny_run(
        Path("."),
        text_files,
        bpe_tokenizer,
        "--max-steps",
        "2",
        "--overwrite-output-dir",
        cwd=project,
    )
    proc = lmctl(*args, "--config", "lmctl.yaml", cwd=project)
    assert_clean_failure(proc, 2, "not a run directory that lmctl created", ".git", "src")
    assert checksums(project) == before


@pytest.mark.slow
def test_an_earlier_run_is_replaced_and_other_files_kept(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    out = tmp_path / "run"
    first = lmctl(
        *tiny_run(
            out, text_files, bpe_tokenizer, "--max-steps", "4", "--save-steps", "2", cwd=tmp_path
        ),
        cwd=tmp_path,
    )
    assert first.returncode == 0, first.stderr
    assert (out / "checkpoint-2").is_dir() and (out / "checkpoint-4").is_dir()
    marker = json.loads((out / "lmctl_run.json").read_text())
    assert {"lmctl.yaml", "model.safetensors", "checkpoint-4", "README.md"} <= set(marker["files"])
    (out / "notes.txt").write_text("my notes about this run\n")
    (out / "analysis").mkdir()
    (out / "analysis" / "plot.png").write_bytes(b"\x89PNG fake")
    mine = {
        name: digest
        for name, digest in checksums(out).items()
        if name.startswith(("notes", "analysis"))
    }

    second = lmctl(
        *tiny_run(
            out,
            text_files,
            bpe_tokenizer,
            "--max-steps",
            "3",
            "--save-steps",
            "3",
            "--overwrite-output-dir",
            cwd=tmp_path,
        ),
        cwd=tmp_path,
    )
    assert second.returncode == 0, second.stderr
    assert "kept 2 entries lmctl did not write: analysis, notes.txt" in second.stderr
    after = checksums(out)
    assert {name: after[name] for name in mine} == mine
    assert not (out / "checkpoint-2").exists() and not (out / "checkpoint-4").exists()
    assert (out / "checkpoint-3").is_dir()
    assert json.loads((out / "trainer_state.json").read_text())["global_step"] == 3
    marker = json.loads((out / "lmctl_run.json").read_text())
    assert "notes.txt" not in marker["files"] and "checkpoint-3" in marker["files"]


def test_a_run_without_marker_is_refused(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    """A directory holding lmctl's file names but no run marker is not proven to be a run."""
    out = tmp_path / "looks-like-a-run"
    out.mkdir()
    for name in ("lmctl.yaml", "config.json", "model.safetensors", "metrics.jsonl"):
        (out / name).write_text(f"{name} of someone else\n")
    before = checksums(out)
    proc = lmctl(
        *tiny_run(out, text_files, bpe_tokenizer, "--overwrite-output-dir", cwd=tmp_path),
        cwd=tmp_path,
    )
    assert_clean_failure(proc, 2, "lmctl_run.json", "lmctl.yaml")
    assert checksums(out) == before
