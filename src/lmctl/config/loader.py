"""Merging config sources: defaults < config file < flags actually given on the command line.

Everything here is light: reading a config and reporting its errors never imports torch,
transformers or datasets.
"""

from __future__ import annotations

import difflib
import json
import re
import sys
from pathlib import Path
from typing import Any, TypeVar

from pydantic import ValidationError

from lmctl import secrets
from lmctl.config.base import ConfigProblems, StrictModel, TrainConfig
from lmctl.config.fields import field_extra, flag_name
from lmctl.config.upstream import translate_upstream
from lmctl.errors import ConfigError

ConfigT = TypeVar("ConfigT", bound=StrictModel)

CONFIG_SUFFIXES = (".yaml", ".yml", ".json", ".toml")


def read_config_file(path: str, model: type[StrictModel] | None = None) -> dict[str, Any]:
    """Parse a YAML, JSON or TOML config file into a flat mapping; with ``model``, a key
    spelled as one of its flags' aliases is read as that field (see :func:`_field_keys`)."""
    file = Path(path).expanduser()
    suffix = file.suffix.lower()
    if suffix not in CONFIG_SUFFIXES:
        raise ConfigError(
            f"--config {path}: unsupported config file type '{suffix or '(none)'}'",
            "use a .yaml, .yml, .json or .toml file",
        )
    try:
        text = file.read_text(encoding="utf-8")
    except FileNotFoundError:
        raise ConfigError(f"--config {path}: no such file", "check the path") from None
    except (IsADirectoryError, PermissionError, UnicodeDecodeError) as exc:
        raise ConfigError(f"--config {path}: cannot read it ({exc})", "check the file") from None
    data = _parse(text, suffix, path)
    if data is None:
        return {}
    if not isinstance(data, dict):
        raise ConfigError(
            f"{path}: the top level must be a mapping of option names to values",
            "write one 'name: value' per line",
        )
    return data if model is None else _field_keys(data, model, path)


def _field_keys(data: dict[str, Any], model: type[StrictModel], path: str) -> dict[str, Any]:
    """``data`` with each key that spells a field as its flag's long alias does (``model:``
    as ``--model`` is ``model_name_or_path``, ``tokenizer:``, ``import:``) under the field's
    name; a field given under both spellings is refused, as neither is plainly the one meant.
    """
    aliases = {
        flag.removeprefix("--").replace("-", "_"): name
        for name, info in model.model_fields.items()
        for flag in field_extra(info).get("flags", [])
        if flag.startswith("--") and "/" not in flag
    }
    out: dict[str, Any] = {}
    spelled: dict[str, str] = {}
    for key, value in data.items():
        name = aliases.get(str(key).replace("-", "_"), key)
        if name in out:
            alias = key if name != key else spelled[name]
            raise ConfigError(
                f"{path}: '{spelled[name]}' and '{key}' both set {flag_name(str(name))}",
                f"keep one of them ('{alias}' is another name for '{name}')",
            )
        out[name] = value
        spelled[name] = str(key)
    return out


def _parse(text: str, suffix: str, path: str) -> Any:
    if suffix == ".json":
        try:
            return json.loads(text)
        except json.JSONDecodeError as exc:
            raise ConfigError(
                f"{path}, line {exc.lineno}: invalid JSON ({exc.msg})", "fix the JSON syntax"
            ) from None
    if suffix == ".toml":
        if sys.version_info >= (3, 11):
            import tomllib
        else:  # pragma: no cover - Python 3.10
            import tomli as tomllib
        try:
            return tomllib.loads(text)
        except tomllib.TOMLDecodeError as exc:
            raise ConfigError(f"{path}: invalid TOML ({exc})", "fix the TOML syntax") from None
    import yaml

    try:
        return yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f", line {mark.line + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc)
        raise ConfigError(
            f"{path}{where}: invalid YAML ({problem})", "fix the YAML syntax"
        ) from None


