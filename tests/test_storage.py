"""The storage layer: destination parsing, the remote-read cache, and the Hub publisher.

The Hub cannot be reached from the test machine, so the Hub publisher is checked at the
boundary: ``huggingface_hub.HfApi`` is replaced by a recorder and the test asserts what lmctl
asked of it (one commit with every file, the branch, privacy, the message, the token).
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any, ClassVar

import pytest
from typer.testing import CliRunner

from lmctl.cli.app import app
from lmctl.errors import ConfigError, PermissionDenied
from lmctl.storage import locations
from tests.conftest import S3Store


@pytest.mark.parametrize(
    ("text", "protocol", "path"),
    [
        ("s3://models/runs/tiny/", "s3", "models/runs/tiny"),
        ("gs://my_bucket/x", "gs", "my_bucket/x"),
        ("oss://bucket-1/a/b", "oss", "bucket-1/a/b"),
        ("hdfs://namenode:8020/user/me/model", "hdfs", "namenode:8020/user/me/model"),
        ("file:///tmp/models/x", "file", "/tmp/models/x"),
        ("hf://my-user/tiny.gpt2", "hf", "my-user/tiny.gpt2"),
        ("memory://anything/goes", "memory", "anything/goes"),
    ],
)
def test_parse_location(text: str, protocol: str, path: str) -> None:
    location = locations.parse_location(text, "--to")
    assert (location.protocol, location.path) == (protocol, path)


@pytest.mark.parametrize(
    "text", ["", "s3://", "gs://bucket/a//b", "hf://a--b/c", "hf://ns/../x", "./local", "s3:bucket"]
)
def test_parse_location_rejects(text: str) -> None:
    with pytest.raises(ConfigError) as info:
        locations.parse_location(text, "--to")
    assert info.value.exit_code == 2
    assert info.value.message.startswith("--to")


def test_failure_mapping() -> None:
    assert locations.failure(PermissionError("Access Denied"), "s3://b/x").exit_code == 7
    assert locations.failure(ConnectionRefusedError(111, "refused"), "s3://b/x").exit_code == 6
    assert locations.failure(FileNotFoundError("no bucket"), "s3://b/x").exit_code == 2
    with pytest.raises(ZeroDivisionError):
        locations.failure(ZeroDivisionError(), "s3://b/x")


@pytest.fixture
def s3_env(s3_store: S3Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> S3Store:
    for key, value in s3_store.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("LMCTL_CACHE", str(tmp_path / "cache"))
    locations.forget_fetched()
    return s3_store


def test_localize_caches_by_etag_and_size(s3_env: S3Store) -> None:
    client = s3_env.client()
    client.put_object(Bucket="models", Key="cache/data/train.txt", Body=b"first version\n")
    first = locations.localize("s3://models/cache/data/train.txt", "--train-file")
    assert first.name == "train.txt" and first.read_bytes() == b"first version\n"
    before = first.stat()

    locations.forget_fetched()  # a new run: the remote object is checked again
    again = locations.localize("s3://models/cache/data/train.txt", "--train-file")
    after = again.stat()
    assert again == first
    assert (after.st_ino, after.st_mtime_ns) == (before.st_ino, before.st_mtime_ns), (
        "an unchanged object was downloaded again"
    )

    client.put_object(Bucket="models", Key="cache/data/train.txt", Body=b"second version\n")
    locations.forget_fetched()
    changed = locations.localize("s3://models/cache/data/train.txt", "--train-file")
    assert changed.read_bytes() == b"second version\n"


def test_localize_directory_skips_checkpoints_and_hidden_files(s3_env: S3Store) -> None:
    client = s3_env.client()
    for key in ("config.json", "sub/extra.bin", "checkpoint-5/model.bin", ".hidden"):
        client.put_object(Bucket="models", Key=f"plain/{key}", Body=key.encode())
    local = locations.localize("s3://models/plain/")
    found = sorted(p.relative_to(local).as_posix() for p in local.rglob("*") if p.is_file())
    assert [name for name in found if not name.startswith(".lmctl")] == [
        "config.json",
        "sub/extra.bin",
    ]


def test_localize_checks_manifest_checksums(s3_env: S3Store) -> None:
    client = s3_env.client()
    client.put_object(Bucket="models", Key="bad/config.json", Body=b"{}")
    manifest = {"files": [{"path": "config.json", "size": 2, "sha256": "0" * 64}]}
    client.put_object(Bucket="models", Key="bad/lmctl-manifest.json", Body=json.dumps(manifest))
    with pytest.raises(Exception, match="does not match its checksum"):
        locations.localize("s3://models/bad", "--model-name-or-path s3://models/bad")
    client.put_object(Bucket="models", Key="partial/lmctl-manifest.json", Body=json.dumps(manifest))
    with pytest.raises(ConfigError) as missing:
        locations.localize("s3://models/partial")
    assert missing.value.message == (
        "s3://models/partial/config.json: listed in s3://models/partial/lmctl-manifest.json "
        "but not in the store"
    )


def test_localize_missing_object_is_a_usage_error(s3_env: S3Store) -> None:
    with pytest.raises(ConfigError) as info:
        locations.localize(
            "s3://models/nothing/here.txt", "--train-file s3://models/nothing/here.txt"
        )
    assert info.value.message.startswith("--train-file s3://models/nothing/here.txt: not found")


def test_localize_keeps_local_paths(tmp_path: Path) -> None:
    assert locations.localize(str(tmp_path)) == tmp_path
    assert locations.localize(f"file://{tmp_path}") == tmp_path


def test_a_registered_filesystem_plugs_in(
    tmp_path: Path, monkeypatch: pytest.MonkeyPatch, model_dir: Path
) -> None:
    """The README's plug-in recipe: a new protocol for push and for remote reads."""
    import fsspec
    from fsspec.implementations.dirfs import DirFileSystem
    from fsspec.implementations.local import LocalFileSystem

    mount = str(tmp_path / "vault")

    class VaultFileSystem(DirFileSystem):
        """vault://team/file -> <mount>/team/file."""

        protocol = "vault"

        def __init__(self, **kwargs: Any) -> None:
            super().__init__(path=mount, fs=LocalFileSystem(), **kwargs)

    fsspec.register_implementation("vault", VaultFileSystem, clobber=True)
    monkeypatch.setenv("LMCTL_CACHE", str(tmp_path / "cache"))
    locations.forget_fetched()
    result = CliRunner().invoke(app, ["push", str(model_dir), "--to", "vault://team/model"])
    assert result.exit_code == 0, result.output
    published = sorted(p.name for p in (tmp_path / "vault" / "team" / "model").iterdir())
    assert published == [
        "README.md",
        "config.json",
        "lmctl-manifest.json",
        "model.safetensors",
        "tokenizer.json",
    ]
    fetched = locations.localize("vault://team/model", "--model-name-or-path")
    assert (fetched / "config.json").read_text() == "config.json"
    assert fetched.is_relative_to(tmp_path / "cache")


