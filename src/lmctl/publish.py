"""Publishing a trained model to the Hugging Face Hub or an fsspec object store.

What is pushed: the final model, tokenizer, config, results and the model card of a run
directory (the card is regenerated first from the run's config and ``all_results.json``), or
every file of a model directory. ``checkpoint-*`` folders only on request (whole, so that
they can be resumed). Of a checkpoint pushed on its own, only the model files: its training
state (optimizer, scheduler, RNG states, trainer state) only with ``include_optimizer``. A
model whose files do not match the manifest of its save is refused, and a
``training_args.bin`` holding a secret is never uploaded.

Hub: one commit for the whole upload through ``huggingface_hub`` (the repository and the
branch are created when missing).

Object stores: publication is atomic for readers. Files are uploaded under a staging prefix
beside the destination (``<parent>/.<name>.lmctl-staging/``) and each object's size and
checksum are verified; only then are they moved into the destination, and a manifest
(``lmctl-manifest.json``: every file with its size and SHA-256) is written last. A reader
that finds the manifest finds every file it lists. An interrupted push is re-run with the
same command: objects already verified in staging (or already in place) are not uploaded
again.
"""

from __future__ import annotations

import json
import os
import re
import signal
import uuid
from collections.abc import Iterator
from contextlib import contextmanager, suppress
from dataclasses import dataclass
from datetime import datetime, timezone
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lmctl import __version__, secrets
from lmctl.errors import ConfigError, ModelError, PermissionDenied, RemoteUnreachable
from lmctl.run import rundir
from lmctl.storage import hub, locations
from lmctl.storage.atomic import manifest_problem

if TYPE_CHECKING:
    from fsspec import AbstractFileSystem

    from lmctl.config.base import TrainConfig
    from lmctl.console import Console

DEFAULT_MESSAGE = "Upload model trained with lmctl"
#: Test hook: SIGKILL this process after it wrote N objects (simulates a crash midway).
KILL_AFTER_ENV = "LMCTL_TEST_PUSH_KILL_AFTER"
_RESUMED_NOTE = "resumed from a checkpoint"
_CARD_COMMAND = re.compile(r"^## Training\n\n```\n(.+?)\n```", re.MULTILINE | re.DOTALL)
_CARD_VERSIONS = re.compile(r"^## Framework versions\n\n((?:- \S+ .+\n?)+)", re.MULTILINE)


#: A checkpoint's training state: what resuming needs, not what loading the model needs.
TRAINING_STATE = re.compile(
    r"^(optimizer|scheduler|scaler)(_\d+)?\.(pt|bin|safetensors)$|^rng_state(_\d+)?\.pth$"
    r"|^random_states_\d+\.pkl$|^custom_checkpoint_\d+\.pkl$|^sampler(_\d+)?\.bin$"
    r"|^dl_state_dict(_\d+)?\.bin$|^trainer_state\.json$|^stream_position(-\d+)?\.json$"
    r"|^training_args\.bin$|^latest$|^zero_to_fp32\.py$|^" + re.escape(rundir.MANIFEST_FILE) + "$"
)
#: Folders of training state inside a checkpoint (DeepSpeed's ZeRO state, FSDP's optimizer).
TRAINING_STATE_DIRS = re.compile(r"^(global_step\d+|optimizer_\d+)$")
#: Pickles that may hold settings, checked for secrets before they are uploaded.
PICKLED_SETTINGS = ("training_args.bin",)


@dataclass(frozen=True)
class LocalFile:
    rel: str
    path: Path
    size: int


@dataclass(frozen=True)
class StagedFile:
    """A file that another process uploaded into the store and verified there, to be
    published at ``rel`` with the files of this one (a machine's part of a checkpoint)."""

    rel: str
    path: str
    size: int
    digests: locations.Digests


@dataclass
class Selection:
    """What a push uploads, and what it leaves behind and why."""

    files: list[LocalFile]
    training_state: list[str]
    withheld: dict[str, str]


# What is pushed ---------------------------------------------------------------------------


def is_run_dir(path: Path) -> bool:
    return (path / rundir.CONFIG_FILE).is_file()


def is_checkpoint(path: Path) -> bool:
    return bool(rundir.CHECKPOINT_PATTERN.match(path.name)) and (
        (path / rundir.MANIFEST_FILE).is_file() or (path / rundir.STATE_FILE).is_file()
    )


