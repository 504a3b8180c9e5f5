"""An fsspec object store as a push destination, published atomically for readers.

Files are uploaded under a staging prefix beside the destination
(``<parent>/.<name>.lmctl-staging/``) and each object's size and checksum are verified; only
then are they moved into the destination, and a manifest (``lmctl-manifest.json``: every file
with its size and SHA-256) is written last. A reader that finds the manifest finds every file
it lists. An interrupted push is re-run with the same command: objects already verified in
staging (or already in place) are not uploaded again.
"""

from __future__ import annotations

import json
import os
import signal
import uuid
from collections.abc import Callable
from contextlib import suppress
from dataclasses import dataclass
from datetime import datetime, timezone
from typing import TYPE_CHECKING, Any

from lmctl import __version__
from lmctl.errors import RemoteUnreachable
from lmctl.publish.files import LocalFile, human_size
from lmctl.storage import locations

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from lmctl.console import Console

#: Test hook: SIGKILL this process after it wrote N objects (simulates a crash midway).
KILL_AFTER_ENV = "LMCTL_TEST_PUSH_KILL_AFTER"


@dataclass(frozen=True)
class StagedFile:
    """A file that another process uploaded into the store and verified there, to be
    published at ``rel`` with the files of this one (a machine's part of a checkpoint)."""

    rel: str
    path: str
    size: int
    digests: locations.Digests


