"""Models and data outside the local disk: the Hugging Face Hub and fsspec object stores.

A location is a local path, ``file:///abs/path``, ``hf://NAMESPACE/REPO`` (the Hub) or any
fsspec URL (``s3://bucket/prefix``, ``gs://``, ``oss://``, ``hdfs://``, ...). Protocol
packages are optional extras; a missing one is reported with the extra to install. Any
filesystem registered with fsspec (``fsspec.register_implementation``) works here too.

Remote reads go through :func:`localize`, which fetches a file or a model directory into a
local cache keyed by the URL and checks each object's etag (or modification time) and size,
so a second run does not download again. Credentials come from the provider's usual places
(environment variables, its config files, instance roles) and fsspec's own configuration
(``FSSPEC_<PROTOCOL>_<OPTION>`` variables); lmctl never takes them from the URL.

This module is light: fsspec and the protocol packages are imported only when used.
"""

from __future__ import annotations

import hashlib
import json
import os
import re
from collections.abc import Callable
from dataclasses import dataclass
from functools import cache
from pathlib import Path
from typing import TYPE_CHECKING, Any
from urllib.parse import urlsplit

from lmctl import install_hint
from lmctl.errors import ConfigError, LmctlError, PermissionDenied, RemoteUnreachable
from lmctl.storage import hub
from lmctl.storage.paths import cache_root, is_remote, local_path, url_scheme

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

HUB_PROTOCOL = "hf"
MANIFEST = "lmctl-manifest.json"

#: protocol -> (lmctl extra, package that provides it)
EXTRAS: dict[str, tuple[str, str]] = {
    "s3": ("s3", "s3fs"),
    "s3a": ("s3", "s3fs"),
    "gs": ("gcs", "gcsfs"),
    "gcs": ("gcs", "gcsfs"),
    "oss": ("oss", "ossfs"),
    "hdfs": ("hdfs", "pyarrow"),
}
#: Stores with a flat key space: no directories to create, and creating one may create a bucket.
OBJECT_STORES = frozenset({"s3", "s3a", "gs", "gcs", "oss", "az", "abfs", "abfss"})
_BUCKETED = frozenset({"s3", "s3a", "gs", "gcs", "oss"})
_URL = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://(.*)$")
_BUCKET = re.compile(r"^[a-z0-9][a-z0-9._-]{1,220}[a-z0-9]$")
_HUB_NAME = re.compile(r"^[A-Za-z0-9][A-Za-z0-9._-]{0,95}$")
_HINT_FORMS = "write it as hf://NAMESPACE/REPO, s3://BUCKET/PREFIX, gs://..., oss://..., "
_HINT_FORMS += "hdfs://... or file:///ABSOLUTE/PATH"
# Connection errors of botocore, aiohttp and fsspec that mean "could not reach the endpoint".
_NETWORK_ERRORS = frozenset(
    {
        "EndpointConnectionError",
        "ConnectTimeoutError",
        "ConnectionClosedError",
        "ClientConnectorError",
        "ServerTimeoutError",
        "FSTimeoutError",
    }
)


@dataclass(frozen=True)
class Location:
    """A parsed remote location; ``path`` is the part after ``protocol://``, no trailing slash."""

    url: str
    protocol: str
    path: str

    @property
    def is_hub(self) -> bool:
        return self.protocol == HUB_PROTOCOL

    @property
    def repo_id(self) -> str:
        return self.path


def parse_location(text: str, flag: str, *, destination: bool = True) -> Location:
    """Check the shape of a URL without touching the network.

    A Hub destination is a repository (``hf://NAMESPACE/REPO``); a Hub source may be any file
    path that ``huggingface_hub``'s filesystem understands. Raises :class:`ConfigError`
    (exit 2) naming ``flag`` for a malformed URL.
    """
    match = _URL.match(text.strip())
    if not match:
        raise ConfigError(f"{flag} {text!r}: not a URL (no protocol://)", _HINT_FORMS)
    protocol, rest = match.group(1).lower(), match.group(2)
    if protocol == "file":
        if not rest.startswith("/"):
            raise ConfigError(
                f"{flag} {text}: a file URL needs an absolute path", "write file:///ABSOLUTE/PATH"
            )
        return Location(text, protocol, rest.rstrip("/") or "/")
    if urlsplit(text).password is not None:
        raise ConfigError(
            f"{flag}: credentials in the URL are not accepted",
            "remove them from the URL; use the provider's environment variables or config files",
        )
    path = rest.rstrip("/")
    segments = path.split("/") if path else []
    if not segments or any(part in ("", ".", "..") for part in segments[1:]):
        raise ConfigError(f"{flag} {text}: empty or malformed path", _HINT_FORMS)
    if protocol == HUB_PROTOCOL and destination:
        if len(segments) != 2 or not all(_HUB_NAME.match(part) for part in segments):
            raise ConfigError(
                f"{flag} {text}: a Hub destination is hf://NAMESPACE/REPO",
                "e.g. hf://my-user/my-model (letters, digits, '-', '_' and '.')",
            )
        if any("--" in part or ".." in part for part in segments):
            raise ConfigError(
                f"{flag} {text}: '--' and '..' are not allowed in Hub repository names",
                "choose another repository name",
            )
    elif protocol in _BUCKETED and not _BUCKET.match(segments[0]):
        raise ConfigError(
            f"{flag} {text}: '{segments[0]}' is not a valid bucket name",
            "bucket names are 3-63 lowercase letters, digits, '.', '-' (and '_' on GCS)",
        )
    return Location(text, protocol, path)


