"""Upstream command lines: the arguments of ``run_OBJ.py`` and ``run_OBJ_no_trainer.py``,
rewritten into lmctl's own flags before the command line is parsed.

``lmctl train OBJ`` followed by what a user gave an upstream script runs unchanged:
snake_case spellings of every lmctl option (``--per_device_train_batch_size 2``,
``--num_train_epochs=1``), HfArgumentParser's boolean forms (``--do_train``,
``--do_train false``, ``--no_do_train``), list options given as several words
(``--report_to a b``), the no_trainer spellings (``--max_train_steps``, ``--with_tracking``),
every other ``TrainingArguments`` field (collected, typed, into the hidden
``--training-args`` option, which ``training_args:`` of a config file also fills), and a
positional args file (``lmctl train clm args.json``). None of this changes ``--help``.
"""

from __future__ import annotations

import difflib
import json
from dataclasses import dataclass, field
from typing import Any, get_origin

from pydantic import BaseModel

from lmctl.cli.params import unwrap_optional
from lmctl.config.fields import field_extra, flag_name
from lmctl.config.loader import CONFIG_SUFFIXES
from lmctl.config.upstream import (
    MANAGED_TRAINING_ARGUMENTS,
    NO_EFFECT_FLAGS,
    OWNED_TRAINING_ARGUMENTS,
    RENAMED_KEYS,
    RENAMED_TRAINING_ARGUMENTS,
    fsdp_flags,
    parse_training_argument,
    training_argument_fields,
)
from lmctl.errors import ConfigError
from lmctl.objectives import OBJECTIVES, get_objective
from lmctl.secrets import is_secret_key, register

#: The hidden option that carries TrainingArguments fields given as flags (a JSON object).
TRAINING_ARGS_FLAG = "--training-args"
#: Options of ``lmctl train OBJ`` that are not config fields: flag -> takes a value.
COMMAND_OPTIONS = {
    "--config": True,
    "-c": True,
    "--json": False,
    "--quiet": False,
    "-q": False,
    "--no-progress": False,
    "--dry-run": False,
    "--help": False,
    TRAINING_ARGS_FLAG: True,
}
_TRUE = {"1", "true", "yes", "on", "y", "t"}
_FALSE = {"0", "false", "no", "off", "n", "f"}


@dataclass(frozen=True)
class _Option:
    """One lmctl config field as the command line spells it."""

    field: str
    kind: str  # "bool", "list" or "value"
    on: str  # the flag (for a bool: the flag that sets it)
    off: str | None = None  # a bool's flag that clears it


@dataclass
class _Given:
    """What the rewritten command line sets so far, to catch contradictions."""

    values: dict[str, tuple[str, Any]] = field(default_factory=dict)
    training_args: dict[str, Any] = field(default_factory=dict)

    def record(self, name: str, spelling: str, value: Any) -> None:
        if is_secret_key(name):
            register(value)  # masked in whatever is printed from now on
        earlier = self.values.get(name)
        if earlier is not None and earlier[0] != spelling and earlier[1] != value:
            if is_secret_key(name):  # a token's values are never shown, not even to say they differ
                first, second = earlier[0], spelling
            else:
                first, second = f"{earlier[0]} {_shown(earlier[1])}", f"{spelling} {_shown(value)}"
            raise ConfigError(
                f"{first} and {second} set the same option to different values",
                f"give {flag_name(name)} once",
            )
        self.values[name] = (spelling, value)


def _shown(value: Any) -> str:
    if isinstance(value, bool):
        return "true" if value else "false"
    if isinstance(value, list):
        return " ".join(map(str, value))
    return str(value)


def _options(model: type[BaseModel]) -> tuple[dict[str, _Option], dict[str, _Option]]:
    """lmctl's config fields of ``model``: by each flag that spells them, and by field name."""
    by_flag: dict[str, _Option] = {}
    by_field: dict[str, _Option] = {}
    for name, info in model.model_fields.items():
        extra = field_extra(info)
        if not extra.get("cli", True):
            continue
        annotation = unwrap_optional(info.annotation)
        declared = list(extra.get("flags", []))
        if annotation is bool:
            toggles = [decl for decl in declared if "/" in decl]
            on, off = (
                toggles[0] if toggles else f"{flag_name(name)}/--no-{name.replace('_', '-')}"
            ).split("/")
            option = _Option(name, "bool", on, off)
            spellings = [on, off, *(decl for decl in declared if "/" not in decl)]
        else:
            kind = "list" if get_origin(annotation) is list else "value"
            option = _Option(name, kind, flag_name(name))
            spellings = [flag_name(name), *declared]
        by_field[name] = option
        for spelling in spellings:
            by_flag[spelling] = option
    return by_flag, by_field


