"""``lmctl push`` and ``train --push-to`` against a real S3 endpoint on loopback (moto).

A tiny GPT-2 is trained once per session; each test publishes it under its own prefix of
the ``models`` bucket and checks what a reader of the bucket sees.
"""

from __future__ import annotations

import hashlib
import json
import re
import subprocess
from pathlib import Path
from typing import Any

import pytest

from lmctl.publish.files import published_config
from tests.conftest import HUB_ONLINE, S3Store, free_port, lmctl, tiny_clm_args

pytestmark = pytest.mark.e2e

MANIFEST = "lmctl-manifest.json"
HUB_OFFLINE = {"HF_ENDPOINT": f"http://127.0.0.1:{free_port()}", **HUB_ONLINE}


def _train_args(tokenizer: Path, train: Path, valid: Path, out: Path) -> list[str | Path]:
    return tiny_clm_args(
        tokenizer, (train, valid), "--save-steps", "5", "--output-dir", out, steps=10
    )


@pytest.fixture(scope="session")
def trained_run(
    tmp_path_factory: pytest.TempPathFactory, bpe_tokenizer: Path, text_files: tuple[Path, Path]
) -> Path:
    out = tmp_path_factory.mktemp("push") / "run"
    proc = lmctl(*_train_args(bpe_tokenizer, *text_files, out))
    assert proc.returncode == 0, proc.stderr
    assert (out / "checkpoint-10").is_dir()
    return out


def _run_files(run: Path, *, checkpoints: bool = False) -> dict[str, Path]:
    return {
        path.relative_to(run).as_posix(): path
        for path in sorted(run.rglob("*"))
        if path.is_file()
        and not any(part.startswith(".") for part in path.relative_to(run).parts)
        and (checkpoints or not path.relative_to(run).parts[0].startswith("checkpoint-"))
    }


def _sha256(data: bytes) -> str:
    return hashlib.sha256(data).hexdigest()


def _published(rel: str, path: Path) -> bytes:
    """What a push publishes of a run's file: a copy of lmctl.yaml without local paths, any
    other file as it is."""
    if rel == "lmctl.yaml":
        return published_config(path.read_text(encoding="utf-8")).encode()
    return path.read_bytes()


def _push(run: Path, dest: str, store: S3Store, *extra: str, **env: str) -> Any:
    return lmctl("push", run, "--to", dest, "--json", *extra, env={**store.env(), **env})


def _error_lines(proc: subprocess.CompletedProcess[str]) -> list[str]:
    return [line for line in proc.stderr.splitlines() if " ERROR " in line]


def _assert_published(store: S3Store, prefix: str, run: Path) -> dict[str, Any]:
    """Every file exactly once, checksums match the run and the manifest; nothing staged."""
    keys = store.keys(prefix + "/")
    assert len(keys) == len(set(keys))
    local = _run_files(run)
    assert sorted(key[len(prefix) + 1 :] for key in keys) == sorted([*local, MANIFEST])
    manifest = json.loads(store.read(f"{prefix}/{MANIFEST}"))
    listed = {item["path"]: item for item in manifest["files"]}
    assert sorted(listed) == sorted(local)
    for rel, path in local.items():
        data = store.read(f"{prefix}/{rel}")
        assert _sha256(data) == _sha256(_published(rel, path)) == listed[rel]["sha256"], rel
        assert len(data) == listed[rel]["size"]
    parent, _, name = prefix.rpartition("/")
    assert store.keys(f"{parent}/.{name}.lmctl-staging/") == []
    return manifest


def test_push_to_s3_and_read_back(
    trained_run: Path,
    s3_store: S3Store,
    text_files: tuple[Path, Path],
    tmp_path: Path,
    monkeypatch: pytest.MonkeyPatch,
) -> None:
    proc = _push(trained_run, "s3://models/tiny", s3_store)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["status"] == "ok"
    assert sorted(result["uploaded"]) == sorted(_run_files(trained_run))
    manifest = _assert_published(s3_store, "tiny", trained_run)
    assert not any(item["path"].startswith("checkpoint-") for item in manifest["files"])
    card = s3_store.read("tiny/README.md").decode()
    assert "pipeline_tag: text-generation" in card
    assert "| eval_loss |" in card
    assert "lmctl train clm" in card

    # Read it back through lmctl: the model and the validation data both come from S3.
    _, valid = text_files
    s3_store.client().upload_file(str(valid), "models", "data/valid.txt")
    local_loss = json.loads((trained_run / "all_results.json").read_text())["eval_loss"]
    remote_loss = evaluate(
        "s3://models/tiny", "s3://models/data/valid.txt", tmp_path, s3_store.env()
    )
    assert remote_loss == pytest.approx(local_loss, rel=1e-5)

    # And in-process, as `lmctl eval` loads a remote model: same logits as the local copy.
    for key, value in s3_store.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("LMCTL_CACHE", str(tmp_path / "cache"))
    from lmctl.storage import locations

    fetched = locations.localize("s3://models/tiny")
    assert fetched.is_dir() and not (fetched / "checkpoint-10").exists()
    assert _loss(fetched) == _loss(trained_run)