def filesystem_class(protocol: str, where: str) -> type[AbstractFileSystem]:
    """The fsspec filesystem for ``protocol``; a missing package names the extra to install."""
    import fsspec

    try:
        return fsspec.get_filesystem_class(protocol)
    except ImportError as exc:
        extra, package = EXTRAS.get(protocol, (None, None))
        install = install_hint(extra) if extra else "install its fsspec package"
        raise ConfigError(
            f"{where}: {protocol}:// needs the {package or 'protocol'} package, which is not "
            "installed",
            f"{install} (or pip install {package})" if package else install,
        ) from exc
    except ValueError as exc:
        raise ConfigError(
            f"{where}: unknown storage protocol '{protocol}://'",
            "use hf://, s3://, gs://, oss://, hdfs:// or file:///, or register an fsspec "
            "filesystem for it (fsspec.register_implementation)",
        ) from exc


#: Bounds of every S3 request (botocore's defaults, retried under s3fs's retries, let one take
#: half an hour): the read timeout starts once a body is sent, so a 50 MB part on a slow link
#: is not cut short; callers retry whole uploads within their own budget (lmctl.mirror).
CONNECT_TIMEOUT = 10
READ_TIMEOUT = 60
S3FS_RETRIES = 3


def _request_options(protocol: str, *, fail_fast: bool) -> dict[str, Any]:
    """Storage options that bound each request (fsspec's configuration wins over them);
    ``fail_fast``: a first probe that fails in seconds instead of retrying."""
    if protocol not in ("s3", "s3a"):
        return {}
    import fsspec.config

    configured = dict(fsspec.config.conf.get(protocol, {}).get("config_kwargs", {}))
    bounds: dict[str, Any] = {
        "connect_timeout": CONNECT_TIMEOUT,
        "read_timeout": READ_TIMEOUT,
        "retries": {"max_attempts": 1, "mode": "standard"},
    }
    probe = {"connect_timeout": 5, "retries": bounds["retries"]} if fail_fast else {}
    return {"config_kwargs": {**bounds, **configured, **probe}}


def open_location(location: Location, *, fail_fast: bool = False) -> tuple[AbstractFileSystem, str]:
    """The filesystem and the root path inside it for an fsspec location; every request to it
    has a bounded time (:data:`CONNECT_TIMEOUT`, :data:`READ_TIMEOUT`)."""
    from fsspec.core import url_to_fs

    filesystem_class(location.protocol, location.url)
    options = _request_options(location.protocol, fail_fast=fail_fast)
    if fail_fast:
        options["skip_instance_cache"] = True
    try:
        fs, root = url_to_fs(location.url, **options)
    except Exception as exc:
        raise failure(exc, location.url) from exc
    if _is_s3(fs):
        fs.retries = S3FS_RETRIES
    return fs, root.rstrip("/") or "/"


def failure(exc: BaseException, where: str) -> LmctlError:
    """Turn a storage exception into lmctl's error with its exit code; re-raise unknown ones."""
    if isinstance(exc, LmctlError):
        return exc
    detail = _first_line(exc)
    if _is_network_error(exc):
        return RemoteUnreachable(
            f"{where}: the storage endpoint could not be reached ({detail})",
            "check the network and the endpoint setting (e.g. AWS_ENDPOINT_URL), then rerun; "
            "an interrupted push resumes where it stopped",
        )
    names = _chain_names(exc)
    if isinstance(exc, PermissionError) or names & {
        "NoCredentialsError",
        "PartialCredentialsError",
        "CredentialRetrievalError",
        "DefaultCredentialsError",
    }:
        return PermissionDenied(
            f"{where}: permission denied or credentials rejected ({detail})",
            "check the credentials (provider environment variables or config files) and that "
            "they allow this operation here",
        )
    if isinstance(exc, FileNotFoundError):
        return ConfigError(
            f"{where}: not found ({detail})", "check the bucket and path; buckets must exist"
        )
    if isinstance(exc, (NotADirectoryError, IsADirectoryError, FileExistsError)):
        return ConfigError(
            f"{where}: a file is in the way ({detail})",
            "choose a destination whose parent folders are folders, not files",
        )
    raise exc


