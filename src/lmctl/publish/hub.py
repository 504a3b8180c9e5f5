"""A Hugging Face Hub model repository as a push destination: one commit for the whole
upload (the repository and the branch are created when missing)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager
from typing import TYPE_CHECKING, Any

from lmctl.errors import ConfigError, PermissionDenied, RemoteUnreachable
from lmctl.publish.files import LocalFile, human_size
from lmctl.storage import hub, locations

if TYPE_CHECKING:
    from lmctl.console import Console


class HubTarget:
    """A Hub model repository, written in one commit."""

    def __init__(
        self,
        location: locations.Location,
        *,
        token: str | None,
        private: bool,
        revision: str | None,
        message: str,
        console: Console,
    ) -> None:
        self.url = location.url
        self.repo_id = location.repo_id
        self._token = token
        self.private = private
        self.revision = revision if revision not in (None, "main") else None
        self.message = message
        self.console = console
        self._api: Any = None
        self._checked = False

    def _connect(self) -> Any:
        if self._api is not None:
            return self._api
        if not hub.hub_reachable():
            offline = " (HF_HUB_OFFLINE is set)" if hub.offline_mode() else ""
            raise RemoteUnreachable(
                f"{self.url}: the Hugging Face Hub ({hub.endpoint()}) is unreachable{offline}",
                "check the network connection (HF_ENDPOINT selects a mirror) and rerun the "
                "same command",
            )
        from huggingface_hub import HfApi

        self._api = HfApi(endpoint=hub.endpoint(), token=self._token)
        return self._api

    def check_access(self) -> None:
        if self._checked:
            return
        api = self._connect()
        namespace = self.repo_id.split("/", 1)[0]
        with self._errors():
            me = api.whoami()
            _check_hub_write(me, namespace, self.url)
            api.create_repo(self.repo_id, private=self.private or None, exist_ok=True)
            if self.revision is not None:
                api.create_branch(self.repo_id, branch=self.revision, exist_ok=True)
        self._checked = True
        self.console.info(f"{self.url}: {me.get('name', 'token')} can write here")

    def publish(self, files: list[LocalFile]) -> dict[str, Any]:
        from huggingface_hub import CommitOperationAdd

        self.check_access()
        api = self._connect()
        operations = [
            CommitOperationAdd(path_in_repo=item.rel, path_or_fileobj=str(item.path))
            for item in files
        ]
        self.console.info(
            f"uploading {len(files)} files ({human_size(sum(f.size for f in files))}) to "
            f"{self.url} in one commit"
        )
        with self._errors():
            commit = api.create_commit(
                self.repo_id,
                operations=operations,
                commit_message=self.message,
                revision=self.revision,
            )
        return {
            "destination": self.url,
            "revision": self.revision or "main",
            "commit": commit.oid,
            "commit_url": str(commit.commit_url),
            "files": [item.rel for item in files],
            "bytes": sum(item.size for item in files),
        }

    def published_files(self) -> list[str]:
        return []  # a Hub commit adds and replaces files; it never deletes any

    @contextmanager
    def _errors(self) -> Iterator[None]:
        try:
            yield
        except (ConfigError, PermissionDenied, RemoteUnreachable):
            raise
        except Exception as exc:
            raise _hub_failure(exc, self.url) from exc


def _check_hub_write(me: dict[str, Any], namespace: str, where: str) -> None:
    """Reject a read-only token or a namespace the account does not belong to."""
    access = (me.get("auth") or {}).get("accessToken") or {}
    if access.get("role") == "read":
        raise PermissionDenied(
            f"{where}: the Hub token is read-only",
            "create a token with write access at https://huggingface.co/settings/tokens",
        )
    name = me.get("name")
    orgs = {
        org.get("name"): org.get("roleInOrg") for org in me.get("orgs", []) if isinstance(org, dict)
    }
    if namespace != name and namespace not in orgs:
        raise PermissionDenied(
            f"{where}: the Hub account '{name}' cannot write to the namespace '{namespace}'",
            f"push to hf://{name}/REPO, or use a token of a member of '{namespace}'",
        )
    if orgs.get(namespace) == "read":
        raise PermissionDenied(
            f"{where}: the Hub account '{name}' has read-only access to '{namespace}'",
            f"ask an admin of '{namespace}' for write access",
        )


def _hub_failure(exc: Exception, where: str) -> Exception:
    kind = type(exc).__name__
    if kind == "LocalTokenNotFoundError":
        return PermissionDenied(
            f"{where}: no Hub token found",
            "log in with 'hf auth login', set HF_TOKEN, or pass --token-file FILE",
        )
    if hub.is_connection_error(exc):
        return RemoteUnreachable(
            f"{where}: the Hugging Face Hub ({hub.endpoint()}) is unreachable",
            "check the network connection and rerun the same command",
        )
    status = hub.http_status(exc)
    detail = str(exc).strip().splitlines()[0][:200] if str(exc).strip() else kind
    if status in (401, 403):
        return PermissionDenied(
            f"{where}: the Hub refused the credentials ({detail})",
            "check the token (HF_TOKEN, --token-file or 'hf auth login') and its write access",
        )
    if isinstance(status, int) and status >= 500:
        return RemoteUnreachable(
            f"{where}: the Hub failed ({detail})", "retry later; nothing was committed"
        )
    if isinstance(status, int):
        return ConfigError(f"{where}: the Hub rejected the request ({detail})", "check --to")
    return exc