# The Hub publisher, at the huggingface_hub boundary -----------------------------------------


class RecordingHfApi:
    calls: ClassVar[list[tuple[str, Any]]] = []
    whoami_answer: ClassVar[dict[str, Any]] = {}
    fail_commit: ClassVar[Exception | None] = None

    def __init__(self, endpoint: str | None = None, token: str | None = None) -> None:
        self.calls.append(("init", {"token": token}))

    def whoami(self) -> dict[str, Any]:
        self.calls.append(("whoami", {}))
        return self.whoami_answer

    def create_repo(self, repo_id: str, **kwargs: Any) -> str:
        self.calls.append(("create_repo", {"repo_id": repo_id, **kwargs}))
        return f"https://hub/{repo_id}"

    def create_branch(self, repo_id: str, **kwargs: Any) -> None:
        self.calls.append(("create_branch", {"repo_id": repo_id, **kwargs}))

    def create_commit(self, repo_id: str, **kwargs: Any) -> Any:
        if self.fail_commit is not None:
            raise self.fail_commit
        paths = [op.path_in_repo for op in kwargs.pop("operations")]
        self.calls.append(("create_commit", {"repo_id": repo_id, "paths": paths, **kwargs}))

        class Info:
            oid = "abc123"
            commit_url = f"https://hub/{repo_id}/commit/abc123"

        return Info()


@pytest.fixture
def fake_hub(monkeypatch: pytest.MonkeyPatch) -> type[RecordingHfApi]:
    import huggingface_hub

    from lmctl.storage import hub

    RecordingHfApi.calls = []
    RecordingHfApi.fail_commit = None
    RecordingHfApi.whoami_answer = {
        "name": "me",
        "orgs": [{"name": "team", "roleInOrg": "write"}, {"name": "readers", "roleInOrg": "read"}],
        "auth": {"accessToken": {"role": "write"}},
    }
    monkeypatch.setattr(huggingface_hub, "HfApi", RecordingHfApi)
    monkeypatch.setattr(hub, "hub_reachable", lambda: True)
    return RecordingHfApi


@pytest.fixture
def model_dir(tmp_path: Path) -> Path:
    model = tmp_path / "model"
    (model / "checkpoint-5").mkdir(parents=True)
    for name in ("config.json", "model.safetensors", "tokenizer.json", "README.md"):
        (model / name).write_text(name)
    (model / "checkpoint-5" / "model.safetensors").write_text("ckpt")
    return model


