"""Which settings are secrets, and keeping their values out of everything lmctl writes or shows.

The rule, applied to a key at any depth of a config (``training_args:`` and the mappings in
it included) and to environment variable names: a key is secret when one of the words of its
name (split at ``_``, ``-``, ``.`` and spaces, compared case-insensitively) is ``token``,
``secret``, ``password``, ``passwd``, ``passphrase``, ``key``, ``apikey``, ``credential`` or
``credentials``. Words that merely contain one of these are not (``tokenizer_name``,
``include_num_input_tokens_seen``, ``keep_linebreaks``), nor are a tokenizer's special-token
settings (``pad_token``, ``mask_token``, ...), which name a token, not a credential.

Files get secret keys left out; what is shown to a person (``--dry-run``, ``--json``) gets
``***`` in their place. Every secret value lmctl comes across is also registered, and the
console masks registered values in every line it prints, error messages included.
"""

from __future__ import annotations

import io
import os
import pickle
import re
import zipfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

MASK = "***"
SECRET_WORDS = frozenset(
    {
        "token",
        "secret",
        "password",
        "passwd",
        "passphrase",
        "key",
        "apikey",
        "credential",
        "credentials",
    }
)
#: ``<word>_token`` settings of a tokenizer: they name a vocabulary entry, not a credential.
SPECIAL_TOKENS = frozenset({"pad", "mask", "eos", "bos", "unk", "sep", "cls", "additional"})
#: Values shorter than this are not masked in printed text (too likely to occur by chance).
MIN_MASKED_LENGTH = 6

_WORD_SPLIT = re.compile(r"[^0-9a-zA-Z]+")
#: A setting whose whole value is ``${NAME}`` names an environment variable: the reference is
#: kept (a resumed run reads the variable again), the value it stands for is the secret.
ENV_REFERENCE = re.compile(r"^\$\{([A-Za-z_][A-Za-z0-9_]*)\}$")
_registered: set[str] = set()


def is_secret_key(name: str) -> bool:
    words = [word.lower() for word in _WORD_SPLIT.split(str(name)) if word]
    if not any(word in SECRET_WORDS for word in words):
        return False
    return not (len(words) == 2 and words[1] == "token" and words[0] in SPECIAL_TOKENS)


def redact(data: Any, *, drop: bool) -> Any:
    """``data`` with every secret key removed (``drop``) or its value replaced by ``***``, and
    every secret value masked inside text (``optim_args: 'api_key=...'``, or the same value
    under another key)."""
    register_in(data)
    return _redacted(data, drop)


def cleared(arguments: Any) -> Any:
    """A copy of a dataclass of settings (``TrainingArguments``) with every secret cleared: a
    secret field (``hub_token``) and secret keys inside its mappings, for pickling."""
    import copy
    import dataclasses

    clean = copy.copy(arguments)
    for item in dataclasses.fields(arguments):
        value = getattr(arguments, item.name, None)
        if is_secret_key(item.name) and value is not None:
            object.__setattr__(clean, item.name, None)
        elif isinstance(value, (dict, str)):
            object.__setattr__(clean, item.name, redact(value, drop=True))
    return clean


def _redacted(data: Any, drop: bool) -> Any:
    if isinstance(data, dict):
        out: dict[Any, Any] = {}
        for key, value in data.items():
            if is_secret_key(key) and value is not None and not is_env_reference(value):
                if not drop:
                    out[key] = MASK
                continue
            out[key] = _redacted(value, drop)
        return out
    if isinstance(data, (list, tuple)):
        return [_redacted(item, drop) for item in data]
    if isinstance(data, str):
        return mask_text(_PAIR.sub(_masked_pair, data))
    return data


#: ``name=value`` inside a text setting (``optim_args``, ``lr_scheduler_kwargs`` strings). A
#: name starts only where a word starts, so a long value without ``=`` is scanned in linear
#: time (trying every suffix of it as a name would be quadratic).
_PAIR = re.compile(r"(?<![A-Za-z0-9_.-])([A-Za-z0-9_.-]+)(\s*=\s*)([^,;\s]+)")