def upstream_arguments(args: list[str]) -> list[str]:
    """``args`` of ``lmctl ...``, with an upstream script's arguments after ``train OBJ``
    rewritten into lmctl's flags; other commands, and ``--help``, as they are."""
    if len(args) < 2 or args[0] != "train" or args[1] not in OBJECTIVES or "--help" in args:
        return args
    config_class = get_objective(args[1]).config_class
    return [*args[:2], *upstream_command_line(args[2:], config_class)]


def upstream_command_line(args: list[str], model: type[BaseModel]) -> list[str]:
    """``args`` (what follows ``lmctl train OBJ``) in lmctl's own spelling; a ConfigError
    for an unknown flag, a value of the wrong type, or one option set two ways."""
    by_flag, by_field = _options(model)
    given = _Given()
    out: list[str] = []
    hub: dict[str, Any] = {}
    words = list(args)
    index = 0

    def value_after(name: str, inline: str | None, *, optional_bool: bool = False) -> Any:
        """The value of the flag at ``index``: inline (``--x=v``), else the next word."""
        nonlocal index
        if inline is not None:
            return inline
        following = words[index + 1] if index + 1 < len(words) else None
        if optional_bool:
            # HfArgumentParser's ``nargs="?"``: a word that is not a flag is the value.
            if (
                following is not None
                and not following.startswith("-")
                and not following.lower().endswith(CONFIG_SUFFIXES)
            ):
                index += 1
                return following
            return "true"
        if following is None or (following.startswith("--") and following != "--"):
            raise ConfigError(f"{name} needs a value", f"give it as {name} VALUE")
        index += 1
        return following

    def several_after(name: str, inline: str | None) -> list[str]:
        """A list flag's words: ``--x a b c`` (until the next flag) or ``--x=a``."""
        nonlocal index
        if inline is not None:
            return [inline]
        items = []
        while index + 1 < len(words) and not words[index + 1].startswith("-"):
            index += 1
            items.append(words[index])
        if not items:
            raise ConfigError(f"{name} needs a value", f"give it as {name} VALUE")
        return items

    def set_lmctl(
        option: _Option, spelling: str, inline: str | None, *, invert: bool, bare: bool
    ) -> None:
        """Set an lmctl field; a bool's ``bare`` flag (``--no_x``) takes no word after it."""
        if option.kind == "bool":
            text = "true" if bare and inline is None else None
            text = text or value_after(spelling, inline, optional_bool=True)
            value = _bool_word(spelling, text) != invert
            given.record(option.field, spelling, value)
            out.append(option.on if value else (option.off or option.on))
        elif option.kind == "list":
            items = [
                part for item in several_after(spelling, inline) for part in item.split(",") if part
            ]
            given.record(option.field, spelling, items)
            for item in items:
                out.extend([option.on, item])
        else:
            value = value_after(spelling, inline)
            given.record(option.field, spelling, value)
            out.extend([option.on, value])

    while index < len(words):
        word = words[index]
        if word == "--":
            out.extend(words[index:])
            break
        if not word.startswith("-"):
            if word.lower().endswith(CONFIG_SUFFIXES):
                given.record("config", word, word)
                out.extend(["--config", word])
            else:
                out.append(word)
            index += 1
            continue
        spelling, eq, inline_text = word.partition("=")
        inline = inline_text if eq else None
        if spelling in COMMAND_OPTIONS:
            if spelling in ("--config", "-c"):
                given.record("config", spelling, value_after(spelling, inline))
                out.extend(["--config", given.values["config"][1]])
            else:
                out.append(word)
                if COMMAND_OPTIONS[spelling] and inline is None and index + 1 < len(words):
                    index += 1
                    out.append(words[index])
            index += 1
            continue
        if spelling == "--fsdp" and "fsdp" in by_field and _fsdp_words(words, index, inline):
            # the Trainer's string form, ``--fsdp "full_shard auto_wrap"``
            text = value_after(spelling, inline)
            flags = fsdp_flags(text)
            if flags is None:
                given.training_args["fsdp"] = text
            for name, value in (flags or {}).items():
                set_lmctl(by_field[name], flag_name(name), str(value), invert=False, bare=False)
            index += 1
            continue
        if spelling in by_flag:
            option = by_flag[spelling]
            negated = option.kind == "bool" and spelling == option.off
            set_lmctl(option, spelling, inline, invert=negated, bare=negated)
            index += 1
            continue
        key = spelling.lstrip("-").replace("-", "_")
        if not spelling.startswith("--") or ("_" not in spelling and not _upstream_name(key)):
            out.append(word)  # click reports it, as for any unknown kebab-case flag
            index += 1
            continue
        negated = False
        if not _upstream_name(key, by_field) and key.startswith("no_"):
            negated, key = True, key[3:]
        key = RENAMED_TRAINING_ARGUMENTS.get(key, key)
        inverse = False
        if key in RENAMED_KEYS:
            target, convert = RENAMED_KEYS[key]
            inverse = convert is not None
            key = target
        key = OWNED_TRAINING_ARGUMENTS.get(key, key) if key not in by_field else key
        if key in ("push_to_hub", "hub_model_id") and key not in by_field:
            if key == "push_to_hub":
                text = "true" if negated else value_after(spelling, inline, optional_bool=True)
                hub[key] = _bool_word(spelling, text) != negated
            else:
                hub[key] = value_after(spelling, inline)
        elif key in by_field:
            set_lmctl(by_field[key], spelling, inline, invert=negated != inverse, bare=negated)
        elif key in MANAGED_TRAINING_ARGUMENTS or key in NO_EFFECT_FLAGS:
            kind = "bool" if key in NO_EFFECT_FLAGS else training_argument_fields()[key].kind
            text = (
                "true" if negated else value_after(spelling, inline, optional_bool=kind == "bool")
            )
            if key == "disable_tqdm" and _bool_word(spelling, text) != negated:
                out.append("--no-progress")
        elif key in training_argument_fields():
            kind = training_argument_fields()[key].kind
            if negated and kind != "bool":
                raise _unknown(spelling, by_field)
            raw: Any
            if kind == "list":
                raw = several_after(spelling, inline)
            elif negated:
                raw = "true"
            else:
                raw = value_after(spelling, inline, optional_bool=kind == "bool")
            value = parse_training_argument(key, raw, spelling)
            if negated:
                value = not value
            given.record(key, spelling, value)
            given.training_args[key] = value
        else:
            raise _unknown(spelling, by_field)
        index += 1
    out += _hub_flags(hub, given)
    if given.training_args:
        out += [TRAINING_ARGS_FLAG, json.dumps(given.training_args)]
    return out