def build_config(
    model: type[ConfigT],
    *,
    cli_values: dict[str, Any],
    config_file: str | None = None,
    objective: str | None = None,
    defaults: dict[str, Any] | None = None,
    command: str = "train",
) -> ConfigT:
    """Validate the merged sources into ``model``; every problem (unknown keys, invalid
    values, the cross-field rules) becomes one ConfigError that lists them all.

    ``command`` selects the cross-field rules (``prepare`` needs no model).
    """
    known = set(model.model_fields)
    file_values: dict[str, Any] = {}
    sources: dict[str, str] = {}
    problems: list[tuple[str, str]] = []
    if config_file is not None:
        raw = read_config_file(config_file, model)
        file_objective = raw.pop("objective", None)
        if objective is not None and file_objective not in (None, objective):
            raise ConfigError(
                f"{config_file}: this config is for '{file_objective}', not '{objective}'",
                f"run 'lmctl train {file_objective} --config {config_file}'",
            )
        fields, passthrough, unknown = translate_upstream(raw, known)
        if unknown:
            problems.append((_unknown_keys_message(unknown, known, config_file), _HINT_KEYS))
        if passthrough and "training_args" in known:
            fields["training_args"] = {**passthrough, **fields.get("training_args", {})}
        file_values = fields
        sources = {key: f"'{key}' in {config_file}" for key in fields}
    merged = {**(defaults or {}), **file_values, **cli_values}
    if "training_args" in file_values and "training_args" in cli_values:
        # Flags set single TrainingArguments fields; the file's other fields stay.
        merged["training_args"] = {**file_values["training_args"], **cli_values["training_args"]}
    for key in cli_values:
        sources[key] = flag_name(key)
    secrets.register_in(merged)
    config, invalid = _validated(model, merged, sources, command)
    problems += invalid
    if config is None or problems:
        raise _config_error(problems)
    return config


_HINT_KEYS = "fix the key names; 'lmctl train <objective> --help' lists every option"
_HINT_SCHEMA = "fix the key name; 'lmctl config schema <objective>' lists every key"


def _unknown_keys_message(unknown: list[str], known: set[str], where: str) -> str:
    parts = []
    for key in unknown:
        close = difflib.get_close_matches(key.replace("-", "_"), sorted(known), n=1, cutoff=0.6)
        suggestion = f" (did you mean '{close[0]}'?)" if close else ""
        parts.append(f"'{key}'{suggestion}")
    noun = "key" if len(unknown) == 1 else "keys"
    return f"{where}: unknown {noun} " + ", ".join(parts)


def _config_error(items: list[tuple[str, str]]) -> ConfigError:
    """One error for every problem found; ``--json`` lists them under ``problems``."""
    messages = [message for message, _ in items]
    hints = [hint for _, hint in items]
    details = {"problems": [{"message": message, "hint": hint} for message, hint in items]}
    if len(messages) == 1:
        return ConfigError(messages[0], hints[0], details)
    listing = "; ".join(f"({i}) {m}" for i, m in enumerate(messages, 1))
    return ConfigError(
        f"{len(messages)} problems: {listing}", "; ".join(dict.fromkeys(hints)), details
    )


def _validated(
    model: type[ConfigT], values: dict[str, Any], sources: dict[str, str], command: str
) -> tuple[ConfigT | None, list[tuple[str, str]]]:
    """The config ``values`` make, or every problem with them: the invalid values, and the
    cross-field rules checked on the values that are valid (pydantic skips those rules when a
    field is invalid, and the user would meet them one fix later)."""
    try:
        return model.model_validate(values, context={"command": command}), []
    except ValidationError as exc:
        problems = _error_items(exc, sources)
        invalid = {str(error["loc"][0]) for error in exc.errors() if error["loc"]}
    if invalid:
        valid = {key: value for key, value in values.items() if key not in invalid}
        try:
            model.model_validate(valid, context={"command": command})
        except ValidationError as exc:
            problems += [item for item in _error_items(exc, sources) if item not in problems]
    return None, problems


