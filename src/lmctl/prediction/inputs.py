"""What ``lmctl predict`` runs the model on: the ``--prompt`` texts and the lines (or, for
multiple choice, the records) of ``--input FILE``, read and checked before any model loads."""

from __future__ import annotations

import csv
import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from lmctl.errors import ConfigError, DataError

#: File types whose lines are records (multiple choice); any other file is read as text.
RECORD_SUFFIXES = (".csv", ".json", ".jsonl")


@dataclass(frozen=True)
class Item:
    """One input: a text (a prompt, or a text with masks), or a record; ``where`` names it
    in messages (``--prompt 2``, ``prompts.txt line 7``)."""

    where: str
    text: str | None = None
    record: dict[str, Any] | None = None


def read_texts(prompts: list[str], input_file: str | None) -> list[Item]:
    """Every ``--prompt``, then every non-blank line of ``--input``."""
    items = []
    for number, prompt in enumerate(prompts, start=1):
        if not prompt.strip():
            raise ConfigError(f"--prompt {number} is empty", "give a text for the model to work on")
        items.append(Item(_prompt_name(number, len(prompts)), text=prompt))
    if input_file is not None:
        path = input_path(input_file)
        lines = _read_lines(path)
        items += [
            Item(f"{input_file} line {number}", text=line)
            for number, line in enumerate(lines, start=1)
            if line.strip()
        ]
        if len(items) == len(prompts):
            raise DataError(
                f"--input {input_file}: no text in it (every line is blank)",
                "put one prompt per line",
            )
    _require_some(items)
    return items


def read_records(prompts: list[str], input_file: str | None) -> list[Item]:
    """Multiple-choice records: each ``--prompt`` a JSON object, then the rows of a CSV file
    or the lines of a JSON-lines file given as ``--input``."""
    items = []
    for number, prompt in enumerate(prompts, start=1):
        where = _prompt_name(number, len(prompts))
        record = _json_record(
            prompt,
            where,
            "give one JSON object per --prompt, e.g. "
            '\'{"sent1": "...", "ending0": "...", "ending1": "..."}\'',
        )
        items.append(Item(where, record=record))
    if input_file is not None:
        path = input_path(input_file)
        if path.suffix.lower() not in RECORD_SUFFIXES:
            raise ConfigError(
                f"--input {input_file}: multiple choice needs records with columns, not plain text",
                "give a .csv file with a header row, or a .json/.jsonl file of JSON objects",
            )
        found = (
            _csv_records(path, input_file)
            if path.suffix.lower() == ".csv"
            else _json_records(path, input_file)
        )
        if not found:
            raise DataError(
                f"--input {input_file}: no records in it",
                "give one record per line (a row of a CSV file, or a JSON object)",
            )
        items += found
    _require_some(items)
    return items


def _prompt_name(number: int, count: int) -> str:
    return "--prompt" if count == 1 else f"--prompt {number}"


def _require_some(items: list[Item]) -> None:
    if not items:
        raise ConfigError(
            "nothing to predict: no --prompt and no --input",
            "give --prompt TEXT (repeatable) or --input FILE",
        )


def input_path(input_file: str) -> Path:
    path = Path(input_file).expanduser()
    if not path.exists():
        raise ConfigError(
            f"--input {input_file}: no such file",
            "check the path (relative paths start from the current directory)",
        )
    if not path.is_file():
        raise ConfigError(f"--input {input_file}: not a file", "give a text or records file")
    return path


def _read_lines(path: Path) -> list[str]:
    try:
        return path.read_text(encoding="utf-8").splitlines()
    except UnicodeDecodeError as exc:
        raise DataError(
            f"--input {path}: not UTF-8 text (byte {exc.start})", "save the file as UTF-8"
        ) from None
    except OSError as exc:
        raise DataError(
            f"--input {path}: cannot read it ({exc.strerror})", "check the file"
        ) from None


def _json_record(text: str, where: str, hint: str) -> dict[str, Any]:
    try:
        value = json.loads(text)
    except ValueError as exc:
        raise DataError(f"{where}: not a JSON object ({exc})", hint) from None
    if not isinstance(value, dict):
        raise DataError(f"{where}: not a JSON object", hint)
    return value


def _json_records(path: Path, name: str) -> list[Item]:
    lines = _read_lines(path)
    whole = "\n".join(lines).strip()
    if whole.startswith("["):  # a JSON array of records
        try:
            values = json.loads(whole)
        except ValueError as exc:
            raise DataError(f"--input {name}: not valid JSON ({exc})", "fix the file") from None
        hint = "give a JSON array of objects, or one JSON object per line"
        items = []
        for number, value in enumerate(values, start=1):
            if not isinstance(value, dict):
                raise DataError(f"--input {name} record {number}: not a JSON object", hint)
            items.append(Item(f"{name} record {number}", record=value))
        return items
    return [
        Item(
            f"{name} line {number}",
            record=_json_record(
                line, f"--input {name} line {number}", "put one JSON object on each line"
            ),
        )
        for number, line in enumerate(lines, start=1)
        if line.strip()
    ]


def _csv_records(path: Path, name: str) -> list[Item]:
    items = []
    try:
        with open(path, newline="", encoding="utf-8") as handle:
            reader = csv.DictReader(handle)
            for row in reader:
                if any(isinstance(value, str) and value.strip() for value in row.values()):
                    # The line where the row ends (the header is line 1).
                    items.append(Item(f"{name} line {reader.line_num}", record=dict(row)))
    except UnicodeDecodeError as exc:
        raise DataError(
            f"--input {name}: not UTF-8 text (byte {exc.start})", "save the file as UTF-8"
        ) from None
    except csv.Error as exc:
        raise DataError(
            f"--input {name}: not a readable CSV file ({exc})", "fix the file"
        ) from None
    return items