def evaluate(model: str, validation: str, out: Path, env: dict[str, str]) -> float:
    """Evaluate a model with lmctl and return its eval loss.

    Runs an evaluation-only ``lmctl train clm --no-train``; ``lmctl eval MODEL
    --validation-file FILE --json`` is the same check once that command exists.
    """
    proc = lmctl(
        "train",
        "clm",
        "--model",
        model,
        "--no-train",
        "--validation-file",
        validation,
        "--block-size",
        "64",
        "--output-dir",
        out / "eval",
        "--json",
        env={**env, "LMCTL_CACHE": str(out / "cache")},
    )
    assert proc.returncode == 0, proc.stderr
    loss: float = json.loads(proc.stdout)["metrics"]["eval_loss"]
    return loss


def _loss(model_dir: Path) -> float:
    import torch
    from transformers import AutoModelForCausalLM, AutoTokenizer

    tokenizer = AutoTokenizer.from_pretrained(model_dir)
    model = AutoModelForCausalLM.from_pretrained(model_dir).eval()
    ids = tokenizer("To be, or not to be, that is the question.", return_tensors="pt")
    with torch.no_grad():
        return float(model(**ids, labels=ids["input_ids"]).loss)


def _versions(store: S3Store, prefix: str) -> dict[str, int]:
    """How many times each key under ``prefix`` was written (bucket versioning is on)."""
    listing = store.client().list_object_versions(Bucket=store.bucket, Prefix=prefix)
    counts: dict[str, int] = {}
    for version in listing.get("Versions", []):
        counts[version["Key"]] = counts.get(version["Key"], 0) + 1
    return counts


def test_killed_push_resumes_without_reuploading(trained_run: Path, s3_store: S3Store) -> None:
    files = _run_files(trained_run)
    killed = _push(trained_run, "s3://models/killed/tiny", s3_store, LMCTL_TEST_PUSH_KILL_AFTER="4")
    assert killed.returncode == -9, killed.stderr  # SIGKILL: no cleanup code ran
    assert s3_store.keys("killed/tiny/") == []  # nothing visible under the destination
    staged = s3_store.keys("killed/.tiny.lmctl-staging/")
    assert len(staged) == 4

    proc = _push(trained_run, "s3://models/killed/tiny", s3_store)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    staged_names = sorted(key.rsplit("/", 1)[-1] for key in staged)
    assert sorted(result["reused"]) == staged_names
    assert sorted(result["uploaded"]) == sorted(set(files) - set(staged_names))
    staging = "killed/.tiny.lmctl-staging/"
    written = {
        key[len(staging) :]: count
        for key, count in _versions(s3_store, staging).items()
        if key[len(staging) :] in files
    }
    assert written == dict.fromkeys(files, 1), "a verified object was uploaded again"
    _assert_published(s3_store, "killed/tiny", trained_run)


def test_push_killed_while_moving_into_place(trained_run: Path, s3_store: S3Store) -> None:
    files = _run_files(trained_run)
    kill_after = str(len(files) + 2)  # every upload, then two moves into place
    killed = _push(
        trained_run, "s3://models/moving/tiny", s3_store, LMCTL_TEST_PUSH_KILL_AFTER=kill_after
    )
    assert killed.returncode == -9, killed.stderr
    visible = s3_store.keys("moving/tiny/")
    assert len(visible) == 2
    assert f"moving/tiny/{MANIFEST}" not in visible  # readers know the push is not complete

    proc = _push(trained_run, "s3://models/moving/tiny", s3_store)
    assert proc.returncode == 0, proc.stderr
    result = json.loads(proc.stdout)
    assert result["uploaded"] == []
    assert sorted(result["reused"]) == sorted(files)
    _assert_published(s3_store, "moving/tiny", trained_run)


