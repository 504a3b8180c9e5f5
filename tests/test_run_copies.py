"""A copied or pushed run targets itself: paths are stored absolute, a run's own config writes
into that run, and a hint never points --overwrite-output-dir at another run."""

from __future__ import annotations

import hashlib
import json
import shlex
import shutil
from pathlib import Path

import pytest
import yaml

from tests.conftest import lmctl, tiny_clm_args

pytestmark = pytest.mark.e2e


def checksums(root: Path) -> dict[str, str]:
    return {
        str(p.relative_to(root)): hashlib.sha256(p.read_bytes()).hexdigest()
        for p in sorted(root.rglob("*"))
        if p.is_file()
    }


def saved_config(run: Path) -> dict[str, object]:
    data: dict[str, object] = yaml.safe_load((run / "lmctl.yaml").read_text())
    return data


def test_a_pushed_copy_never_points_at_the_original(
    tmp_path: Path, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> None:
    work = tmp_path
    args = tiny_clm_args(
        bpe_tokenizer, text_files, "--save-strategy", "no", "-o", "runs/ci", block_size=32, steps=2
    )
    proc = lmctl(*args, cwd=work)
    assert proc.returncode == 0, proc.stderr
    original = work / "runs" / "ci"
    assert saved_config(original)["output_dir"] == str(original)
    copy = work / "copy"
    pushed = lmctl("push", "runs/ci", "--to", copy.as_uri(), cwd=work)
    assert pushed.returncode == 0, pushed.stderr
    before = checksums(original)

    # The published config names its data files and tokenizer by their names only: the copy
    # is used from the folder that holds them.
    for data in text_files:
        shutil.copy(data, work / data.name)
    shutil.copytree(bpe_tokenizer, work / bpe_tokenizer.name)
    shown = lmctl("train", "clm", "--config", "copy/lmctl.yaml", "--dry-run", "--json", cwd=work)
    assert shown.returncode == 0, shown.stderr
    assert json.loads(shown.stdout)["config"]["output_dir"] == str(copy)

    refused = lmctl("resume", "copy", "--max-steps", "100", cwd=work)
    assert refused.returncode == 2, refused.stderr
    hint = refused.stderr.split("start it again with ", 1)[1].split(")", 1)[0].strip()
    assert "--overwrite-output-dir" in hint and "--output-dir copy" in hint, hint
    assert "runs/ci" not in hint
    words = shlex.split(hint)
    assert words[:3] == ["lmctl", "train", "clm"]
    again = lmctl(*words[1:], cwd=work)
    assert again.returncode == 0, again.stderr
    assert checksums(original) == before
    assert saved_config(copy)["output_dir"] == str(copy)
    assert json.loads((copy / "trainer_state.json").read_text())["global_step"] == 2
