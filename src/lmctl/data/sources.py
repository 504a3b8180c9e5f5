"""Named sources of records (``train_sources``, ``validation_sources``): readers, files and Hub
datasets, mixed by weight for training and kept apart for evaluation.

A reader is the user's generator function. It is called as ``datasets`` calls the generator
of ``from_generator``: every list-valued argument is a shard list, scalars are bound for every
call. lmctl calls it once per shard (each list argument cut to the one item of that shard), so
that an error names the shard it happened in. A stream makes each item of the shard lists
one shard of its own (:func:`lmctl.data.stream.sources.reader_source`), which the training
stream shares between the distributed ranks and their dataloader workers, so that no two
readers get the same shard and none is missed. ``${NAME}`` strings in the
arguments are read from the environment only when the reader runs, in the process that runs
it, and registered as secrets: the value is never in the config, the log, the card or the
cache keys.

A map-style run reads a reader into a ``Dataset`` (:func:`reader_dataset`). ``datasets``
caches it only when the reader declares a version (a ``version`` attribute of the function):
lmctl cannot tell whether a table changed, so without one it reads the reader again each run
(into a temporary folder) and says so. A stream reads a reader one shard at a time
(:func:`read_shards`), which a resumed stream starts again at a record count of a shard.
Several training sources are mixed by :mod:`lmctl.data.mixture` (into a ``Dataset``) or
:mod:`lmctl.data.stream.mixture` (as a stream).
"""

from __future__ import annotations

import atexit
import inspect
import os
import shutil
import tempfile
import uuid
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from importlib.metadata import entry_points
from typing import TYPE_CHECKING, Any

from lmctl import secrets
from lmctl.config.sources import env_references
from lmctl.errors import ConfigError, DataError, LmctlError
from lmctl.secrets import ENV_REFERENCE

if TYPE_CHECKING:
    from datasets import Dataset

    from lmctl.config.slices import DataSpec
    from lmctl.config.sources import DataSource

ENTRY_POINT_GROUP = "lmctl.sources"
#: How much of a record a message quotes.
QUOTED_CHARS = 200


@dataclass(frozen=True)
class Reader:
    """A source's generator function, resolved and checked against its arguments."""

    name: str
    where: str
    function: Callable[..., Any]
    #: The arguments as the config gives them (``${NAME}`` unresolved).
    args: dict[str, Any] = field(default_factory=dict)

    @property
    def version(self) -> str | None:
        value = getattr(self.function, "version", None)
        return None if value is None else str(value)

    @property
    def shard_args(self) -> dict[str, list[Any]]:
        return {key: value for key, value in self.args.items() if isinstance(value, list)}

    @property
    def bound_args(self) -> dict[str, Any]:
        return {key: value for key, value in self.args.items() if not isinstance(value, list)}

    def shards(self) -> list[dict[str, list[Any]]]:
        """The shard arguments of each of the reader's shards (see :func:`shard_calls`)."""
        return shard_calls(self.shard_args)

    def identity(self) -> dict[str, Any] | None:
        """What the reader reads, for cache keys: None when it declares no version."""
        version = self.version
        if version is None:
            return None
        module = getattr(self.function, "__module__", "")
        qualified = getattr(self.function, "__qualname__", repr(self.function))
        return {"reader": f"{module}:{qualified}", "version": version, "args": self.args}


def shard_calls(lists: dict[str, list[Any]]) -> list[dict[str, list[Any]]]:
    """One call's arguments per shard: each shard list cut to its item of that shard (the
    lists are zipped, as ``datasets`` splits them); one call without shard arguments when
    there are no lists."""
    count = min((len(values) for values in lists.values()), default=1)
    return [{key: values[i : i + 1] for key, values in lists.items()} for i in range(count)]


