"""Compatibility with the upstream example scripts' arguments (args files and command lines).

``run_clm.py`` and friends accept every ``transformers.TrainingArguments`` field. Those that
lmctl does not model itself are passed through to the Trainer unchanged (``training_args``);
anything else unknown is an error with a did-you-mean hint. The fields and their types are
read from the installed transformers' declaration of ``TrainingArguments`` (its source, which
costs milliseconds, where importing it costs seconds of torch), so that a field added by a new
transformers release works at once, and a config error never has to import transformers.
"""

from __future__ import annotations

import ast
import difflib
import functools
import importlib.util
import json
from dataclasses import dataclass
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any

from lmctl.config.problems import ConfigProblems
from lmctl.errors import ConfigError

if TYPE_CHECKING:
    from pydantic.fields import FieldInfo


@dataclass(frozen=True)
class FieldKind:
    """How a TrainingArguments field's value is read from a command line, as
    ``HfArgumentParser`` reads it: ``kind`` is bool, int, float, str, dict (JSON text) or
    list (one or more words); ``annotation`` is the field's declared type, for messages."""

    kind: str
    annotation: str
    #: A mapping that may also be given as text (a file's path): JSON only when it is ``{...}``.
    takes_text: bool = False


#: TrainingArguments fields that lmctl accepts but does not pass on, and why.
MANAGED_TRAINING_ARGUMENTS: dict[str, str] = {
    "disable_tqdm": "lmctl draws its own progress display; true means --no-progress",
    "log_level": "lmctl's log is its own (--quiet makes it terse); the libraries log errors",
    "log_level_replica": "only the main process logs in lmctl",
    "local_rank": "lmctl reads each process's rank from its launcher's environment",
    "do_predict": "the upstream scripts of these objectives have no prediction step",
}
#: no_trainer flags (not TrainingArguments fields) that have no effect any more, and why.
NO_EFFECT_FLAGS: dict[str, str] = {
    "low_cpu_mem_usage": "transformers 5 always loads weights without a second full-size copy",
}
#: TrainingArguments fields refused on the command line, and why.
REFUSED_TRAINING_ARGUMENTS: dict[str, str] = {
    "parallelism_config": "an accelerate ParallelismConfig object, which no text spells",
}
#: TrainingArguments fields that lmctl owns under another name: field -> lmctl field.
OWNED_TRAINING_ARGUMENTS: dict[str, str] = {
    "hub_token": "token",
    "hub_private_repo": "push_private",
}
#: Old or no_trainer spellings -> lmctl field, with a converter for the value.
RENAMED_KEYS: dict[str, tuple[str, Any]] = {
    "torch_dtype": ("dtype", None),
    "evaluation_strategy": ("eval_strategy", None),
    "max_train_steps": ("max_steps", None),
    "num_warmup_steps": ("warmup_steps", None),
    "use_slow_tokenizer": ("use_fast_tokenizer", lambda v: not truthy(v)),
}
#: Old spellings of TrainingArguments fields -> the field (``no_cuda`` became ``use_cpu``).
RENAMED_TRAINING_ARGUMENTS = {"no_cuda": "use_cpu"}

_SCALARS = {"bool", "int", "float", "str"}


def truthy(value: Any) -> bool:
    if isinstance(value, str):
        return value.strip().lower() in {"1", "true", "yes", "on", "y", "t"}
    return bool(value)


@functools.cache
def training_argument_fields() -> dict[str, FieldKind]:
    """Every ``TrainingArguments`` field of the installed transformers, with its kind."""
    spec = importlib.util.find_spec("transformers")
    locations = list(spec.submodule_search_locations or []) if spec is not None else []
    for location in locations:
        source = Path(location) / "training_args.py"
        if source.is_file():
            fields = _declared_fields(source.read_text(encoding="utf-8"))
            if fields:
                return fields
    return _dataclass_fields()


def _declared_fields(source: str) -> dict[str, FieldKind]:
    """The annotated fields of ``class TrainingArguments`` in its module's source."""
    for node in ast.parse(source).body:
        if isinstance(node, ast.ClassDef) and node.name == "TrainingArguments":
            return {
                item.target.id: _kind(ast.unparse(item.annotation))
                for item in node.body
                if isinstance(item, ast.AnnAssign) and isinstance(item.target, ast.Name)
            }
    return {}


def _dataclass_fields() -> dict[str, FieldKind]:  # pragma: no cover - a relayout upstream
    import dataclasses

    from transformers import TrainingArguments

    return {
        field.name: _kind(field.type if isinstance(field.type, str) else _type_text(field.type))
        for field in dataclasses.fields(TrainingArguments)
        if field.init
    }


def _type_text(annotation: Any) -> str:  # pragma: no cover - see _dataclass_fields
    return getattr(annotation, "__name__", None) or str(annotation).replace("typing.", "")


