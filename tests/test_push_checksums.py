"""``lmctl push`` verifies objects with checksums the store guarantees, never with ETags.

An S3 ETag is the content's MD5 only for single-request uploads without SSE-KMS/SSE-C
encryption. The moto server here returns ETags that are not MD5s (as an SSE-KMS bucket or a
multipart upload does); a push must still verify, with at most one read-back per object.
"""

from __future__ import annotations

import hashlib
import json
from pathlib import Path
from typing import Any

import pytest
from typer.testing import CliRunner

from lmctl.cli.app import app
from lmctl.publish.files import published_config
from lmctl.storage import locations
from tests.conftest import S3Store

pytestmark = pytest.mark.e2e


@pytest.fixture
def etags(monkeypatch: pytest.MonkeyPatch) -> Any:
    """Make the loopback S3 server answer with ETags of the given shape (not MD5s)."""
    from moto.s3.models import FakeKey

    def use(shape: str) -> None:
        def etag(self: Any) -> str:
            digest = hashlib.md5(b"encrypted:" + self.value, usedforsecurity=False).hexdigest()
            return f'"{digest}"' if shape == "kms" else f'"{digest}-3"'

        monkeypatch.setattr(FakeKey, "etag", property(etag))

    return use


@pytest.fixture
def in_process(s3_store: S3Store, tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> S3Store:
    for key, value in s3_store.env().items():
        monkeypatch.setenv(key, value)
    monkeypatch.setenv("LMCTL_CACHE", str(tmp_path / "cache"))
    return s3_store


def _push(run: Path, dest: str) -> dict[str, Any]:
    result = CliRunner().invoke(app, ["push", str(run), "--to", dest, "--json"])
    assert result.exit_code == 0, result.output
    payload: dict[str, Any] = json.loads(result.stdout)
    return payload


def _published(store: S3Store, prefix: str, run: Path, payload: dict[str, Any]) -> None:
    manifest = json.loads(store.read(f"{prefix}/lmctl-manifest.json"))
    assert sorted(item["path"] for item in manifest["files"]) == sorted(payload["files"])
    for item in manifest["files"]:
        data = store.read(f"{prefix}/{item['path']}")
        assert hashlib.sha256(data).hexdigest() == item["sha256"]
        local = (run / item["path"]).read_bytes()
        if item["path"] == "lmctl.yaml":  # published without the machine's local paths
            local = published_config(local.decode()).encode()
        assert data == local


def _count_read_backs(monkeypatch: pytest.MonkeyPatch) -> list[str]:
    reads: list[str] = []
    original = locations.remote_sha256

    def counting(fs: Any, path: str) -> str:
        reads.append(path)
        return original(fs, path)

    monkeypatch.setattr(locations, "remote_sha256", counting)
    return reads


def test_push_to_a_bucket_whose_etags_are_not_md5s(
    tiny_clm_run: Path, in_process: S3Store, etags: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    etags("kms")
    reads = _count_read_backs(monkeypatch)
    payload = _push(tiny_clm_run, "s3://models/kms/tiny")
    _published(in_process, "kms/tiny", tiny_clm_run, payload)
    # S3 keeps the SHA-256 sent with each upload: nothing was downloaded to verify it.
    assert reads == []
    # A second push finds every object verified in place, still without reading it back.
    again = _push(tiny_clm_run, "s3://models/kms/tiny")
    assert again["uploaded"] == [] and sorted(again["reused"]) == sorted(payload["files"])
    assert reads == []


def test_without_a_stored_checksum_each_object_is_read_back_once(
    tiny_clm_run: Path, in_process: S3Store, etags: Any, monkeypatch: pytest.MonkeyPatch
) -> None:
    etags("multipart")
    # A store that keeps no checksum (or a multipart upload's composite one).
    monkeypatch.setattr(locations, "stored_sha256", lambda fs, path: None)
    reads = _count_read_backs(monkeypatch)
    payload = _push(tiny_clm_run, "s3://models/multipart/tiny")
    _published(in_process, "multipart/tiny", tiny_clm_run, payload)
    staged = [path for path in reads if ".tiny.lmctl-staging/" in path]
    assert sorted(staged) == sorted(set(staged)), "an object was read back twice"
    assert len(reads) == len(staged) == len(payload["uploaded"])
