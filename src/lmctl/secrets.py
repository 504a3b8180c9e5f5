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

import os
import pickletools
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
_registered: set[str] = set()


def is_secret_key(name: str) -> bool:
    words = [word.lower() for word in _WORD_SPLIT.split(str(name)) if word]
    if not any(word in SECRET_WORDS for word in words):
        return False
    return not (len(words) == 2 and words[1] == "token" and words[0] in SPECIAL_TOKENS)


def redact(data: Any, *, drop: bool) -> Any:
    """``data`` with every secret key removed (``drop``) or its value replaced by ``***``."""
    if isinstance(data, dict):
        out: dict[Any, Any] = {}
        for key, value in data.items():
            if is_secret_key(key) and value is not None:
                if not drop:
                    out[key] = MASK
                continue
            out[key] = redact(value, drop=drop)
        return out
    if isinstance(data, (list, tuple)):
        return [redact(item, drop=drop) for item in data]
    return data


def secret_keys(data: Any, prefix: str = "") -> list[str]:
    """Dotted names of the secrets set in ``data`` (for saying what was left out)."""
    found: list[str] = []
    if isinstance(data, dict):
        for key, value in data.items():
            name = f"{prefix}{key}"
            if is_secret_key(key) and value is not None:
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
                yield value
            else:
                yield from _secret_values(value)
    elif isinstance(data, (list, tuple)):
        for item in data:
            yield from _secret_values(item)


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

    Read statically with :mod:`pickletools`: nothing in the file is executed. A secret-named
    string followed by a non-empty string value counts.
    """
    try:
        if zipfile.is_zipfile(path):
            with zipfile.ZipFile(path) as archive:
                members = [name for name in archive.namelist() if name.endswith(".pkl")]
                blobs = [archive.read(name) for name in members]
        else:
            blobs = [path.read_bytes()]
    except (OSError, zipfile.BadZipFile):
        return None
    for blob in blobs:
        previous: Any = None
        try:
            for opcode, arg, _ in pickletools.genops(blob):
                if isinstance(arg, str) and ("UNICODE" in opcode.name or "STRING" in opcode.name):
                    if isinstance(previous, str) and is_secret_key(previous) and arg:
                        return previous
                    previous = arg
                elif opcode.name not in ("MEMOIZE", "BINPUT", "LONG_BINPUT", "PUT"):
                    previous = None
        except Exception:
            continue
    return None