def _is_network_error(exc: BaseException) -> bool:
    return hub.is_connection_error(exc) or bool(_chain_names(exc) & _NETWORK_ERRORS)


def _chain_names(exc: BaseException) -> set[str]:
    names: set[str] = set()
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        names.update(cls.__name__ for cls in type(current).__mro__)
        current = current.__cause__ or current.__context__
    return names


def _first_line(exc: BaseException) -> str:
    lines = str(exc).strip().splitlines()
    return lines[0][:200] if lines else type(exc).__name__


# Checksums ------------------------------------------------------------------------------


class Digests:
    """A file's SHA-256, and its MD5 once a store that keeps MD5s (GCS) asks for it: the
    others never do, and MD5 takes about twice the SHA-256's time (0.18 against 0.09 s of
    CPU for a 133 MB checkpoint here), which an upload beside training takes from it."""

    __slots__ = ("_md5", "path", "sha256")

    def __init__(self, sha256: str, md5: str | None = None, path: Path | None = None) -> None:
        self.sha256 = sha256
        self._md5 = md5
        #: The local file, read again for an MD5 asked for later (None: none can be).
        self.path = path

    @property
    def md5(self) -> str | None:
        """The MD5, computed on first use where the local file is known, else None."""
        if self._md5 is None and self.path is not None:
            self._md5 = _hexdigest(self.path, "md5")
        return self._md5

    @property
    def known_md5(self) -> str | None:
        """The MD5 if it was computed or given, without computing it."""
        return self._md5


def _hexdigest(path: Path, algorithm: str) -> str:
    digest = hashlib.new(algorithm, usedforsecurity=False)
    with open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            digest.update(chunk)
    return digest.hexdigest()


def file_digests(path: Path) -> Digests:
    return Digests(_hexdigest(path, "sha256"), path=path)


#: Part size of S3 uploads: a file under twice this goes up in one request, with its SHA-256.
UPLOAD_CHUNK = 50 * 2**20
#: The slowest upload (bytes a second) still waited for: the read timeout starts once a
#: request's body is sent, so a store that stops reading would hold an upload for ever.
SLOWEST_UPLOAD = 2**18


def _is_s3(fs: AbstractFileSystem) -> bool:
    protocols = fs.protocol if isinstance(fs.protocol, (tuple, list)) else (fs.protocol,)
    return any(name in ("s3", "s3a") for name in protocols)


def upload(
    fs: AbstractFileSystem,
    local: Path,
    remote: str,
    size: int,
    *,
    progress: Callable[[], None] | None = None,
) -> None:
    """Upload one file. On S3 a file sent in one request carries its SHA-256: the store checks
    it on receipt and reports it back (``ChecksumSHA256``), so verifying needs no read-back.
    ``progress`` is called as the store takes each part of the file."""
    options: dict[str, Any] = {}
    if progress is not None:
        from fsspec.callbacks import Callback

        # fsspec calls each hook whenever the transferred size is updated.
        options["callback"] = Callback(hooks={"progress": lambda *_, **__: progress()})
    if getattr(fs, "async_impl", False):  # fsspec cancels the upload past this
        options["timeout"] = READ_TIMEOUT + size / SLOWEST_UPLOAD
    if _is_s3(fs) and size < 2 * UPLOAD_CHUNK:
        options.update(chunksize=UPLOAD_CHUNK, ChecksumAlgorithm="SHA256")
    fs.put_file(str(local), remote, **options)


def stored_sha256(fs: AbstractFileSystem, path: str) -> str | None:
    """The object's SHA-256 as the store guarantees it: S3's full-object ``ChecksumSHA256``.

    None where the store keeps none (other stores, multipart uploads, whose checksum is one
    of the parts' checksums). ETags are never taken for checksums: with SSE-KMS or SSE-C
    encryption, and for multipart uploads, an S3 ETag is not the content's MD5.
    """
    if not _is_s3(fs):
        return None
    bucket, key, version = fs.split_path(path)
    head = fs.call_s3(
        "head_object",
        Bucket=bucket,
        Key=key,
        ChecksumMode="ENABLED",
        **({"VersionId": version} if version else {}),
    )
    value = head.get("ChecksumSHA256")
    if not isinstance(value, str) or "-" in value or head.get("ChecksumType") == "COMPOSITE":
        return None
    import base64

    return base64.b64decode(value).hex()