def test_push_again_replaces_the_previous_publication(
    trained_run: Path, s3_store: S3Store, tmp_path: Path
) -> None:
    model = tmp_path / "model"
    model.mkdir()
    for name in ("config.json", "model.safetensors", "tokenizer.json", "stale.txt"):
        (model / name).write_bytes(
            (trained_run / name).read_bytes() if name != "stale.txt" else b"old"
        )
    first = _push(model, "s3://models/again", s3_store)
    assert first.returncode == 0, first.stderr
    (model / "stale.txt").unlink()
    (model / "config.json").write_text((model / "config.json").read_text() + "\n")
    second = _push(model, "s3://models/again", s3_store)
    assert second.returncode == 0, second.stderr
    result = json.loads(second.stdout)
    assert result["uploaded"] == ["config.json"]
    assert sorted(s3_store.keys("again/")) == sorted(
        f"again/{name}" for name in ("config.json", "model.safetensors", "tokenizer.json", MANIFEST)
    )
    assert s3_store.read("again/config.json") == (model / "config.json").read_bytes()


def test_dry_run_lists_files_and_uploads_nothing(trained_run: Path, s3_store: S3Store) -> None:
    proc = _push(trained_run, "s3://models/dry", s3_store, "--dry-run")
    assert proc.returncode == 0, proc.stderr
    listed = {item["path"]: item["size"] for item in json.loads(proc.stdout)["files"]}
    files = _run_files(trained_run).items()
    assert listed == {rel: len(_published(rel, path)) for rel, path in files}
    with_checkpoints = _push(
        trained_run, "s3://models/dry", s3_store, "--dry-run", "--include-checkpoints"
    )
    paths = [item["path"] for item in json.loads(with_checkpoints.stdout)["files"]]
    assert "checkpoint-10/model.safetensors" in paths
    assert "checkpoint-5/trainer_state.json" in paths
    plain = lmctl("push", trained_run, "--to", "s3://models/dry", "--dry-run", env=s3_store.env())
    assert "model.safetensors" in plain.stdout and "total" in plain.stdout
    assert s3_store.keys("dry") == []


def test_push_to_a_local_folder(trained_run: Path, tmp_path: Path) -> None:
    dest = tmp_path / "published" / "tiny"
    proc = lmctl("push", trained_run, "--to", f"file://{dest}", "--json")
    assert proc.returncode == 0, proc.stderr
    manifest = json.loads((dest / MANIFEST).read_text())
    for item in manifest["files"]:
        assert _sha256((dest / item["path"]).read_bytes()) == item["sha256"]
    assert sorted(p.name for p in dest.parent.iterdir()) == ["tiny"]  # staging removed


# Errors: one line, a documented exit code, seconds not minutes --------------------------


def test_push_without_write_permission_exits_7(trained_run: Path, s3_store: S3Store) -> None:
    proc = lmctl(
        "push", trained_run, "--to", "s3://models/denied", env=s3_store.env(s3_store.reader)
    )
    assert proc.returncode == 7, proc.stderr
    (line,) = _error_lines(proc)
    assert "s3://models/denied: permission denied" in line
    assert "Traceback" not in proc.stderr
    assert s3_store.keys("denied") == [] and s3_store.keys(".denied") == []


def test_push_with_unknown_credentials_exits_7(trained_run: Path, s3_store: S3Store) -> None:
    env = s3_store.env(("AKIANOTAREALKEY00000", "not-the-secret"))
    proc = lmctl("push", trained_run, "--to", "s3://models/bogus", env=env)
    assert proc.returncode == 7, proc.stderr
    assert len(_error_lines(proc)) == 1


def test_push_to_a_missing_bucket_exits_2(trained_run: Path, s3_store: S3Store) -> None:
    proc = lmctl("push", trained_run, "--to", "s3://no-such-bucket/x", env=s3_store.env())
    assert proc.returncode == 2, proc.stderr
    (line,) = _error_lines(proc)
    assert "no-such-bucket" in line and "not found" in line


def test_push_to_an_unreachable_store_exits_6(trained_run: Path, s3_store: S3Store) -> None:
    env = {**s3_store.env(), "AWS_ENDPOINT_URL": f"http://127.0.0.1:{free_port()}"}
    proc = lmctl("push", trained_run, "--to", "s3://models/x", env=env, timeout=60)
    assert proc.returncode == 6, proc.stderr
    (line,) = _error_lines(proc)
    assert "could not be reached" in line