def collect_files(
    path: Path, *, include_checkpoints: bool, include_optimizer: bool = False
) -> list[LocalFile]:
    """The files to publish from a run or model directory, in a stable order."""
    return select_files(
        path, include_checkpoints=include_checkpoints, include_optimizer=include_optimizer
    ).files


def select_files(
    path: Path,
    *,
    include_checkpoints: bool,
    include_optimizer: bool,
    require_model: bool = True,
    leave_out: tuple[str, ...] = (),
    machine_part: bool = False,
) -> Selection:
    """The files to publish, with the training state left out of checkpoints (unless
    ``include_optimizer``) and pickled settings that hold a secret withheld.

    ``require_model=False`` takes a run that has no final model yet (a run directory being
    uploaded while it trains); the top-level entries named in ``leave_out`` are skipped.
    ``machine_part``: ``path`` is one machine's part of a checkpoint, which has no trainer
    state of its own (see lmctl.mirror); its files are checked against its manifest only.
    """
    if not path.is_dir():
        raise ConfigError(f"{path}: no such directory", "give a run directory or a model directory")
    if require_model and not (path / "config.json").is_file():
        if is_run_dir(path):
            raise ConfigError(
                f"{path}: the run has no final model (no config.json)",
                f"finish it with 'lmctl resume {path}', or push one of its checkpoint-* folders",
            )
        raise ConfigError(
            f"{path}: not a run directory ({rundir.CONFIG_FILE}) or a model directory "
            "(config.json)",
            "give the --output-dir of a run or a folder written by save_pretrained",
        )
    _check_complete(path, machine_part=machine_part)
    selection = Selection([], [], {})
    checked: set[str] = set()
    # A checkpoint pushed on its own is a model; --include-checkpoints keeps a run's
    # checkpoints whole (they are there to be resumed).
    model_only = is_checkpoint(path) and not include_optimizer
    for file in sorted(path.rglob("*")):
        rel = file.relative_to(path)
        if any(part.startswith(".") for part in rel.parts) or not file.is_file():
            continue
        if rel.as_posix() == locations.MANIFEST or rel.parts[0] in leave_out:
            continue
        in_checkpoint = bool(rundir.CHECKPOINT_PATTERN.match(rel.parts[0])) and len(rel.parts) > 1
        if in_checkpoint and not include_checkpoints:
            continue
        if in_checkpoint and rel.parts[0] not in checked:
            checked.add(rel.parts[0])
            _check_complete(path / rel.parts[0])
        if model_only and _is_state(rel.parts):
            selection.training_state.append(rel.as_posix())
            continue
        if rel.name in PICKLED_SETTINGS and (found := secrets.pickled_secret(file)) is not None:
            selection.withheld[rel.as_posix()] = found
            continue
        selection.files.append(LocalFile(rel.as_posix(), file, file.stat().st_size))
    return selection


def _is_state(parts: tuple[str, ...]) -> bool:
    return bool(TRAINING_STATE.match(parts[-1])) or bool(
        len(parts) > 1 and TRAINING_STATE_DIRS.match(parts[0])
    )


def _check_complete(path: Path, *, machine_part: bool = False) -> None:
    """Refuse a model or checkpoint whose files do not match the manifest of its save."""
    if machine_part:
        problem = manifest_problem(path, rundir.MANIFEST_FILE)
    elif is_checkpoint(path):
        problem = rundir.checkpoint_problem(path)
    else:
        problem = rundir.model_problem(path)
    if problem is not None:
        raise ModelError(
            f"{path}: the model is incomplete or corrupted ({problem}); nothing was pushed",
            "train it again, or push one of its complete checkpoints",
        )


def refresh_model_card(run_dir: Path, console: Console) -> None:
    """Regenerate a run's model card from its config and current results.

    Results may have changed since training (``lmctl eval`` updates them). The training
    command and framework versions are kept from the existing card; without one, the command
    that reproduces the run from its resolved config and the current versions are written.
    """
    from lmctl.objectives import OBJECTIVES, get_objective

    data = rundir.read_config(run_dir)
    name = data.pop("objective", None)
    if name not in OBJECTIVES:
        console.warn(f"{run_dir / rundir.CONFIG_FILE}: unknown objective {name!r}; card kept")
        return
    objective = get_objective(name)
    fields = {
        key: value for key, value in data.items() if key in objective.config_class.model_fields
    }
    # The saved config was validated when the run started; its data files may be gone since.
    config = objective.config_class.model_construct(**fields)
    card = run_dir / "README.md"
    old = card.read_text(encoding="utf-8") if card.is_file() else ""
    found = _CARD_COMMAND.search(old)
    command = found.group(1) if found else f"lmctl train {name} --config {rundir.CONFIG_FILE}"
    listed = _CARD_VERSIONS.search(old)
    versions = (
        dict(line[2:].split(" ", 1) for line in listed.group(1).strip().splitlines())
        if listed
        else None
    )
    rundir.write_model_card(
        run_dir,
        config=config,
        objective=objective,
        results=rundir.load_results(run_dir),
        engine=config.engine,
        resumed=_RESUMED_NOTE in old,
        command=command,
        versions=versions,
    )