def _masked_pair(match: re.Match[str]) -> str:
    name, equals, _ = match.groups()
    return f"{name}{equals}{MASK}" if is_secret_key(name) else match.group(0)


def is_env_reference(value: Any) -> bool:
    return isinstance(value, str) and ENV_REFERENCE.match(value) is not None


def secret_keys(data: Any, prefix: str = "") -> list[str]:
    """Dotted names of the secrets set in ``data`` (for saying what was left out)."""
    found: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            name = f"{prefix}{key}"
            if is_secret_key(key) and value is not None and not is_env_reference(value):
                found.append(name)
            else:
                found += secret_keys(value, name + ".")
    return found


def register(value: Any) -> None:
    """Mask ``value`` wherever the console prints it from now on."""
    if isinstance(value, str) and len(value.strip()) >= MIN_MASKED_LENGTH:
        _registered.add(value.strip())


def register_in(data: Any) -> None:
    """Register the values of every secret key in ``data``."""
    for value in _secret_values(data):
        register(value)


def _secret_values(data: Any) -> Iterator[Any]:
    if isinstance(data, dict):
        for key, value in data.items():
            if is_secret_key(key) and not isinstance(value, (dict, list)):
                if not is_env_reference(value):
                    yield value
            else:
                yield from _secret_values(value)
    elif isinstance(data, (list, tuple)):
        for item in data:
            yield from _secret_values(item)
    elif isinstance(data, str):
        for name, _, value in _PAIR.findall(data):
            if is_secret_key(name):
                yield value


def register_environment() -> None:
    """Register the values of secret-named environment variables (HF_TOKEN, AWS_SECRET_...)."""
    for name, value in os.environ.items():
        if is_secret_key(name):
            register(value)


def mask_text(text: str) -> str:
    for value in sorted(_registered, key=len, reverse=True):
        if value in text:
            text = text.replace(value, MASK)
    return text


def pickled_secret(path: Path) -> str | None:
    """The name of a secret set in a pickle (``torch.save`` zip or plain), or None.

    Read with an unpickler that builds inert stand-ins for every class and function it names,
    so nothing in the file runs; a secret-named key with a non-empty string value counts.
    """
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                blobs = [archive.read(name) for name in archive.namelist() if name.endswith(".pkl")]
        else:
            blobs = [path.read_bytes()]
    except (OSError, zipfile.BadZipFile):
        return None
    for blob in blobs:
        try:
            data = _InertUnpickler(io.BytesIO(blob)).load()
        except Exception:
            continue
        found = _find_secret(data, set())
        if found is not None:
            return found
    return None


class _Inert:
    """Stands in for any pickled class or function: records what it is given."""

    parts: list[Any]
    items: dict[Any, Any]

    def __new__(cls, *args: Any, **kwargs: Any) -> _Inert:
        inert = super().__new__(cls)
        inert.parts = [args, kwargs]
        inert.items = {}
        return inert

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def __call__(self, *args: Any, **kwargs: Any) -> _Inert:
        return _Inert(*args, **kwargs)

    def __setstate__(self, state: Any) -> None:
        self.parts.append(state)

    def __setitem__(self, key: Any, value: Any) -> None:
        self.items[key] = value

    def append(self, value: Any) -> None:
        self.parts.append(value)

    def extend(self, values: Any) -> None:
        self.parts.extend(values)


class _InertUnpickler(pickle.Unpickler):
    def find_class(self, module: str, name: str) -> Any:
        return _Inert

    def persistent_load(self, pid: Any) -> Any:
        return None


def _find_secret(data: Any, seen: set[int]) -> str | None:
    if id(data) in seen:
        return None
    seen.add(id(data))
    if isinstance(data, dict):
        for key, value in data.items():
            if is_secret_key(str(key)) and isinstance(value, str) and value:
                return str(key)
        children: list[Any] = list(data.values())
    elif isinstance(data, (list, tuple, set, frozenset)):
        children = list(data)
    elif isinstance(data, _Inert):
        children = [*data.parts, data.items]
    else:
        return None
    for child in children:
        found = _find_secret(child, seen)
        if found is not None:
            return found
    return None
