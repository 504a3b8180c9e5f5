"""Local and remote path rules: which strings are fsspec URLs, which local files a data path
(or glob pattern) names, a data file's extension, and where lmctl keeps its cache."""

from __future__ import annotations

import functools
import os
import re
from pathlib import Path

#: The one variable that moves lmctl's cache (prepared data, staged remote runs, fetched
#: files); the older name of the latter two is still read, with a warning.
CACHE_VARIABLE = "LMCTL_CACHE"
OLD_CACHE_VARIABLE = "LMCTL_CACHE_DIR"


def cache_root() -> Path:
    """Where lmctl keeps what it can build or fetch again: $LMCTL_CACHE, else
    ${XDG_CACHE_HOME:-~/.cache}/lmctl."""
    configured = os.environ.get(CACHE_VARIABLE)
    if not configured and os.environ.get(OLD_CACHE_VARIABLE):
        configured = os.environ[OLD_CACHE_VARIABLE]
        _say_renamed(configured)
    if configured:
        return Path(configured).expanduser()
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "lmctl"


@functools.cache
def _say_renamed(value: str) -> None:
    """Once per process (the main one): the old name still works, and what replaces it."""
    from lmctl.console import Console
    from lmctl.distributed import is_main_process

    if is_main_process():
        Console().warn(
            f"{OLD_CACHE_VARIABLE} is deprecated: set {CACHE_VARIABLE}={value} instead "
            "(one cache root for prepared data, staged runs and fetched files)"
        )


def is_remote(path: str) -> bool:
    """True for fsspec URLs such as ``s3://bucket/key``; local paths and ``file://`` are not."""
    return "://" in path and not path.startswith("file://")


def local_path(path: str) -> Path:
    return Path(path.removeprefix("file://")).expanduser()


def looks_like_path(name: str) -> bool:
    """Whether a model name is meant as a local path (``./m``, ``/abs``, ``~/m``, ``a/b/c``)
    rather than a Hub id (``gpt2``, ``org/model``)."""
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def has_glob(path: str) -> bool:
    """Whether a data path is a pattern (``data/*.txt``) naming several files."""
    return any(char in path for char in "*?[")


def matching_files(path: str) -> list[str]:
    """The local files a data path names: the file itself, or a pattern's matches in order."""
    if not has_glob(path):
        return [str(local_path(path))] if local_path(path).is_file() else []
    import glob

    pattern = str(local_path(path))
    return sorted(match for match in glob.glob(pattern, recursive=True) if Path(match).is_file())


def data_extension(path: str) -> str:
    name = path.rstrip("/").rsplit("/", 1)[-1]
    return name.rsplit(".", 1)[-1].lower() if "." in name else ""


_SCHEME = re.compile(r"^([A-Za-z][A-Za-z0-9+.-]*)://")


def url_scheme(text: str) -> str | None:
    """The protocol of a URL (``s3`` for ``s3://bucket/key``, ``file`` for ``file:///x``), or
    None for a plain path."""
    match = _SCHEME.match(text.strip())
    return match.group(1).lower() if match else None


def local_folder_problem(flag: str, value: object, instead: str) -> tuple[str, str] | None:
    """Why a folder option that lives on the local disk cannot take ``value``: a URL other
    than ``file://`` (it would otherwise be created as a local folder named after the URL).
    ``instead`` says what to do with a remote location. None when ``value`` is fine."""
    if not isinstance(value, str):
        return None
    scheme = url_scheme(value)
    if scheme is None:
        return None
    if scheme == "file":
        if value.strip()[len("file://") :].startswith("/"):
            return None
        return f"{flag} {value}: a file URL needs an absolute path", "write file:///ABSOLUTE/PATH"
    return (
        f"{flag} {value}: {scheme}:// is not supported here; {flag} takes a local directory "
        "(or file:///ABSOLUTE/PATH)",
        instead,
    )


def local_folder(value: str) -> str:
    """A local folder option as a plain path (``file:///abs`` becomes ``/abs``)."""
    return str(local_path(value)) if url_scheme(value) == "file" else value