def human_size(size: float) -> str:
    for unit in ("B", "KB", "MB", "GB"):
        if size < 1000 or unit == "GB":
            return f"{size:.0f} {unit}" if unit == "B" else f"{size:.1f} {unit}"
        size /= 1000
    return f"{size:.1f} TB"


# Destinations -----------------------------------------------------------------------------


class Target(Protocol):
    url: str

    def check_access(self) -> None:
        """Fail fast when the credentials cannot write to the destination."""

    def publish(self, files: list[LocalFile]) -> dict[str, Any]:
        """Upload ``files``; the result describes what happened."""

    def published_files(self) -> list[str]:
        """The files of a model published there before, which a push replaces and deletes
        when the new model lacks them (empty when a push never deletes)."""


def target_for(
    destination: str,
    *,
    flag: str,
    console: Console,
    token: str | None = None,
    private: bool = False,
    revision: str | None = None,
    message: str | None = None,
) -> Target:
    location = locations.parse_location(destination, flag)
    if location.is_hub:
        return HubTarget(
            location,
            token=token,
            private=private,
            revision=revision,
            message=message or DEFAULT_MESSAGE,
            console=console,
        )
    locations.filesystem_class(location.protocol, f"{flag} {destination}")
    return StoreTarget(location, console)


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


class StoreTarget:
    """An fsspec location, published through a staging prefix and a manifest written last."""

    def __init__(
        self,
        location: locations.Location,
        console: Console,
        *,
        verbose: bool = True,
        access_checked: bool = False,
    ) -> None:
        self.location = location
        self.url = location.url.rstrip("/")
        self.console = console
        #: False: no line per file and none at the end (the caller reports the upload).
        self.verbose = verbose
        #: True: the caller checked write access to this store already.
        self._checked = access_checked

    def staging_path(self, root: str) -> str:
        """A sibling of the destination, so that nothing in it shows under the destination."""
        root = root.rstrip("/")
        if self.location.protocol in locations.OBJECT_STORES and "/" not in root:
            return f"{root}/.lmctl-staging"  # the destination is a whole bucket
        parent, _, name = root.rpartition("/")
        return f"{parent}/.{name}.lmctl-staging" if name else "/.lmctl-staging"

    def _make_parent(self, fs: AbstractFileSystem, path: str) -> None:
        if self.location.protocol not in locations.OBJECT_STORES:
            fs.makedirs(path.rpartition("/")[0], exist_ok=True)

    def check_access(self) -> None:
        if self._checked:
            return
        fs, root = locations.open_location(self.location, fail_fast=True)
        staging = self.staging_path(root)
        probe = f"{staging}/.write-probe-{uuid.uuid4().hex}"
        try:
            for attempt in range(3):
                try:
                    self._make_parent(fs, probe)
                    fs.pipe_file(probe, b"lmctl write probe\n")
                    break
                except (FileNotFoundError, FileExistsError):
                    # Another process's check (each machine of a run checks at once) removed
                    # the staging folder while this one made it or wrote into it.
                    if attempt == 2:
                        raise
            fs.rm_file(probe)
        except Exception as exc:
            raise locations.failure(exc, self.url) from exc
        if self.location.protocol not in locations.OBJECT_STORES:
            with suppress(OSError):
                fs.rmdir(staging)
        self._checked = True
        if self.verbose:
            self.console.info(f"{self.url}: write access checked")

    def published_files(self) -> list[str]:
        """The files the destination's manifest lists (and an interrupted push's kept copy of
        the one before)."""
        try:
            fs, root = locations.open_location(self.location, fail_fast=True)
            listed: list[str] = []
            for manifest in (
                f"{root}/{locations.MANIFEST}",
                f"{self.staging_path(root)}/.previous-{locations.MANIFEST}",
            ):
                for item in (_read_manifest(fs, manifest) or {}).get("files", []):
                    if isinstance(item, dict) and isinstance(item.get("path"), str):
                        listed.append(item["path"])
        except Exception as exc:
            raise locations.failure(exc, self.url) from exc
        return sorted(set(listed))

    def publish(
        self, files: list[LocalFile], others: tuple[StagedFile, ...] = ()
    ) -> dict[str, Any]:
        """Publish ``files``, and ``others`` that other processes staged in the store."""
        self.check_access()
        fs, root = locations.open_location(self.location)
        try:
            return self._publish(fs, root, files, others)
        except Exception as exc:
            raise locations.failure(exc, self.url) from exc

    def upload_verified(
        self, fs: AbstractFileSystem, item: LocalFile, remote: str, digests: locations.Digests
    ) -> None:
        """Upload one file to ``remote`` and check its size and checksum there."""
        self._make_parent(fs, remote)
        locations.upload(fs, item.path, remote, item.size)
        if not locations.object_matches(fs, remote, item.size, digests):
            raise RemoteUnreachable(
                f"{self.url}: {item.rel} does not match its size or checksum after upload",
                "rerun the same command; verified objects are not uploaded again",
            )
        if self.verbose:
            self.console.info(f"uploaded {item.rel} ({human_size(item.size)}), verified")
        self._written()

    def _publish(
        self,
        fs: AbstractFileSystem,
        root: str,
        files: list[LocalFile],
        others: tuple[StagedFile, ...],
    ) -> dict[str, Any]:
        staging = self.staging_path(root)
        digests = {item.rel: locations.file_digests(item.path) for item in files}
        uploaded: list[str] = []
        reused: list[str] = []
        in_place: set[str] = set()
        for item in files:
            staged, final = f"{staging}/{item.rel}", f"{root}/{item.rel}"
            if locations.object_matches(fs, staged, item.size, digests[item.rel]):
                reused.append(item.rel)
                continue
            if locations.object_matches(fs, final, item.size, digests[item.rel]):
                reused.append(item.rel)
                in_place.add(item.rel)
                continue
            self.upload_verified(fs, item, staged, digests[item.rel])
            uploaded.append(item.rel)
        moves = [
            (item.rel, f"{staging}/{item.rel}", item.size, digests[item.rel]) for item in files
        ]
        # Another process's files: moved already when an earlier attempt stopped midway.
        for other in others:
            moves.append((other.rel, other.path, other.size, other.digests))
            final = f"{root}/{other.rel}"
            if not fs.exists(other.path) and locations.object_matches(
                fs, final, other.size, other.digests, read_back=False
            ):
                in_place.add(other.rel)
        # From here on the destination changes: first take its manifest away (kept in
        # staging, so that a re-run still knows which old files to remove).
        manifest_path = f"{root}/{locations.MANIFEST}"
        kept_manifest = f"{staging}/.previous-{locations.MANIFEST}"
        if _read_manifest(fs, manifest_path) is not None:
            self._make_parent(fs, kept_manifest)
            fs.mv(manifest_path, kept_manifest)
        previous = _read_manifest(fs, kept_manifest)
        for rel, source, size, digest in moves:
            if rel in in_place:
                continue
            final = f"{root}/{rel}"
            self._make_parent(fs, final)
            fs.mv(source, final)
            # Verified in staging already: a move inside the store is not downloaded again.
            if not locations.object_matches(fs, final, size, digest, read_back=False):
                raise RemoteUnreachable(
                    f"{self.url}: {rel} does not match its checksum after moving it into place",
                    "rerun the same command",
                )
            self._written()
        current = {rel for rel, *_ in moves}
        for old in (previous or {}).get("files", []):
            if old.get("path") not in current:
                with suppress(FileNotFoundError):  # already removed by an interrupted run
                    fs.rm_file(f"{root}/{old['path']}")
        manifest = {
            "format": "lmctl-manifest/1",
            "lmctl_version": __version__,
            "created": datetime.now(timezone.utc).isoformat(timespec="seconds"),
            "files": [
                {"path": rel, "size": size, "sha256": digest.sha256}
                for rel, _, size, digest in moves
            ],
        }
        self._write_last(fs, staging, manifest_path, manifest)
        if fs.exists(staging):
            fs.rm(staging, recursive=True)
        if self.verbose:
            self.console.info(
                f"published {len(moves)} files to {self.url} ({len(uploaded)} uploaded, "
                f"{len(reused)} already verified)"
            )
        return {
            "destination": self.url,
            "manifest": f"{self.url}/{locations.MANIFEST}",
            "files": [rel for rel, *_ in moves],
            "bytes": sum(size for _, _, size, _ in moves),
            "uploaded": uploaded,
            "reused": reused,
        }

    def _write_last(
        self, fs: AbstractFileSystem, staging: str, final: str, manifest: dict[str, Any]
    ) -> None:
        """The manifest goes through staging too, so that it appears whole or not at all."""
        self.write_json(fs, final, manifest, staged=f"{staging}/{locations.MANIFEST}")

    def write_json(
        self, fs: AbstractFileSystem, path: str, data: dict[str, Any], *, staged: str = ""
    ) -> None:
        """A small JSON object that appears whole or not at all: written beside (or at
        ``staged``), then moved into place."""
        staged = staged or f"{path}.{uuid.uuid4().hex}.tmp"
        self._make_parent(fs, staged)
        fs.pipe_file(staged, (json.dumps(data, indent=2) + "\n").encode())
        self._make_parent(fs, path)
        fs.mv(staged, path)
        self._written()

    def _written(self) -> None:
        _WRITES[0] += 1  # counted over the process (a remote run publishes many times)
        limit = os.environ.get(KILL_AFTER_ENV)
        if limit and _WRITES[0] >= int(limit):
            os.kill(os.getpid(), signal.SIGKILL)


