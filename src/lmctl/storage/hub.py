"""Talking to the Hugging Face Hub: fail fast and clearly when it cannot be reached.

Without this, an offline ``from_pretrained("gpt2")`` retries for half a minute and ends in
a long OSError. lmctl first tries the local cache, then probes the Hub endpoint once with a
short timeout, and reports an unreachable Hub in one line.
"""

from __future__ import annotations

import os
import socket
from functools import cache
from urllib.parse import urlparse

from lmctl.errors import RemoteUnreachable

PROBE_TIMEOUT_S = 3.0


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def offline_mode() -> bool:
    return os.environ.get("HF_HUB_OFFLINE", "").strip().lower() in {"1", "true", "yes", "on"}


@cache
def hub_reachable() -> bool:
    if offline_mode():
        return False
    url = urlparse(endpoint())
    port = url.port or (443 if url.scheme == "https" else 80)
    try:
        with socket.create_connection((url.hostname or "", port), timeout=PROBE_TIMEOUT_S):
            return True
    except OSError:
        return False


def unreachable(what: str) -> RemoteUnreachable:
    return RemoteUnreachable(
        f"{what}: the Hugging Face Hub ({endpoint()}) is unreachable and it is not in the "
        "local cache",
        "use a local directory or file, or connect to the network and retry "
        "(HF_ENDPOINT selects a mirror)",
    )


def require_hub(what: str) -> None:
    if not hub_reachable():
        raise unreachable(what)


def is_connection_error(exc: BaseException) -> bool:
    """Whether an exception chain bottoms out in a network failure."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        name = type(current).__name__
        if isinstance(current, (ConnectionError, socket.gaierror, TimeoutError)) or name in {
            "ConnectError",
            "ConnectTimeout",
            "LocalEntryNotFoundError",
            "OfflineModeIsEnabled",
        }:
            return True
        current = current.__cause__ or current.__context__
    return False
