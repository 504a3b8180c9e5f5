"""Local and remote path rules: which strings are fsspec URLs, which local files a data path
(or glob pattern) names, and a data file's extension."""

from __future__ import annotations

from pathlib import Path


def is_remote(path: str) -> bool:
    """True for fsspec URLs such as ``s3://bucket/key``; local paths and ``file://`` are not."""
    return "://" in path and not path.startswith("file://")


def local_path(path: str) -> Path:
    return Path(path.removeprefix("file://")).expanduser()


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