#: Objects this process wrote to stores (for the test hook ``LMCTL_TEST_PUSH_KILL_AFTER``).
_WRITES = [0]


def _read_manifest(fs: AbstractFileSystem, path: str) -> dict[str, Any] | None:
    try:
        with fs.open(path, "rb") as handle:
            data = json.loads(handle.read())
    except FileNotFoundError:
        return None
    except ValueError:
        return {}
    return data if isinstance(data, dict) else {}


# Entry points -----------------------------------------------------------------------------


def push(
    path: Path,
    target: Target,
    *,
    include_checkpoints: bool,
    dry_run: bool,
    console: Console,
    include_optimizer: bool = False,
) -> dict[str, Any]:
    """``lmctl push``: refresh a run's model card, then publish (or list, with ``dry_run``:
    the files it would upload, and those of another model at the destination it would
    delete)."""
    options: dict[str, Any] = {
        "include_checkpoints": include_checkpoints,
        "include_optimizer": include_optimizer,
    }
    selection = select_files(path, **options)
    _report_left_out(selection, console)
    if dry_run:
        current = {item.rel for item in selection.files}
        return {
            "dry_run": True,
            "destination": target.url,
            "files": [{"path": item.rel, "size": item.size} for item in selection.files],
            "bytes": sum(item.size for item in selection.files),
            "delete": [rel for rel in target.published_files() if rel not in current],
            "left_out": selection.training_state,
            "withheld": sorted(selection.withheld),
        }
    target.check_access()
    if is_run_dir(path):
        refresh_model_card(path, console)
        selection = select_files(path, **options)
    elif not (path / "README.md").is_file():
        console.warn(f"{path} has no model card (README.md); pushing without one")
    return target.publish(selection.files)


def _report_left_out(selection: Selection, console: Console) -> None:
    if selection.training_state:
        console.info(
            f"leaving out {len(selection.training_state)} files of checkpoint training state "
            "(optimizer, scheduler, RNG and trainer state); --include-optimizer pushes them"
        )
    for rel, key in selection.withheld.items():
        console.warn(f"not pushing {rel}: it holds a secret ({key})")


class PushAfterTraining:
    """``lmctl train --push-to``: write access checked before training, the push at the end."""

    def __init__(self, config: TrainConfig, console: Console) -> None:
        assert config.push_to is not None
        self.console = console
        self.target = target_for(
            config.push_to,
            flag="--push-to",
            console=console,
            token=config.token_value(),
            private=config.push_private,
        )

    def check(self) -> None:
        self.target.check_access()

    def push(self, run_dir: Path) -> dict[str, Any]:
        files = collect_files(run_dir, include_checkpoints=False)
        try:
            return self.target.publish(files)
        except (ConfigError, PermissionDenied, RemoteUnreachable) as exc:
            raise type(exc)(
                f"training finished and is saved in {run_dir}, but the push failed: {exc.message}",
                f"{exc.hint}; then push it with: lmctl push {run_dir} --to {self.target.url}",
            ) from exc