class StoreTarget:
    """An fsspec location, published through a staging prefix and a manifest written last."""

    def __init__(
        self,
        location: locations.Location,
        console: Console,
        *,
        verbose: bool = True,
        access_checked: bool = False,
        progress: Callable[[], None] | None = None,
    ) -> None:
        self.location = location
        self.url = location.url.rstrip("/")
        self.console = console
        #: False: no line per file and none at the end (the caller reports the upload).
        self.verbose = verbose
        #: True: the caller checked write access to this store already.
        self._checked = access_checked
        #: Called whenever the store takes data (a part of a file, an object): a caller that
        #: waits for the upload tells a slow store from one that stopped answering.
        self._progress = progress

    def staging_path(self, root: str) -> str:
        """A sibling of the destination, so that nothing in it shows under the destination."""
        root = root.rstrip("/")
        if self.location.protocol in locations.OBJECT_STORES and "/" not in root:
            return f"{root}/.lmctl-staging"  # the destination is a whole bucket
        parent, _, name = root.rpartition("/")
        return f"{parent}/.{name}.lmctl-staging" if name else "/.lmctl-staging"

    def _make_parent(self, fs: AbstractFileSystem, path: str) -> None:
        if self.location.protocol not in locations.OBJECT_STORES:
            fs.makedirs(path.rpartition("/")[0], exist_ok=True)

    def check_access(self) -> None:
        if self._checked:
            return
        fs, root = locations.open_location(self.location, fail_fast=True)
        staging = self.staging_path(root)
        probe = f"{staging}/.write-probe-{uuid.uuid4().hex}"
        try:
            for attempt in range(3):
                try:
                    self._make_parent(fs, probe)
                    fs.pipe_file(probe, b"lmctl write probe\n")
                    break
                except (FileNotFoundError, FileExistsError):
                    # Another process's check (each machine of a run checks at once) removed
                    # the staging folder while this one made it or wrote into it.
                    if attempt == 2:
                        raise
            fs.rm_file(probe)
        except Exception as exc:
            raise locations.failure(exc, self.url) from exc
        if self.location.protocol not in locations.OBJECT_STORES:
            with suppress(OSError):
                fs.rmdir(staging)
        self._checked = True
        if self.verbose:
            self.console.info(f"{self.url}: write access checked")

    def published_files(self) -> list[str]:
        """The files the destination's manifest lists (and an interrupted push's kept copy of
        the one before)."""
        try:
            fs, root = locations.open_location(self.location, fail_fast=True)
            listed: list[str] = []
            for manifest in (
                f"{root}/{locations.MANIFEST}",
                f"{self.staging_path(root)}/.previous-{locations.MANIFEST}",
            ):
                for item in (_read_manifest(fs, manifest) or {}).get("files", []):
                    if isinstance(item, dict) and isinstance(item.get("path"), str):
                        listed.append(item["path"])
        except Exception as exc:
            raise locations.failure(exc, self.url) from exc
        return sorted(set(listed))

    def publish(
        self, files: list[LocalFile], others: tuple[StagedFile, ...] = ()
    ) -> dict[str, Any]:
        """Publish ``files``, and ``others`` that other processes staged in the store."""
        self.check_access()
        fs, root = locations.open_location(self.location)
        try:
            return self._publish(fs, root, files, others)
        except Exception as exc:
            raise locations.failure(exc, self.url) from exc

    def upload_verified(
        self, fs: AbstractFileSystem, item: LocalFile, remote: str, digests: locations.Digests
    ) -> None:
        """Upload one file to ``remote`` and check its size and checksum there."""
        self._make_parent(fs, remote)
        locations.upload(fs, item.path, remote, item.size, progress=self._progress)
        if not locations.object_matches(fs, remote, item.size, digests):
            raise RemoteUnreachable(
                f"{self.url}: {item.rel} does not match its size or checksum after upload",
                "rerun the same command; verified objects are not uploaded again",
            )
        if self.verbose:
            self.console.info(f"uploaded {item.rel} ({human_size(item.size)}), verified")
        self._written()

    def _publish(
        self,
        fs: AbstractFileSystem,
        root: str,
        files: list[LocalFile],
        others: tuple[StagedFile, ...],
    ) -> dict[str, Any]:
        staging = self.staging_path(root)
        digests = {item.rel: locations.file_digests(item.path) for item in files}
        uploaded: list[str] = []
        reused: list[str] = []
        in_place: set[str] = set()
        for item in files:
            staged, final = f"{staging}/{item.rel}", f"{root}/{item.rel}"
            if locations.object_matches(fs, staged, item.size, digests[item.rel]):
                reused.append(item.rel)
                continue
            if locations.object_matches(fs, final, item.size, digests[item.rel]):
                reused.append(item.rel)
                in_place.add(item.rel)
                continue
            self.upload_verified(fs, item, staged, digests[item.rel])
            uploaded.append(item.rel)
        moves = [
            (item.rel, f"{staging}/{item.rel}", item.size, digests[item.rel]) for item in files
        ]
        # Another process's files: moved already when an earlier attempt stopped midway.
        for other in others:
            moves.append((other.rel, other.path, other.size, other.digests))
            final = f"{root}/{other.rel}"
            if not fs.exists(other.path) and locations.object_matches(
                fs, final, other.size, other.digests, read_back=False
            ):
                in_place.add(other.rel)
        # From here on the destination changes: first take its manifest away (kept in
        # staging, so that a re-run still knows which old files to remove).
        manifest_path = f"{root}/{locations.MANIFEST}"
        kept_manifest = f"{staging}/.previous-{locations.MANIFEST}"
        if _read_manifest(fs, manifest_path) is not None:
            self._make_parent(fs, kept_manifest)
            fs.mv(manifest_path, kept_manifest)
        previous = _read_manifest(fs, kept_manifest)
        for rel, source, size, digest in moves:
            if rel in in_place:
                continue
            final = f"{root}/{rel}"
            self._make_parent(fs, final)
            fs.mv(source, final)
            # Verified in staging already: a move inside the store is not downloaded again.
            if not locations.object_matches(fs, final, size, digest, read_back=False):
                raise RemoteUnreachable(
                    f"{self.url}: {rel} does not match its checksum after moving it into place",
                    "rerun the same command",
                )
            self._written()
        current = {rel for rel, *_ in moves}
        for old in (previous or {}).get("files", []):
            if old.get("path") not in current:
                with suppress(FileNotFoundError):  # already removed by an interrupted run
                    fs.rm_file(f"{root}/{old['path']}")
        manifest = {
            "format": "lmctl-manifest/1",
            "lmctl_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "files": [
                {"path": rel, "size": size, "sha256": digest.sha256}
                for rel, _, size, digest in moves
            ],
        }
        self._write_last(fs, staging, manifest_path, manifest)
        if fs.exists(staging):
            fs.rm(staging, recursive=True)
        if self.verbose:
            self.console.info(
                f"published {len(moves)} files to {self.url} ({len(uploaded)} uploaded, "
                f"{len(reused)} already verified)"
            )
        return {
            "destination": self.url,
            "manifest": f"{self.url}/{locations.MANIFEST}",
            "files": [rel for rel, *_ in moves],
            "bytes": sum(size for _, _, size, _ in moves),
            "uploaded": uploaded,
            "reused": reused,
        }

    def _write_last(
        self, fs: AbstractFileSystem, staging: str, final: str, manifest: dict[str, Any]
    ) -> None:
        """The manifest goes through staging too, so that it appears whole or not at all."""
        self.write_json(fs, final, manifest, staged=f"{staging}/{locations.MANIFEST}")

    def write_json(
        self, fs: AbstractFileSystem, path: str, data: dict[str, Any], *, staged: str = ""
    ) -> None:
        """A small JSON object that appears whole or not at all: written beside (or at
        ``staged``), then moved into place."""
        staged = staged or f"{path}.{uuid.uuid4().hex}.tmp"
        self._make_parent(fs, staged)
        fs.pipe_file(staged, (json.dumps(data, indent=2) + "\n").encode())
        self._make_parent(fs, path)
        fs.mv(staged, path)
        self._written()

    def _written(self) -> None:
        if self._progress is not None:
            self._progress()
        _WRITES[0] += 1  # counted over the process (a remote run publishes many times)
        limit = os.environ.get(KILL_AFTER_ENV)
        if limit and _WRITES[0] >= int(limit):
            os.kill(os.getpid(), signal.SIGKILL)


#: Objects this process wrote to stores (for the test hook ``LMCTL_TEST_PUSH_KILL_AFTER``).
_WRITES = [0]


def _read_manifest(fs: AbstractFileSystem, path: str) -> dict[str, Any] | None:
    try:
        with fs.open(path, "rb") as handle:
            data = json.loads(handle.read())
    except FileNotFoundError:
        return None
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}