@pytest.mark.parametrize(
    ("dest", "expected"),
    [
        ("s3://", "empty or malformed path"),
        ("s3:/models/x", "not a URL"),
        ("models/x", "not a URL"),
        ("s3://Not_A_Bucket/x", "not a valid bucket name"),
        ("s3://models//x", "empty or malformed path"),
        ("hf://just-a-name", "hf://NAMESPACE/REPO"),
        ("hf://a/b/c", "hf://NAMESPACE/REPO"),
        ("file://relative/path", "absolute path"),
        ("s3://user:secret@models/x", "credentials in the URL"),
        ("nosuchproto://bucket/x", "unknown storage protocol"),
    ],
)
def test_malformed_destination_exits_2(tmp_path: Path, dest: str, expected: str) -> None:
    proc = lmctl("push", tmp_path, "--to", dest)
    assert proc.returncode == 2, proc.stderr
    (line,) = _error_lines(proc)
    assert expected in line
    assert "secret" not in proc.stderr.replace("credentials in the URL", "")


def test_missing_protocol_extra_names_the_extra(tmp_path: Path) -> None:
    pytest.importorskip("fsspec")
    try:
        import gcsfs  # noqa: F401

        pytest.skip("gcsfs is installed")
    except ImportError:
        pass
    proc = lmctl("push", tmp_path, "--to", "gs://my-bucket/models")
    assert proc.returncode == 2, proc.stderr
    (line,) = _error_lines(proc)
    assert "gcsfs" in line and "pip install 'lmctl-train[gcs]'" in line


def test_missing_extra_is_reported_for_a_simulated_protocol(tmp_path: Path) -> None:
    """A registered protocol whose package is absent, as fsspec reports it."""
    code = (
        "import fsspec, sys\n"
        "fsspec.register_implementation('oss', 'not_installed_ossfs.OSSFileSystem', clobber=True,"
        " errtxt='Install ossfs to access Alibaba Object Storage System')\n"
        "from lmctl.cli.app import main\n"
        f"sys.argv = ['lmctl', 'push', {str(tmp_path)!r}, '--to', 'oss://bucket/x']\n"
        "main()\n"
    )
    import os
    import sys

    proc = subprocess.run(
        [sys.executable, "-c", code],
        capture_output=True,
        text=True,
        env={**os.environ, "CI": "1"},
        check=False,
    )
    assert proc.returncode == 2, proc.stderr
    (line,) = _error_lines(proc)
    assert "pip install 'lmctl-train[oss]'" in line


def test_not_a_model_directory_exits_2(tmp_path: Path, s3_store: S3Store) -> None:
    proc = lmctl("push", tmp_path, "--to", "s3://models/empty", env=s3_store.env())
    assert proc.returncode == 2, proc.stderr
    assert "not a run directory" in _error_lines(proc)[0]


def test_local_destination_under_a_file_exits_2(tmp_path: Path) -> None:
    model = tmp_path / "model"
    model.mkdir()
    (model / "config.json").write_text("{}")
    (model / "model.safetensors").write_bytes(b"weights")
    blocker = tmp_path / "taken"
    blocker.write_text("mine\n")
    proc = lmctl("push", model, "--to", f"file://{blocker}/model")
    assert proc.returncode == 2, proc.stderr
    (line,) = _error_lines(proc)
    assert f"file://{blocker}/model: a file is in the way" in line
    assert blocker.read_text() == "mine\n"


def test_hub_push_offline_fails_fast_with_exit_6(trained_run: Path) -> None:
    proc = lmctl("push", trained_run, "--to", "hf://user/repo", env=HUB_OFFLINE, timeout=60)
    assert proc.returncode == 6, proc.stderr
    (line,) = _error_lines(proc)
    assert "Hugging Face Hub" in line and "unreachable" in line
    offline = lmctl("push", trained_run, "--to", "hf://user/repo", env={"HF_HUB_OFFLINE": "1"})
    assert offline.returncode == 6
    assert "HF_HUB_OFFLINE" in offline.stderr


def test_object_store_rejects_hub_only_flags(trained_run: Path) -> None:
    proc = lmctl("push", trained_run, "--to", "s3://models/x", "--token", "abc", "--private")
    assert proc.returncode == 2
    assert "--token only applies to a Hub destination" in proc.stderr
    assert "--private only applies" in proc.stderr


# train --push-to --------------------------------------------------------------------------