def _kind(annotation: str) -> FieldKind:
    """HfArgumentParser's reading of a declared type: ``X | None`` reads X; a union with
    ``str`` reads text; a mapping is JSON text; ``list[X]`` takes one or more words."""
    text = annotation.replace(" ", "")
    if text.startswith("Optional[") and text.endswith("]"):
        text = text[len("Optional[") : -1]
    if text.startswith("Union[") and text.endswith("]"):
        text = text[len("Union[") : -1].replace(",", "|")
    parts = [part for part in _split_union(text) if part not in ("None", "NoneType")]
    kind = "unsupported"
    if any(part == "dict" or part.startswith("dict[") for part in parts):
        return FieldKind("dict", annotation, takes_text="str" in parts)
    elif len(parts) == 1 and parts[0].startswith("list["):
        kind = "list"
    elif len(parts) == 1 and parts[0] in _SCALARS:
        kind = parts[0]
    elif "str" in parts:
        kind = "str"
    return FieldKind(kind, annotation)


def _split_union(text: str) -> list[str]:
    """``a|b[c|d]|e`` -> ``[a, b[c|d], e]``."""
    parts, depth, start = [], 0, 0
    for index, char in enumerate(text):
        depth += char == "["
        depth -= char == "]"
        if char == "|" and depth == 0:
            parts.append(text[start:index])
            start = index + 1
    parts.append(text[start:])
    return parts


def parse_training_argument(name: str, value: Any, flag: str) -> Any:
    """A TrainingArguments field's value (text from a command line, or a file's value) as
    its declared type; a value of the wrong type is a ConfigError naming the field and type."""
    field = training_argument_fields()[name]
    if not isinstance(value, str) and not isinstance(value, list):
        return value
    if field.kind == "list":
        return [str(item) for item in (value if isinstance(value, list) else value.split())]
    if isinstance(value, list):
        if len(value) == 1:
            value = value[0]
        else:
            raise _wrong_type(name, field, " ".join(value), flag, "one value")
    text = value.strip()
    try:
        if field.kind == "bool":
            return _bool(text)
        if field.kind == "int":
            return int(text)
        if field.kind == "float":
            return float(text)
        if field.kind == "dict" and not (field.takes_text and not text.startswith("{")):
            parsed = json.loads(text)
            if not isinstance(parsed, dict):
                raise ValueError(text)
            return parsed
    except ValueError:
        raise _wrong_type(name, field, value, flag) from None
    if field.kind == "unsupported":
        raise ConfigError(
            f"{flag}: {REFUSED_TRAINING_ARGUMENTS.get(name, 'not settable from text')}",
            f"drop {flag}",
        )
    return value


def _bool(text: str) -> bool:
    lowered = text.lower()
    if lowered in {"1", "true", "yes", "on", "y", "t"}:
        return True
    if lowered in {"0", "false", "no", "off", "n", "f"}:
        return False
    raise ValueError(text)


_KIND_WORDS = {
    "bool": "a boolean (true or false)",
    "int": "an integer",
    "float": "a number",
    "dict": "a JSON object, e.g. '{\"key\": 1}'",
}


def _wrong_type(
    name: str, field: FieldKind, value: Any, flag: str, wanted: str | None = None
) -> ConfigError:
    expected = wanted or _KIND_WORDS.get(field.kind, field.kind)
    return ConfigError(
        f"{flag} {value!r}: TrainingArguments.{name} is {field.annotation}, so it takes {expected}",
        f"give {flag} {expected}",
    )


def translate_upstream(
    data: dict[str, Any], known_fields: set[str]
) -> tuple[dict[str, Any], dict[str, Any], list[str]]:
    """Split upstream-style keys into lmctl fields, Trainer pass-through, and unknown keys."""
    fields: dict[str, Any] = {}
    passthrough: dict[str, Any] = {}
    unknown: list[str] = []
    for raw_key, value in data.items():
        key = raw_key.replace("-", "_")
        key = RENAMED_TRAINING_ARGUMENTS.get(key, key)
        if key == "fsdp" and isinstance(value, (str, list)):
            flags = fsdp_flags(value)
            if flags is None:
                passthrough[key] = value
            else:
                fields.update(flags)
        elif key in RENAMED_KEYS:
            target, convert = RENAMED_KEYS[key]
            fields[target] = convert(value) if convert else value
        elif key in known_fields:
            fields[key] = value
        elif key in OWNED_TRAINING_ARGUMENTS and OWNED_TRAINING_ARGUMENTS[key] in known_fields:
            fields[OWNED_TRAINING_ARGUMENTS[key]] = value
        elif key in MANAGED_TRAINING_ARGUMENTS:
            continue
        elif key in training_argument_fields():
            passthrough[key] = value
        else:
            unknown.append(raw_key)
    return fields, passthrough, unknown


#: Words of the Trainer's ``fsdp`` option string -> lmctl's FSDP fields.
FSDP_WORDS: dict[str, tuple[str, Any]] = {
    "full_shard": ("fsdp_sharding", "full"),
    "hybrid_shard": ("fsdp_sharding", "hybrid"),
    "shard_grad_op": ("fsdp_sharding", "grad-op"),
    "auto_wrap": ("fsdp_auto_wrap", True),
    "offload": ("fsdp_cpu_offload", True),
}