def resolve_reader(source: DataSource, where: str) -> Reader:
    """Import the reader of ``source`` and check its arguments against its signature (a
    ConfigError, exit 2, before any data is read)."""
    assert source.reader is not None
    function = _import_reader(source.reader, where)
    try:
        signature = inspect.signature(function)
    except (TypeError, ValueError):
        signature = None
    if signature is not None:
        try:
            signature.bind(**source.args)
        except TypeError as exc:
            accepted = ", ".join(signature.parameters) or "none"
            raise ConfigError(
                f"{where}: the args do not fit {source.reader}{signature} ({exc})",
                f"give the arguments it takes (its parameters: {accepted})",
            ) from None
    missing = sorted({name for name in env_references(source.args) if name not in os.environ})
    if missing:
        raise ConfigError(
            f"{where}.args: environment variable {', '.join(missing)} is not set",
            f"export {missing[0]}=... before the run (its value is never written)",
        )
    return Reader(source.name, where, function, dict(source.args))


def _import_reader(name: str, where: str) -> Callable[..., Any]:
    from lmctl.models.plugins import import_user_module

    module_name, _, attribute = name.rpartition(":")
    if not module_name:
        return _entry_point_reader(name, where)
    try:
        module = import_user_module(module_name, where=f"{where}.reader {name}")
    except LmctlError as exc:
        raise ConfigError(exc.message, exc.hint) from None
    function = getattr(module, attribute, None)
    if not callable(function):
        raise ConfigError(
            f"{where}.reader {name}: {module_name} has no function '{attribute}'",
            "name a generator function defined in that module",
        )
    return function


def _entry_point_reader(name: str, where: str) -> Callable[..., Any]:
    found = [point for point in entry_points(group=ENTRY_POINT_GROUP) if point.name == name]
    if not found:
        raise ConfigError(
            f"{where}.reader {name}: no entry point of that name in the group {ENTRY_POINT_GROUP}",
            "write module:function or path/to/file.py:function, or install the package "
            "that declares it",
        )
    try:
        function = found[0].load()
    except Exception as exc:
        raise ConfigError(
            f"{where}.reader {name}: importing {found[0].value} failed "
            f"({type(exc).__name__}: {str(exc)[:200]})",
            "fix the package that declares it (LMCTL_DEBUG=1 shows the traceback)",
        ) from exc
    if not callable(function):
        raise ConfigError(f"{where}.reader {name}: {found[0].value} is not a function", "fix it")
    return function


def resolved(value: Any) -> Any:
    """``value`` with every ``${NAME}`` string read from the environment (and registered as a
    secret, so that no printed line shows it)."""
    if isinstance(value, str):
        match = ENV_REFERENCE.match(value)
        if match is None:
            return value
        secret = os.environ.get(match.group(1))
        if secret is None:
            raise ConfigError(
                f"environment variable {match.group(1)} is not set",
                f"export {match.group(1)}=... before the run",
            )
        secrets.register(secret)
        return secret
    if isinstance(value, dict):
        return {key: resolved(item) for key, item in value.items()}
    if isinstance(value, list):
        return [resolved(item) for item in value]
    return value


def read_shards(reader: Reader, **shards: list[Any]) -> Iterator[dict[str, Any]]:
    """The records of ``shards`` (the shard lists ``datasets`` gave this reader), one shard
    at a time; each record checked to be a mapping with the columns of the first."""
    bound = resolved(reader.bound_args)
    columns: list[str] | None = None
    for one in shard_calls(shards):
        shown = ", ".join(f"{key}={values}" for key, values in one.items()) or "its one call"
        try:
            records = reader.function(**bound, **resolved(one))
            for record in records:
                columns = _checked(record, columns, reader, shown)
                yield record
        except LmctlError:
            raise
        except Exception as exc:
            detail = secrets.mask_text(str(exc).strip().splitlines()[0][:300]) if str(exc) else ""
            raise DataError(
                f"{reader.where}: the reader {reader.name} raised on shard {shown}: "
                f"{type(exc).__name__}" + (f": {detail}" if detail else ""),
                "fix the reader or its data (LMCTL_DEBUG=1 shows the traceback)",
            ) from exc


def _checked(record: Any, columns: list[str] | None, reader: Reader, shard: str) -> list[str]:
    if not isinstance(record, dict):
        raise DataError(
            f"{reader.where}: the reader yielded a {type(record).__name__}, not a record "
            f"(shard {shard}): {_quoted(record)}",
            'yield dicts, e.g. {"text": "..."}',
        )
    if columns is None:
        return list(record)
    missing = [name for name in columns if name not in record]
    if missing:
        raise DataError(
            f"{reader.where}: a record without column {', '.join(repr(m) for m in missing)} "
            f"(shard {shard}): {_quoted(record)}",
            f"every record needs the columns of the first: {', '.join(columns)}",
        )
    return columns