def stored_md5(info: dict[str, Any]) -> str | None:
    """The object's MD5 where the store guarantees one (GCS ``md5Hash``; composite GCS objects
    have none)."""
    md5_b64 = info.get("md5Hash")
    if isinstance(md5_b64, str):
        import base64

        try:
            return base64.b64decode(md5_b64).hex()
        except ValueError:
            return None
    return None


def remote_sha256(fs: AbstractFileSystem, path: str) -> str:
    """Read the object back and hash it."""
    sha = hashlib.sha256()
    with fs.open(path, "rb") as handle:
        while chunk := handle.read(1 << 20):
            sha.update(chunk)
    return sha.hexdigest()


def object_matches(
    fs: AbstractFileSystem, path: str, size: int, digests: Digests, *, read_back: bool = True
) -> bool:
    """Whether ``path`` holds exactly this content: its size, then the checksum the store
    guarantees (S3 SHA-256, GCS MD5) or, where it keeps none, one read-back SHA-256.

    ``read_back=False`` (an object moved inside the store after it was verified) checks the
    size and any stored checksum, but does not download the object again.
    """
    fs.invalidate_cache(path)
    try:
        info = fs.info(path)
    except FileNotFoundError:
        return False
    if info.get("type") != "file" or info.get("size") != size:
        return False
    sha256 = stored_sha256(fs, path)
    if sha256 is not None:
        return sha256 == digests.sha256
    md5 = stored_md5(info)
    if md5 is not None and digests.md5 is not None:
        return md5 == digests.md5
    if not read_back:
        return True
    return remote_sha256(fs, path) == digests.sha256


# Remote reads ---------------------------------------------------------------------------


_RECORD = ".lmctl-remote.json"
_CHECKPOINT_DIR = re.compile(r"(^|/)checkpoint-\d+/")


def localize(location: str, flag: str | None = None) -> Path:
    """A local path for ``location``; remote files and model directories are fetched first.

    Local paths (and ``file://`` URLs) come back unchanged. A remote directory is fetched
    whole (``checkpoint-*`` folders are skipped); when it holds an ``lmctl-manifest.json``
    (written by ``lmctl push``), only the files it lists are fetched and each one's SHA-256 is
    checked. Fetched files live under ``cache_root()/remote/<hash of the URL>/`` and are
    fetched again only when their etag (or modification time) or size changed.
    """
    if not is_remote(location):
        return local_path(location)
    return _localize_remote(location.rstrip("/"), flag or location)


@cache
def _localize_remote(url: str, where: str) -> Path:
    location = parse_location(url, where, destination=False)
    if location.is_hub:
        hub.require_hub(where)
    fs, root = open_location(location)
    try:
        wanted, is_dir = _remote_listing(fs, root, url)
    except Exception as exc:
        raise failure(exc, where) from exc
    target = cache_root() / "remote" / hashlib.sha256(url.encode()).hexdigest()[:24]
    target.mkdir(parents=True, exist_ok=True)
    record_path = target / _RECORD
    try:
        record = json.loads(record_path.read_text())
    except (OSError, ValueError):
        record = {}
    known: dict[str, Any] = record.get("files", {}) if record.get("url") == url else {}
    files: dict[str, Any] = {}
    for rel, (remote_path, identity, sha256) in wanted.items():
        local = target / rel
        if known.get(rel) == identity and identity.get("version") and local.is_file():
            files[rel] = identity
            continue
        try:
            download_file(fs, remote_path, local, sha256, where)
        except Exception as exc:
            raise failure(exc, where) from exc
        files[rel] = identity
    tmp = record_path.with_name(f"{_RECORD}.{os.getpid()}.tmp")
    tmp.write_text(json.dumps({"url": url, "files": files}, indent=1, sort_keys=True))
    os.replace(tmp, record_path)
    if is_dir:
        return target
    return target / next(iter(wanted))