def test_train_checks_write_access_before_training(
    tmp_path: Path, s3_store: S3Store, bpe_tokenizer: Path, text_files: tuple[Path, Path]
) -> None:
    out = tmp_path / "run"
    args = [*_train_args(bpe_tokenizer, *text_files, out), "--push-to", "s3://models/pre"]
    denied = lmctl(*args, env=s3_store.env(s3_store.reader))
    assert denied.returncode == 7, denied.stderr
    assert "permission denied" in _error_lines(denied)[0]
    assert "step" not in denied.stderr  # failed before any training step
    assert not (out / "model.safetensors").exists()

    hub = lmctl(
        *_train_args(bpe_tokenizer, *text_files, out), "--push-to", "hf://me/x", env=HUB_OFFLINE
    )
    assert hub.returncode == 6, hub.stderr
    assert not (out / "model.safetensors").exists()

    bad = lmctl(*_train_args(bpe_tokenizer, *text_files, out), "--push-to", "s3:/x", "--dry-run")
    assert bad.returncode == 2
    assert "--push-to 's3:/x': not a URL" in bad.stderr


def test_train_push_to_and_secret_hygiene(
    tmp_path: Path, s3_store: S3Store, bpe_tokenizer: Path, text_files: tuple[Path, Path]
) -> None:
    """Tokens given by flag, file and environment never reach a file, the output or the store."""
    flag_token = "hf_FlagTokenThatMustNeverBeWritten0001"
    env_token = "hf_EnvTokenThatMustNeverBeWritten00002"
    file_token = "hf_FileTokenThatMustNeverBeWritten0003"
    token_file = tmp_path / "token.txt"
    token_file.write_text(file_token + "\n")
    env = {**s3_store.env(), "HF_TOKEN": env_token}
    out = tmp_path / "run"
    outputs = []

    train = lmctl(
        *_train_args(bpe_tokenizer, *text_files, out),
        "--token",
        flag_token,
        "--push-to",
        "s3://models/hygiene/run",
        "--json",
        env=env,
    )
    outputs.append(train)
    assert train.returncode == 0, train.stderr
    result = json.loads(train.stdout)
    assert result["push"]["destination"] == "s3://models/hygiene/run"
    _assert_published(s3_store, "hygiene/run", out)

    outputs.append(
        lmctl("push", out, "--to", "hf://me/x", "--token", flag_token, env={**env, **HUB_OFFLINE})
    )
    outputs.append(
        lmctl("push", out, "--to", "hf://me/x", f"--token={flag_token}", env={**env, **HUB_OFFLINE})
    )
    outputs.append(
        lmctl(
            "push", out, "--to", "hf://me/x", "--token-file", token_file, env={**env, **HUB_OFFLINE}
        )
    )
    outputs.append(lmctl("push", out, "--to", "s3://models/hygiene/again", "--json", env=env))
    assert [proc.returncode for proc in outputs] == [0, 6, 6, 6, 0]

    secrets = [flag_token, env_token, file_token, s3_store.writer[1]]
    texts = [proc.stdout + proc.stderr for proc in outputs]
    blobs = [path.read_bytes() for path in out.rglob("*") if path.is_file()]
    blobs += [s3_store.read(key) for key in s3_store.keys("hygiene/")]
    assert len(blobs) > 20
    for secret in secrets:
        assert not any(secret in text for text in texts), "a secret reached the output"
        assert not any(secret.encode() in blob for blob in blobs), "a secret reached a file"
    assert "--token '***'" in (out / "README.md").read_text()


def test_model_card_is_refreshed_from_the_run(trained_run: Path, tmp_path: Path) -> None:
    """New results show up; the training command and library versions of the run stay."""
    import shutil

    from lmctl.console import Console
    from lmctl.run.card import refresh_model_card

    run = tmp_path / "run"
    shutil.copytree(trained_run, run)
    card = run / "README.md"
    card.write_text(re.sub(r"(?m)^- torch .*$", "- torch 0.0.1", card.read_text()))
    results = json.loads((run / "all_results.json").read_text())
    (run / "all_results.json").write_text(json.dumps({**results, "eval_rouge": 0.25}))
    refresh_model_card(run, Console())
    text = card.read_text()
    assert "| eval_rouge | 0.2500 |" in text
    assert "- torch 0.0.1\n- datasets " in text and "- tokenizers " in text
    assert "lmctl train clm --model-type gpt2" in text
    # Without a card, the commands come from the run's log; without either, the command that
    # reproduces the run from its config.
    card.unlink()
    refresh_model_card(run, Console())
    assert "lmctl train clm --model-type gpt2" in card.read_text()
    card.unlink()
    log = run / "metrics.jsonl"
    log.write_text(
        "".join(line for line in log.read_text().splitlines(True) if "command" not in line)
    )
    refresh_model_card(run, Console())
    assert "lmctl train clm --config lmctl.yaml" in card.read_text()