def _fsdp_words(words: list[str], index: int, inline: str | None) -> bool:
    """Whether ``--fsdp`` at ``index`` is given the Trainer's words rather than a boolean."""
    following = inline if inline is not None else (words[index + 1 :] or [""])[0]
    return (
        bool(following)
        and not following.startswith("-")
        and following.lower() not in _TRUE | _FALSE
    )


def _upstream_name(key: str, by_field: dict[str, _Option] | None = None) -> bool:
    """Whether ``key`` is a name the upstream scripts or lmctl's fields know."""
    if by_field is not None and key in by_field:
        return True
    return (
        key in RENAMED_KEYS
        or key in RENAMED_TRAINING_ARGUMENTS
        or key in OWNED_TRAINING_ARGUMENTS
        or key in NO_EFFECT_FLAGS
        or key in training_argument_fields()
    )


def _bool_word(flag: str, text: str) -> bool:
    lowered = text.strip().lower()
    if lowered in _TRUE:
        return True
    if lowered in _FALSE:
        return False
    raise ConfigError(f"{flag} {text!r}: not a boolean", f"give {flag} true or {flag} false")


def _hub_flags(hub: dict[str, Any], given: _Given) -> list[str]:
    """``--push_to_hub --hub_model_id NS/REPO`` as lmctl's ``--push-to hf://NS/REPO``."""
    if not hub.get("push_to_hub"):
        if "hub_model_id" in hub:
            raise ConfigError(
                "--hub_model_id names the repository that --push_to_hub publishes to",
                "add --push_to_hub, or drop --hub_model_id",
            )
        return []
    if "hub_model_id" not in hub:
        raise ConfigError(
            "--push_to_hub needs --hub_model_id NAMESPACE/REPO: lmctl does not guess a "
            "repository from the output directory's name",
            "add --hub_model_id NAMESPACE/REPO (or give --push-to hf://NAMESPACE/REPO)",
        )
    destination = f"hf://{hub['hub_model_id']}"
    given.record("push_to", "--push_to_hub --hub_model_id", destination)
    return ["--push-to", destination]


def _unknown(spelling: str, by_field: dict[str, _Option]) -> ConfigError:
    key = spelling.lstrip("-").replace("-", "_")
    names = sorted(set(by_field) | set(training_argument_fields()) | set(RENAMED_KEYS) - {"cli"})
    close = difflib.get_close_matches(key, names, n=1, cutoff=0.6)
    suggestion = f" (did you mean '--{close[0]}'?)" if close else ""
    return ConfigError(
        f"{spelling}: no such option: neither an lmctl option nor a transformers "
        f"TrainingArguments field{suggestion}",
        "'lmctl train <objective> --help' lists lmctl's options; docs/migrating.md lists "
        "what each upstream flag becomes",
    )
