"""Custom architectures: user modules that register their own config and model classes.

A module that calls ``AutoConfig.register("my-arch", MyConfig)`` and
``AutoModelForCausalLM.register(MyConfig, MyModel)`` (or another Auto class) at import time
makes ``--model-type my-arch`` work. Such modules come from two places, both imported
before the model type is looked up:

- ``--import MODULE`` (repeatable): a module name importable from the current directory or
  the Python path, or the path of a ``.py`` file;
- installed packages that declare an entry point in the ``lmctl.models`` group; the entry
  point names a module, or a function that is called once without arguments.
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from importlib.metadata import EntryPoint, entry_points
from pathlib import Path
from types import ModuleType
from typing import TYPE_CHECKING

from lmctl.errors import ConfigError, ModelError

if TYPE_CHECKING:
    from collections.abc import Iterable

    from lmctl.console import Console

ENTRY_POINT_GROUP = "lmctl.models"

_loaded: set[str] = set()
_announced: set[str] = set()
_modules: dict[str, str] = {}


def is_file_module(name: str) -> bool:
    return name.endswith(".py")


def load_plugins(imports: Iterable[str], console: Console) -> None:
    """Import every ``--import`` module and every ``lmctl.models`` entry point, once; each is
    said once, by the first console that is not quiet (the fit check loads them quietly)."""
    for entry_point in entry_points(group=ENTRY_POINT_GROUP):
        key = f"entry point {entry_point.name}"
        if key not in _loaded:
            _load_entry_point(entry_point)
            _loaded.add(key)
        _announce(console, key, f"loaded entry point {entry_point.value}")
    for name in imports:
        if name not in _loaded:
            _modules[name] = import_user_module(name).__name__
            _loaded.add(name)
        _announce(console, name, f"imported {_modules[name]} (--import {name})")


def _announce(console: Console, key: str, text: str) -> None:
    if key not in _announced and not console.options.quiet:
        _announced.add(key)
        console.info(f"custom architectures: {text}")


def import_user_module(name: str, *, where: str | None = None) -> ModuleType:
    """The module ``name`` (a module name or a ``.py`` file); ``where`` is how messages name
    it (default ``--import NAME``)."""
    where = where or f"--import {name}"
    if is_file_module(name):
        return _import_file(name, where)
    cwd = str(Path.cwd())
    if cwd not in sys.path:
        # The console script does not put the working directory on the path; python -m does.
        sys.path.append(cwd)
    try:
        return importlib.import_module(name)
    except ModuleNotFoundError as exc:
        if exc.name is not None and name.startswith(exc.name):
            raise ConfigError(
                f"{where}: no module named '{exc.name}'",
                "give a module importable from the current directory or the Python path, "
                "or the path of a .py file",
            ) from exc
        raise _failed(where, exc, _FIX_MODULE) from exc
    except Exception as exc:
        raise _failed(where, exc, _FIX_MODULE) from exc


def _import_file(name: str, where: str) -> ModuleType:
    path = Path(name).expanduser().resolve()
    if not path.is_file():
        raise ConfigError(f"{where}: no such file", "check the path of the .py file")
    module_name = path.stem
    existing = sys.modules.get(module_name)
    if existing is not None and getattr(existing, "__file__", None) == str(path):
        return existing
    spec = importlib.util.spec_from_file_location(module_name, path)
    if spec is None or spec.loader is None:
        raise ConfigError(f"{where}: not a Python module", "give a .py file")
    module = importlib.util.module_from_spec(spec)
    # Registered so that pickling, dataloader workers and relative lookups find it by name.
    sys.modules[module_name] = module
    if str(path.parent) not in sys.path:
        sys.path.append(str(path.parent))
    try:
        spec.loader.exec_module(module)
    except Exception as exc:
        del sys.modules[module_name]
        raise _failed(where, exc, _FIX_MODULE) from exc
    return module


def _load_entry_point(entry_point: EntryPoint) -> None:
    where = f"entry point '{entry_point.name} = {entry_point.value}' ({ENTRY_POINT_GROUP})"
    try:
        loaded = entry_point.load()
        if callable(loaded) and not isinstance(loaded, ModuleType):
            loaded()
    except Exception as exc:
        raise _failed(where, exc, _FIX_MODULE + ", or uninstall the package declaring it") from exc


_FIX_MODULE = "fix the module (LMCTL_DEBUG=1 shows the traceback)"


def _failed(where: str, exc: BaseException, hint: str) -> ModelError:
    text = str(exc).strip().splitlines()
    detail = f"{type(exc).__name__}: {text[0][:200]}" if text else type(exc).__name__
    return ModelError(f"{where}: importing it failed ({detail})", hint)
