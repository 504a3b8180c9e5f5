"""Loading a pretrained config, tokenizer or model by the name a flag gives: a storage URL,
a local directory, the Hub cache or the Hub, with one error per way it can fail."""

from __future__ import annotations

from collections.abc import Callable
from typing import TYPE_CHECKING, Any, TypeVar

from lmctl.errors import ConfigError, ModelError
from lmctl.storage import hub, locations
from lmctl.storage.paths import is_remote, local_path, looks_like_path

if TYPE_CHECKING:
    from lmctl.config.slices import Access

T = TypeVar("T")


def hub_kwargs(access: Access, revision: str) -> dict[str, Any]:
    """The keyword arguments of every ``from_pretrained`` call of a run."""
    return {
        "cache_dir": access.cache_dir,
        "revision": revision,
        "token": access.token_value(),
        "trust_remote_code": access.trust_remote_code,
    }


def load_pretrained(loader: Callable[..., T], name: str, flag: str, **kwargs: Any) -> T:
    """Load from a storage URL, a local directory, the Hub cache, or the Hub, in that order."""
    if name.startswith(f"{locations.HUB_PROTOCOL}://"):
        name = name.removeprefix(f"{locations.HUB_PROTOCOL}://")
    path = locations.localize(name, f"{flag} {name}") if is_remote(name) else local_path(name)
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"{flag} {name}: not a directory", "give a model directory")
        from safetensors import SafetensorError

        try:
            return loader(str(path), **kwargs)
        except (OSError, ValueError, KeyError, SafetensorError) as exc:
            raise ModelError(
                f"{flag} {name}: cannot load it ({first_line(exc)})",
                "give a directory written by save_pretrained (config.json, weights, tokenizer)",
            ) from exc
    if looks_like_path(name):
        raise ConfigError(f"{flag} {name}: no such directory", "check the path")
    try:
        return loader(name, local_files_only=True, **kwargs)
    except (OSError, ValueError):
        pass
    hub.require_hub(f"{flag} {name}")
    try:
        return loader(name, **kwargs)
    except Exception as exc:
        # The Hub's answer first: huggingface_hub wraps some refusals in the error it raises
        # for a file that is neither reachable nor cached.
        refused = hub.refusal(exc, f"{flag} {name}")
        if refused is not None:
            raise refused from exc
        if hub.is_connection_error(exc):
            raise hub.unreachable(f"{flag} {name}") from exc
        raise ModelError(
            f"{flag} {name}: cannot load it from the Hub ({first_line(exc)})",
            "check the repository id and --model-revision",
        ) from exc


def first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__
