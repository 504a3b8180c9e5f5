"""Secrets given through every source never reach a file lmctl writes or anything it prints."""

from __future__ import annotations

import json
import os
import subprocess
import zipfile
from pathlib import Path

import pytest

from tests.conftest import assert_clean_failure, lmctl, tiny_clm_args

SECRETS = {
    "flag": "hf_FlagSecretValue0001",
    "training_args": "hf_TrainingArgsSecret0002",
    "env": "hf_EnvironmentSecret0003",
    "file": "hf_TokenFileSecret0004",
    "nested": "NestedApiKeySecret0005",
}


def leaks(data: bytes) -> list[str]:
    return [name for name, value in SECRETS.items() if value.encode() in data]


def scan_tree(root: Path) -> dict[str, list[str]]:
    """Every file under ``root``, zip members (torch.save pickles) read uncompressed too."""
    found: dict[str, list[str]] = {}
    for path in sorted(root.rglob("*")):
        if not path.is_file():
            continue
        data = path.read_bytes()
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                data += b"".join(archive.read(name) for name in archive.namelist())
        if hit := leaks(data):
            found[str(path.relative_to(root))] = hit
    return found


def scan_output(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return leaks((proc.stdout + proc.stderr).encode())


@pytest.fixture(scope="module")
def secret_run(
    tmp_path_factory: pytest.TempPathFactory, text_files: tuple[Path, Path], bpe_tokenizer: Path
) -> tuple[Path, list[subprocess.CompletedProcess[str]]]:
    work = tmp_path_factory.mktemp("secrets")
    config = work / "cfg.yaml"
    config.write_text(
        f"training_args:\n  hub_token: {SECRETS['training_args']}\n  save_only_model: false\n"
    )
    out = work / "run"
    args = tiny_clm_args(
        bpe_tokenizer,
        text_files,
        "--save-steps",
        "2",
        "--token",
        SECRETS["flag"],
        "--config",
        config,
        "--output-dir",
        out,
        "--json",
        block_size=32,
        steps=2,
    )
    proc = lmctl(*args, cwd=work, env={"HF_TOKEN": SECRETS["env"]})
    assert proc.returncode == 0, proc.stderr
    return out, [proc]


@pytest.mark.e2e
def test_no_secret_in_the_run_directory_or_output(
    secret_run: tuple[Path, list[subprocess.CompletedProcess[str]]],
) -> None:
    out, procs = secret_run
    assert (out / "training_args.bin").is_file()
    assert (out / "checkpoint-2" / "training_args.bin").is_file()
    assert scan_tree(out) == {}
    assert scan_tree(Path(os.environ["LMCTL_CACHE"])) == {}
    for proc in procs:
        assert scan_output(proc) == []
    from lmctl import secrets

    config = (out / "lmctl.yaml").read_text()
    assert "hub_token" not in config.split("\n", 3)[-1]
    assert "# secrets not written: training_args.hub_token" in config
    assert secrets.pickled_secret(out / "training_args.bin") is None
    assert secrets.pickled_secret(out / "checkpoint-2" / "training_args.bin") is None


@pytest.mark.e2e
def test_no_secret_in_eval_resume_and_push(
    secret_run: tuple[Path, list[subprocess.CompletedProcess[str]]], tmp_path: Path
) -> None:
    out, _ = secret_run
    token_file = tmp_path / "credentials" / "token"
    token_file.parent.mkdir()
    token_file.write_text(SECRETS["file"] + "\n")
    env = {"HF_TOKEN": SECRETS["env"]}
    procs = [
        lmctl("eval", out, "--json", "--output", tmp_path / "eval.json", env=env),
        lmctl("resume", out, "--max-steps", "4", "--dry-run", "--json", env=env),
        lmctl(
            "push",
            out,
            "--to",
            "hf://me/tiny",
            "--token-file",
            token_file,
            "--include-checkpoints",
            "--dry-run",
            "--json",
            env=env,
        ),
        lmctl(
            "push", out, "--to", (tmp_path / "pushed").as_uri(), "--include-checkpoints", env=env
        ),
    ]
    for proc in procs:
        assert proc.returncode == 0, proc.stderr
        assert scan_output(proc) == []
    assert json.loads(procs[0].stdout)["status"] == "ok"
    assert (tmp_path / "pushed" / "training_args.bin").is_file()
    assert scan_tree(tmp_path / "pushed") == {}
    assert leaks((tmp_path / "eval.json").read_bytes()) == []


def test_dry_run_masks_secrets_at_every_depth(
    tmp_path: Path, text_files: tuple[Path, Path]
) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text(
        "model_type: gpt2\ntrain_tokenizer: 300\n"
        f"train_file: {text_files[0]}\n"
        "training_args:\n"
        f"  hub_token: {SECRETS['training_args']}\n"
        "  lr_scheduler_kwargs:\n"
        f"    api_key: {SECRETS['nested']}\n"
        "    power: 2.0\n"
    )
    for extra in ((), ("--json",)):
        proc = lmctl("train", "clm", "--config", config, "--dry-run", *extra, cwd=tmp_path)
        assert proc.returncode == 0, proc.stderr
        assert scan_output(proc) == []
        assert "hub_token: '***'" in proc.stdout or '"hub_token": "***"' in proc.stdout
        assert "power" in proc.stdout and "api_key" in proc.stdout
        assert "train_tokenizer" in proc.stdout  # a name with "token" in it is not a secret
    assert not list(tmp_path.glob("runs"))


def test_an_error_message_never_shows_a_secret(tmp_path: Path) -> None:
    config = tmp_path / "cfg.yaml"
    config.write_text(f"token: [{SECRETS['flag']}]\n")
    proc = lmctl("train", "clm", "--config", config, "--dry-run", "--json", cwd=tmp_path)
    assert_clean_failure(proc, 2, "token")
    assert scan_output(proc) == []
    assert json.loads(proc.stdout)["status"] == "error"


def test_push_withholds_a_pickle_holding_a_secret(tmp_path: Path) -> None:
    """A model directory from elsewhere (or an older lmctl) with a token in training_args.bin."""
    import torch
    from transformers import GPT2Config, TrainingArguments

    model = tmp_path / "model"
    model.mkdir()
    GPT2Config(n_layer=1, n_embd=16, n_head=2).save_pretrained(model)
    args = TrainingArguments(output_dir=str(tmp_path), hub_token=SECRETS["training_args"])
    torch.save(args, model / "training_args.bin")
    (model / "README.md").write_text("# model\n")
    dest = tmp_path / "dest"
    proc = lmctl("push", model, "--to", dest.as_uri())
    assert proc.returncode == 0, proc.stderr
    assert "not pushing training_args.bin: it holds a secret (hub_token)" in proc.stderr
    assert (dest / "config.json").is_file() and not (dest / "training_args.bin").exists()
    assert scan_tree(dest) == {} and scan_output(proc) == []

    # Only a secret-named key with a value counts, not a value that merely names one.
    from lmctl import secrets

    clean = TrainingArguments(output_dir=str(tmp_path / "my-secret-token-dir"))
    torch.save(clean, model / "training_args.bin")
    assert secrets.pickled_secret(model / "training_args.bin") is None


@pytest.mark.parametrize(
    ("name", "secret"),
    [
        ("hub_token", True),
        ("token", True),
        ("api_key", True),
        ("AWS_SECRET_ACCESS_KEY", True),
        ("db-password", True),
        ("tokenizer_name", False),
        ("train_tokenizer", False),
        ("include_num_input_tokens_seen", False),
        ("pad_token", False),
        ("keep_linebreaks", False),
        ("ending_columns", False),
    ],
)
def test_which_keys_are_secrets(name: str, secret: bool) -> None:
    from lmctl import secrets

    assert secrets.is_secret_key(name) is secret