def test_hub_push_is_one_commit(fake_hub: type[RecordingHfApi], model_dir: Path) -> None:
    token_file = model_dir.parent / "token"
    token_file.write_text("hf_secretfromfile\n")
    result = CliRunner().invoke(
        app,
        [
            "push",
            str(model_dir),
            "--to",
            "hf://team/tiny",
            "--private",
            "--revision",
            "v1",
            "--message",
            "first release",
            "--token-file",
            str(token_file),
            "--json",
        ],
    )
    assert result.exit_code == 0, result.output
    names = [name for name, _ in fake_hub.calls]
    assert names == ["init", "whoami", "create_repo", "create_branch", "create_commit"]
    calls = dict(fake_hub.calls)
    assert calls["init"] == {"token": "hf_secretfromfile"}
    assert calls["create_repo"] == {"repo_id": "team/tiny", "private": True, "exist_ok": True}
    assert calls["create_branch"]["branch"] == "v1"
    assert calls["create_commit"] == {
        "repo_id": "team/tiny",
        "paths": ["README.md", "config.json", "model.safetensors", "tokenizer.json"],
        "commit_message": "first release",
        "revision": "v1",
    }
    payload = json.loads(result.stdout)
    assert payload["commit"] == "abc123"
    assert "hf_secretfromfile" not in result.output


def test_hub_push_with_checkpoints_on_main(fake_hub: type[RecordingHfApi], model_dir: Path) -> None:
    result = CliRunner().invoke(
        app, ["push", str(model_dir), "--to", "hf://me/tiny", "--include-checkpoints"]
    )
    assert result.exit_code == 0, result.output
    calls = dict(fake_hub.calls)
    assert "create_branch" not in calls
    assert calls["create_repo"]["private"] is None
    assert "checkpoint-5/model.safetensors" in calls["create_commit"]["paths"]
    assert calls["create_commit"]["revision"] is None


@pytest.mark.parametrize(
    ("dest", "answer", "expected"),
    [
        ("hf://someone-else/x", None, "cannot write to the namespace 'someone-else'"),
        ("hf://readers/x", None, "read-only access to 'readers'"),
        ("hf://me/x", {"name": "me", "auth": {"accessToken": {"role": "read"}}}, "read-only"),
    ],
)
def test_hub_write_access_is_checked(
    fake_hub: type[RecordingHfApi],
    model_dir: Path,
    dest: str,
    answer: dict[str, Any] | None,
    expected: str,
) -> None:
    if answer is not None:
        fake_hub.whoami_answer = answer
    result = CliRunner().invoke(app, ["push", str(model_dir), "--to", dest])
    assert result.exit_code == 7, result.output
    assert expected in result.output
    assert "create_commit" not in dict(fake_hub.calls)


def test_hub_refusal_maps_to_permission_error(
    fake_hub: type[RecordingHfApi], model_dir: Path
) -> None:
    from huggingface_hub.errors import HfHubHTTPError

    class Response:
        """What huggingface_hub reads from an HTTP response (its client is not needed)."""

        status_code = 403
        headers: ClassVar[dict[str, str]] = {}
        request = None
        text = "you don't have the rights"

    response: Any = Response()
    fake_hub.fail_commit = HfHubHTTPError("403 Forbidden", response=response)
    result = CliRunner().invoke(app, ["push", str(model_dir), "--to", "hf://me/tiny"])
    assert result.exit_code == PermissionDenied.exit_code, result.output
    assert "refused the credentials" in result.output


def test_an_md5_is_computed_only_for_a_store_that_keeps_md5s(tmp_path: Path) -> None:
    """GCS reports each object's MD5 (``md5Hash``), which verifies an upload without reading
    it back; other stores keep none, and a file's MD5 is then never computed."""
    import base64
    import hashlib

    from fsspec.implementations.memory import MemoryFileSystem

    class Md5Store(MemoryFileSystem):  # type: ignore[misc]
        """A memory store that reports MD5s as GCS does."""

        def info(self, path: str, **kwargs: object) -> dict[str, object]:
            info = dict(super().info(path, **kwargs))
            if info.get("type") == "file":
                digest = hashlib.md5(self.cat_file(path), usedforsecurity=False).digest()
                info["md5Hash"] = base64.b64encode(digest).decode()
            return info

    local = tmp_path / "weights.bin"
    local.write_bytes(b"weights" * 1000)
    size = local.stat().st_size
    plain = MemoryFileSystem()
    plain.pipe_file("/plain/weights.bin", local.read_bytes())
    digests = locations.file_digests(local)
    assert locations.object_matches(plain, "/plain/weights.bin", size, digests)
    assert digests.known_md5 is None  # verified by a read-back SHA-256, no MD5 taken

    store = Md5Store()
    store.pipe_file("/gcs/weights.bin", local.read_bytes())
    assert locations.object_matches(store, "/gcs/weights.bin", size, digests)
    assert digests.known_md5 == hashlib.md5(local.read_bytes(), usedforsecurity=False).hexdigest()
    store.pipe_file("/gcs/other.bin", b"Weights" + local.read_bytes()[7:])
    assert not locations.object_matches(store, "/gcs/other.bin", size, digests)
    # Digests known only by their SHA-256 (another machine's part) are read back instead.
    remote_only = locations.Digests(digests.sha256)
    assert locations.object_matches(store, "/gcs/weights.bin", size, remote_only)
    assert not locations.object_matches(store, "/gcs/other.bin", size, remote_only)