def fsdp_flags(value: str | list[str]) -> dict[str, Any] | None:
    """``fsdp: "full_shard auto_wrap"`` as lmctl's fields; None for a combination they do not
    express (it is passed to the Trainer as it is)."""
    words = value.split() if isinstance(value, str) else [str(word) for word in value]
    if not words:
        return {"fsdp": False}
    if any(word not in FSDP_WORDS for word in words):
        return None
    return {"fsdp": True, **dict(FSDP_WORDS[word] for word in words)}


#: lmctl fields that TrainingArguments also has, with another meaning or type there (its
#: ``fsdp`` is an option string, its ``deepspeed`` a mapping too): under ``training_args``
#: they follow TrainingArguments' declaration, not lmctl's flag.
DIFFERENT_IN_TRAINING_ARGUMENTS = frozenset(
    {"deepspeed", "fsdp", "report_to", "output_dir", "resume_from_checkpoint"}
)


def check_training_args(
    values: dict[str, Any], fields: dict[str, FieldInfo]
) -> tuple[dict[str, Any], list[tuple[str, str]]]:
    """``training_args`` of a config file checked like flags: a key that is also one of
    lmctl's flags (``fields``, the document's) by that flag's rules and messages, any other
    TrainingArguments field by its declared type, as on an upstream command line. The values
    as their types, and every problem (message, hint), each naming ``training_args.<key>``."""
    from pydantic import TypeAdapter, ValidationError

    declared = training_argument_fields()
    checked: dict[str, Any] = {}
    problems: list[tuple[str, str]] = []
    for key, value in values.items():
        where = f"training_args.{key}"
        if key == "logging_dir":  # a folder of lmctl's own, checked with the locations
            checked[key] = value
            continue
        if key not in declared:
            close = difflib.get_close_matches(key, sorted(declared), n=1, cutoff=0.6)
            problems.append(
                (
                    f"{where}: not a TrainingArguments field of the installed transformers"
                    + (f" (did you mean '{close[0]}'?)" if close else ""),
                    "fix the key name, or remove it",
                )
            )
        elif key in fields and key not in DIFFERENT_IN_TRAINING_ARGUMENTS:
            # The flag's type and bounds.
            rules: Any = Annotated[fields[key].annotation, fields[key]]
            try:
                checked[key] = TypeAdapter(rules).validate_python(value)
            except ValidationError as exc:
                for error in exc.errors():
                    problems.append(
                        (
                            f"{where}: {error['msg']} (got {value!r})",
                            f"fix {where}; see --help for accepted values",
                        )
                    )
        else:
            try:
                checked[key] = _declared_value(key, value, declared[key], where)
            except ConfigError as exc:
                problems.append((exc.message, exc.hint or ""))
    return checked, problems


def _declared_value(name: str, value: Any, field: FieldKind, where: str) -> Any:
    """A file's value of a TrainingArguments field: text read as a command line reads it,
    anything else of the declared kind."""
    if isinstance(value, str) or (isinstance(value, list) and field.kind != "list"):
        return parse_training_argument(name, value, where)
    wanted = {
        "bool": lambda v: isinstance(v, bool),
        "int": lambda v: isinstance(v, int) and not isinstance(v, bool),
        "float": lambda v: isinstance(v, (int, float)) and not isinstance(v, bool),
        "dict": lambda v: isinstance(v, dict),
        "list": lambda v: isinstance(v, list),
    }.get(field.kind)
    if value is not None and wanted is not None and not wanted(value):
        raise _wrong_type(name, field, value, where)
    return value


def checkpointing_steps(data: Any) -> Any:
    """``checkpointing_steps N|epoch`` (the no_trainer scripts' spelling) sets the save strategy
    that both engines honour; it is then cleared so the resolved config says it one way only."""
    if not isinstance(data, dict):
        return data
    value = data.get("checkpointing_steps")
    if value is None:
        return data
    data = {**data, "checkpointing_steps": None}
    text = str(value).strip().lower()
    if text in ("epoch", "no"):
        data["save_strategy"] = text
    elif text.isdigit() and int(text) > 0:
        data["save_strategy"] = "steps"
        data["save_steps"] = int(text)
    else:
        raise ConfigProblems(
            [
                (
                    f"--checkpointing-steps {value}: not a number of steps or 'epoch'",
                    "e.g. --checkpointing-steps 500 or --checkpointing-steps epoch",
                )
            ]
        )
    return data


def machine_range(data: Any) -> Any:
    """``--nnodes MIN:MAX`` (torchrun's elastic form): at most MAX machines, and a restart
    goes on with as few as MIN (``min_nnodes``). Another value is left for the field's own
    check to report."""
    if isinstance(data, dict) and isinstance(data.get("nnodes"), str):
        low, colon, high = data["nnodes"].partition(":")
        if colon and low.strip().isdigit() and high.strip().isdigit():
            data = {**data, "nnodes": int(high), "min_nnodes": int(low)}
    return data
