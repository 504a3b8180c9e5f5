"""Talking to the Hugging Face Hub: fail fast and clearly when it cannot be reached.

Without this, an offline ``from_pretrained("gpt2")`` retries for half a minute and ends in
a long OSError. lmctl first tries the local cache, then probes the Hub endpoint once with a
short timeout, and reports an unreachable Hub in one line. The probe goes through
``huggingface_hub``'s own HTTP client, so it honours ``HF_ENDPOINT``, the proxy variables
(``HTTPS_PROXY``, ``HTTP_PROXY``, ``NO_PROXY``) and ``HF_HUB_OFFLINE`` as every later
download does. Refusals are told apart by their HTTP status, never by their wording.
"""

from __future__ import annotations

import os
import socket
from functools import cache

from lmctl.errors import LmctlError, ModelError, PermissionDenied, RemoteUnreachable

PROBE_TIMEOUT_S = 3.0


def endpoint() -> str:
    return os.environ.get("HF_ENDPOINT", "https://huggingface.co").rstrip("/")


def offline_mode() -> bool:
    return any(
        os.environ.get(name, "").strip().lower() in {"1", "true", "yes", "on"}
        for name in ("HF_HUB_OFFLINE", "TRANSFORMERS_OFFLINE")
    )


@cache
def hub_reachable() -> bool:
    """Whether the endpoint answers at all (any HTTP status below 500: a proxy that cannot
    reach it answers 502/503/504)."""
    if offline_mode():
        return False
    from huggingface_hub.utils import get_session

    try:
        response = get_session().head(f"{endpoint()}/api/whoami-v2", timeout=PROBE_TIMEOUT_S)
    except Exception:  # no answer: connection, proxy, TLS or timeout failure
        return False
    return int(response.status_code) < 500


def http_status(exc: BaseException) -> int | None:
    """The HTTP status of the Hub's answer somewhere in an exception chain (huggingface_hub's
    errors carry the response; transformers wraps them in an OSError)."""
    seen: set[int] = set()
    current: BaseException | None = exc
    while current is not None and id(current) not in seen:
        seen.add(id(current))
        status = getattr(getattr(current, "response", None), "status_code", None)
        if isinstance(status, int):
            return status
        current = current.__cause__ or current.__context__
    return None


def refusal(exc: BaseException, what: str) -> LmctlError | None:
    """lmctl's error for a Hub download that failed with an HTTP status, or None."""
    status = http_status(exc)
    if status is None:
        return None
    if status in (401, 403):
        return PermissionDenied(
            f"{what}: access denied by the Hub (HTTP {status}): the repository is private or "
            "gated, or the token is missing or not allowed",
            "log in with 'hf auth login' or pass --token, and request access to the repository",
        )
    if status == 404:
        return ModelError(
            f"{what}: not found on the Hub (HTTP 404)",
            "check the repository id and --model-revision",
        )
    if status >= 500:
        return RemoteUnreachable(
            f"{what}: the Hugging Face Hub ({endpoint()}) is unreachable (HTTP {status})",
            "retry later (HF_ENDPOINT selects a mirror)",
        )
    return None


def unreachable(what: str) -> RemoteUnreachable:
    why = "HF_HUB_OFFLINE is set" if offline_mode() else f"{endpoint()} does not answer"
    return RemoteUnreachable(
        f"{what}: the Hugging Face Hub is needed but unreachable ({why}), and it is not in "
        "the local cache",
        "use a local directory or file, or connect to the network and retry "
        "(HF_ENDPOINT selects a mirror; proxies come from HTTPS_PROXY/HTTP_PROXY)",
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