def _remote_listing(
    fs: AbstractFileSystem, root: str, url: str
) -> tuple[dict[str, tuple[str, dict[str, Any], str | None]], bool]:
    """``{relative path: (remote path, identity, expected sha256)}`` and whether it is a dir."""
    info = fs.info(root)
    if info.get("type") != "directory":
        return {root.rsplit("/", 1)[-1]: (root, _identity(info), None)}, False
    found = fs.find(root, detail=True)
    prefix = root.rstrip("/") + "/"
    entries = {
        name[len(prefix) :]: detail
        for name, detail in found.items()
        if name.startswith(prefix) and detail.get("type") == "file"
    }
    manifest = None
    if MANIFEST in entries:
        with fs.open(prefix + MANIFEST, "rb") as handle:
            manifest = json.loads(handle.read())
    if manifest is not None:
        listed = {item["path"]: item.get("sha256") for item in manifest.get("files", [])}
    else:
        listed = {
            rel: None
            for rel in entries
            if not _CHECKPOINT_DIR.search(rel) and not rel.split("/")[-1].startswith(".")
        }
    missing = sorted(rel for rel in listed if rel not in entries)
    if missing:
        raise MissingObjects(url, missing)
    if not listed:
        raise ConfigError(f"{root}: the directory is empty", "check the URL")
    wanted = {
        rel: (prefix + rel, _identity(entries[rel]), sha256) for rel, sha256 in listed.items()
    }
    return wanted, True


class MissingObjects(ConfigError):
    """Objects a manifest lists, gone from the store (a lifecycle rule, a hand), by URL."""

    def __init__(self, where: str, paths: list[str]) -> None:
        base = where.rstrip("/")
        self.urls = [f"{base}/{path}" for path in paths]
        more = f" and {len(paths) - 5} more" if len(paths) > 5 else ""
        super().__init__(
            f"{', '.join(self.urls[:5])}{more}: listed in {base}/{MANIFEST} but not in the store",
            "the object was deleted from the store; restore it (a versioned bucket keeps old "
            "versions) or write it again: 'lmctl push' for a model, 'lmctl resume RUN_URL "
            "--max-steps N' for a run's final model",
        )


def _identity(info: dict[str, Any]) -> dict[str, Any]:
    """What tells a changed object apart: its size and its etag or modification time."""
    version = None
    for key in ("ETag", "etag", "md5Hash", "mtime", "LastModified", "last_modified", "updated"):
        if info.get(key) is not None:
            version = str(info[key])
            break
    return {"size": info.get("size"), "version": version}


def download_file(
    fs: AbstractFileSystem, remote: str, local: Path, sha256: str | None, where: str
) -> None:
    local.parent.mkdir(parents=True, exist_ok=True)
    tmp = local.with_name(f".{local.name}.{os.getpid()}.part")
    try:
        fs.get_file(remote, str(tmp))
        if sha256 is not None:
            got = file_digests(tmp).sha256
            if got != sha256:
                raise RemoteUnreachable(
                    f"{where}: {remote} does not match its checksum in {MANIFEST}",
                    "the object changed or was damaged in transit; rerun, or push it again",
                )
        os.replace(tmp, local)
    finally:
        if tmp.exists():
            tmp.unlink()


def forget_fetched() -> None:
    """Check remote objects again on the next :func:`localize` (the on-disk cache stays)."""
    _localize_remote.cache_clear()


# Run directories ------------------------------------------------------------------------


def run_location_problem(flag: str, value: object) -> tuple[str, str] | None:
    """Why ``value`` cannot be a run directory (``--output-dir``), or None.

    A plain path is a local run directory; ``file:///abs`` and any fsspec store but the Hub
    are remote run directories (see :mod:`lmctl.mirror`). A URL is never taken for a local
    path (``s3://b/r`` would otherwise become a folder named ``s3:``). Nothing is contacted.
    """
    if not isinstance(value, str) or url_scheme(value) is None:
        return None
    try:
        location = parse_location(value, flag, destination=False)
        if location.is_hub:
            raise ConfigError(
                f"{flag} {value}: the Hugging Face Hub cannot hold a run directory (its "
                "commits cannot publish a checkpoint atomically)",
                "write the run to a local folder or a bucket (s3://, gs://, file://) and "
                "publish the model with --push-to hf://NAMESPACE/REPO",
            )
        filesystem_class(location.protocol, f"{flag} {value}")
    except ConfigError as exc:
        return exc.message, exc.hint or ""
    return None


def run_staging_dir(url: str, node: int = 0, nodes: int = 1) -> Path:
    """Where a remote run directory is written before it is uploaded, by default: one folder
    per URL in the cache, so that a resume on the same machine finds it again; on several
    machines (``node``: this machine's rank of ``nodes``) one per machine, so that machines
    that share a disk, or several on one host, keep their copies apart."""
    name = url.rstrip("/").rsplit("/", 1)[-1] or "run"
    digest = hashlib.sha256(url.rstrip("/").encode()).hexdigest()[:12]
    machine = f"-node{node}" if nodes > 1 else ""
    return cache_root() / "runs" / f"{name}-{digest}{machine}"
