"""One entry of ``train_sources`` or ``validation_sources``: a named source of records.

A source is a data file (any ``--train-file`` value), a Hub dataset, or a reader: a Python
generator function named ``module:function``, ``path/to/file.py:function`` or by an entry
point of the ``lmctl.sources`` group, called with ``args``. Every list-valued argument of a
reader is a shard list (see :mod:`lmctl.data.sources`); a string ``${NAME}`` in ``args`` is
read from the environment when the reader runs, and its value is a secret.

Imports nothing heavy: the config is validated before any library is loaded.
"""

from __future__ import annotations

import math
import re
from typing import Any

from pydantic import BaseModel, ConfigDict, Field, field_validator, model_validator

from lmctl.config.problems import Problems
from lmctl.config.values import DATA_EXTENSIONS
from lmctl.secrets import ENV_REFERENCE
from lmctl.storage.paths import data_extension, has_glob, local_path

#: Source names become parts of metric names (``eval_<name>_loss``) and of log lines.
SOURCE_NAME = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")


class DataSource(BaseModel):
    """A named source of training or evaluation records."""

    model_config = ConfigDict(extra="forbid", frozen=True)

    name: str = Field(
        description="Used in metric names (eval_<name>_loss) and in the log: a letter, then "
        "letters, digits or underscores.",
        pattern=SOURCE_NAME.pattern,
    )
    reader: str | None = Field(
        None,
        description="A generator function: module:function, path/to/file.py:function, or the "
        "name of an lmctl.sources entry point.",
    )
    file: str | None = Field(
        None, description="A data file: a path, a glob pattern or a storage URL."
    )
    dataset: str | None = Field(None, description="A Hub dataset (or a local dataset directory).")
    config: str | None = Field(None, description="The configuration name of 'dataset'.")
    args: dict[str, Any] = Field(
        {},
        description="Keyword arguments of the reader; list values are shard lists, '${NAME}' "
        "reads an environment variable (a secret, never written).",
    )
    weight: float | None = Field(
        None, gt=0, description="Share of the training mixture (relative to the other weights)."
    )

    @field_validator("reader")
    @classmethod
    def _absolute_reader_file(cls, value: str | None) -> str | None:
        """A reader in a .py file is recorded by its absolute path, so that the saved config
        resumes from any directory."""
        if value is None:
            return None
        module, colon, function = value.rpartition(":")
        if colon and module.endswith(".py") and local_path(module).is_file():
            return f"{local_path(module).resolve()}:{function}"
        return value

    @model_validator(mode="after")
    def _one_kind(self) -> DataSource:
        kinds = [name for name in ("reader", "file", "dataset") if getattr(self, name) is not None]
        if len(kinds) != 1:
            raise ValueError("give exactly one of reader, file or dataset")
        if self.args and self.reader is None:
            raise ValueError("args are passed to a reader; this source has none")
        if self.config is not None and self.dataset is None:
            raise ValueError("config names a configuration of 'dataset'; this source has none")
        lengths = {len(value) for value in self.args.values() if isinstance(value, list)}
        if len(lengths) > 1:
            raise ValueError(
                "the list-valued args are shard lists and must all have the same length"
            )
        return self

    @property
    def kind(self) -> str:
        return "reader" if self.reader else "file" if self.file else "dataset"

    def shown(self) -> str:
        """How the source is named in the log: its name and what it reads."""
        what = (
            self.reader
            or self.file
            or f"{self.dataset}" + (f" ({self.config})" if self.config else "")
        )
        return f"{self.name} ({self.kind} {what})"


def env_references(value: Any) -> list[str]:
    """The environment variables that ``${NAME}`` strings in ``value`` name, at any depth."""
    if isinstance(value, str):
        match = ENV_REFERENCE.match(value)
        return [match.group(1)] if match else []
    if isinstance(value, dict):
        return [name for item in value.values() for name in env_references(item)]
    if isinstance(value, (list, tuple)):
        return [name for item in value for name in env_references(item)]
    return []


#: ``--train-source``/``--validation-source`` by field, for messages.
SOURCE_FLAGS = {"train_sources": "--train-source", "validation_sources": "--validation-source"}


def flag_sources(data: Any) -> Any:
    """The shorter spellings of the command line in the config form: each string of
    ``train_sources``/``validation_sources`` (``--train-source [NAME=]VALUE``) as a source,
    and ``mix`` (``--mix 0.7,0.3``) as the weights of the training sources, in their order."""
    if not isinstance(data, dict):
        return data
    problems = Problems()
    data = dict(data)
    for field_name, flag in SOURCE_FLAGS.items():
        entries = data.get(field_name)
        if isinstance(entries, list):
            data[field_name] = [
                _source_from_text(entry, flag, problems) if isinstance(entry, str) else entry
                for entry in entries
            ]
    mix = data.pop("mix", None)
    if mix not in (None, []):
        data["train_sources"] = _mixed(mix, data.get("train_sources"), problems)
    problems.raise_if_any()
    return data


def _source_from_text(text: str, flag: str, problems: Problems) -> dict[str, Any]:
    """``[NAME=]VALUE``: VALUE is a reader (``module:function``, ``file.py:function``, an
    entry point name) or a file (a path, a pattern, a storage URL); NAME defaults to the
    function's, the entry point's or the file's name."""
    name, equals, value = text.partition("=")
    if not equals or not re.fullmatch(r"[^/:.\\]+", name):
        name, value = "", text
    module, colon, function = value.rpartition(":")
    last = value.rstrip("/").rsplit("/", 1)[-1]
    if "://" not in value and colon and module and function.isidentifier():
        kind, stem = "reader", function
    elif (
        "://" in value
        or "/" in value
        or data_extension(value) in DATA_EXTENSIONS
        or has_glob(value)
        or local_path(value).exists()
    ):
        kind, stem = "file", last.rsplit(".", 1)[0] if "." in last else last
    else:
        kind, stem = "reader", value  # the name of an lmctl.sources entry point
    name = name or re.sub(r"[^A-Za-z0-9_]+", "_", stem).strip("_")
    if not SOURCE_NAME.match(name):
        problems.add(
            f"{flag} {text}: '{name}' cannot name a source (a letter, then letters, digits or "
            "underscores)",
            f"name it: {flag} NAME={value}",
        )
    return {"name": name, kind: value}


def _mixed(mix: Any, sources: Any, problems: Problems) -> Any:
    """``sources`` with the weights of ``mix`` (numbers, or comma-separated text)."""
    texts = [mix] if isinstance(mix, (str, int, float)) else list(mix)
    parts = [part.strip() for text in texts for part in str(text).split(",")]
    shown = ",".join(parts)
    try:
        weights = [float(part) for part in parts]
    except ValueError:
        weights = []
    if not weights or not all(math.isfinite(weight) and weight > 0 for weight in weights):
        problems.add(f"--mix {shown}: weights must be positive numbers", "e.g. --mix 0.7,0.3")
        return sources
    count = len(sources) if isinstance(sources, list) else 0
    if len(weights) != count:
        given = f"{len(weights)} weight" + ("s" if len(weights) > 1 else "")
        problems.add(
            f"--mix {shown}: {given} for {count or 'no'} training sources",
            "give one weight per --train-source (or train_sources entry), in their order",
        )
        return sources
    return [
        entry.model_copy(update={"weight": weight})
        if isinstance(entry, DataSource)
        else {**entry, "weight": weight}
        if isinstance(entry, dict)
        else entry
        for entry, weight in zip(sources, weights, strict=True)
    ]