def _quoted(record: Any) -> str:
    text = secrets.mask_text(repr(record))
    return text if len(text) <= QUOTED_CHARS else text[:QUOTED_CHARS] + "..."


def reader_dataset(reader: Reader, console_note: Callable[[str], None]) -> Dataset:
    """The reader's records as a map-style ``Dataset``: cached by ``datasets`` under the
    reader's version, else read again into a folder of this run."""
    import datasets

    identity = reader.identity()
    kwargs: dict[str, Any] = {}
    if identity is None:
        console_note(
            f"source {reader.name}: the reader declares no version, so it is read again each "
            "run and its data is not cached (set a 'version' attribute on the function to "
            "cache it)"
        )
        kwargs["cache_dir"] = run_folder()
        kwargs["fingerprint"] = uuid.uuid4().hex
    else:
        from lmctl.data.load import fingerprint

        kwargs["fingerprint"] = fingerprint("reader", identity)
    try:
        return datasets.Dataset.from_generator(
            read_shards, gen_kwargs={"reader": reader, **reader.shard_args}, **kwargs
        )
    except Exception as exc:
        raise _unwrapped(exc, reader) from exc


def _unwrapped(exc: BaseException, reader: Reader) -> LmctlError:
    """The lmctl error inside a ``datasets`` generation error, or one naming the reader."""
    cause: BaseException | None = exc
    while cause is not None:
        if isinstance(cause, LmctlError):
            return cause
        cause = cause.__cause__ or cause.__context__
    return DataError(
        f"{reader.where}: reading {reader.name} failed ({type(exc).__name__}: "
        f"{secrets.mask_text(str(exc))[:300]})",
        "check that the reader yields records of one shape (LMCTL_DEBUG=1 shows the traceback)",
    )


_folders: list[str] = []


def run_folder() -> str:
    """A folder for data that this process reads and nothing may reuse; removed at exit."""
    folder = tempfile.mkdtemp(prefix="lmctl-reader-")
    if not _folders:
        atexit.register(_remove_folders)
    _folders.append(folder)
    return folder


def _remove_folders() -> None:
    for folder in _folders:
        shutil.rmtree(folder, ignore_errors=True)


def source_where(field_name: str, index: int, source: DataSource) -> str:
    return f"{field_name}[{index}] ({source.name})"


def is_cacheable(source: DataSource, where: str) -> bool:
    """Whether the records of ``source`` can be keyed without reading them: a file, a Hub
    dataset, or a reader that declares a version."""
    if source.reader is None:
        return True
    return getattr(_import_reader(source.reader, where), "version", None) is not None


def source_splits(data: DataSpec) -> dict[str, list[DataSource]]:
    """The sources whose records make up each split of a run with named sources."""
    out: dict[str, list[DataSource]] = {}
    if data.train_sources:
        out["train"] = list(data.train_sources)
        if not data.validation_sources and data.validation_file is None:
            out["validation"] = list(data.train_sources)  # the held-out part of the mixture
    if data.validation_sources:
        out["validation"] = list(data.validation_sources)
        for source in data.validation_sources:
            out[f"validation_{source.name}"] = [source]
    return out


def sources_identity(data: DataSpec, split: str) -> dict[str, Any] | None:
    """What the named sources of ``split`` are, for the prepared-data cache: each source as
    configured (a file with its identity), or None when a reader among them declares no
    version (it is prepared again each run). Returns {} for a split without named sources."""
    sources = source_splits(data).get(split)
    if sources is None:
        return {}
    described = []
    for source in sources:
        if not is_cacheable(source, f"source {source.name}"):
            return None
        entry: dict[str, Any] = source.model_dump(exclude_none=True)
        if source.reader is not None:
            function = _import_reader(source.reader, f"source {source.name}")
            entry["version"] = str(function.version)  # type: ignore[attr-defined]
        described.append(entry)
    return {"sources": described, "stopping_strategy": data.mix_stopping_strategy}