def _error_items(exc: ValidationError, sources: dict[str, str]) -> list[tuple[str, str]]:
    """Each validation error as (message naming its flag or key, hint)."""
    items: list[tuple[str, str]] = []
    for error in exc.errors():
        ctx = error.get("ctx") or {}
        ctx_error = ctx.get("error")
        if isinstance(ctx_error, ConfigProblems):
            items += ctx_error.items
            continue
        field = str(error["loc"][0]) if error["loc"] else ""
        where = sources.get(field, flag_name(field) if field else "config")
        inner = "".join(
            f"[{part}]" if isinstance(part, int) else f".{part}" for part in error["loc"][1:]
        )
        if inner:
            # A key inside a list of settings (train_sources[1].weight) is named whole.
            named = f"'{field}'"
            where = where.replace(named, f"'{field}{inner}'") if named in where else where + inner
        value = error.get("input")
        secret = any(secrets.is_secret_key(str(part)) for part in error["loc"])
        shown = "" if isinstance(value, dict) or secret else f" (got {_shortened(repr(value))})"
        hint = f"fix {where}; see --help for accepted values"
        if error["type"] == "literal_error" and isinstance(value, str):
            choices = re.findall(r"'([^']*)'", str(ctx.get("expected", "")))
            close = difflib.get_close_matches(value, choices, n=1, cutoff=0.5)
            if close:
                hint = f"did you mean '{close[0]}'?"
        items.append((f"{where}: {error['msg']}{shown}", hint))
    return items


def config_file_problems(
    model: type[StrictModel],
    path: str,
    objective: str | None = None,
    defaults: dict[str, Any] | None = None,
) -> list[tuple[str, str]]:
    """Every problem of a config file at once, each with its hint: unknown keys (with the
    closest known key), invalid values, and the cross-field rules, which are checked on the
    values that are valid (over ``defaults``). Unreadable files and syntax errors raise
    ConfigError."""
    raw = read_config_file(path, model)
    file_objective = raw.pop("objective", None)
    problems: list[tuple[str, str]] = []
    if objective is not None and file_objective not in (None, objective):
        problems.append(
            (
                f"{path}: 'objective: {file_objective}' but it is validated for '{objective}'",
                f"drop --task, or set 'objective: {objective}'",
            )
        )
    known = set(model.model_fields)
    fields, passthrough, unknown = translate_upstream(raw, known)
    for key in unknown:
        problems.append((_unknown_keys_message([key], known, path), _HINT_SCHEMA))
    if passthrough and "training_args" in known:
        fields["training_args"] = {**passthrough, **fields.get("training_args", {})}
    sources = {key: f"'{key}' in {path}" for key in fields}
    _, invalid = _validated(model, {**(defaults or {}), **fields}, sources, "train")
    return problems + invalid


def json_schema(model: type[StrictModel], objective: str) -> dict[str, Any]:
    """The JSON Schema of a config file for ``objective`` (for editor completion)."""
    schema = model.model_json_schema()
    for prop in schema.get("properties", {}).values():
        for key in ("panel", "flags", "secret", "cli"):
            prop.pop(key, None)
    schema["properties"] = {
        "objective": {"const": objective, "description": "The objective this config trains."},
        **schema.get("properties", {}),
    }
    return {
        "$schema": "https://json-schema.org/draft/2020-12/schema",
        **schema,
        "title": f"lmctl train {objective} config",
    }


def _shortened(text: str, limit: int = 80) -> str:
    """A value as shown in a message: long ones cut, so that the message stays one line."""
    return text if len(text) <= limit else f"{text[: limit - 15]}... ({len(text)} characters)"


def dump_config(config: StrictModel, *, masked: bool = False) -> dict[str, Any]:
    """The resolved config as plain data, secrets excluded at every depth (``masked``: shown
    as ``***``, for printing); see :mod:`lmctl.secrets` for what counts as one."""
    data = config.model_dump(mode="json")
    for name, info in type(config).model_fields.items():
        if field_extra(info).get("secret"):
            data.pop(name, None)
    result: dict[str, Any] = secrets.redact(data, drop=not masked)
    return result


def with_output_dir(config: TrainConfig) -> TrainConfig:
    """Fix the default run directory once, so every later step sees the same path."""
    if config.output_dir is not None:
        return config
    return config.model_copy(update={"output_dir": config.resolved_output_dir()})
