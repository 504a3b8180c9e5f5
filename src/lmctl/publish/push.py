"""``lmctl push`` and ``lmctl train --push-to``: the destination a flag names, and the push
itself (the run's model card regenerated first)."""

from __future__ import annotations

from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol

from lmctl.errors import ConfigError, PermissionDenied, RemoteUnreachable
from lmctl.publish.files import (
    LocalFile,
    Selection,
    for_publication,
    is_run_dir,
    select_files,
)
from lmctl.publish.hub import HubTarget
from lmctl.publish.stores import StoreTarget
from lmctl.run.card import refresh_model_card
from lmctl.storage import locations

if TYPE_CHECKING:
    from lmctl.config.slices import Access, PublishSpec
    from lmctl.console import Console

DEFAULT_MESSAGE = "Upload model trained with lmctl"


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
        with for_publication(selection.files) as files:
            listed = [{"path": item.rel, "size": item.size} for item in files]
        return {
            "dry_run": True,
            "destination": target.url,
            "files": listed,
            "bytes": sum(item["size"] for item in listed),
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
    with for_publication(selection.files) as files:
        return target.publish(files)


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

    def __init__(self, spec: PublishSpec, access: Access, console: Console) -> None:
        assert spec.push_to is not None
        self.console = console
        self.target = target_for(
            spec.push_to,
            flag="--push-to",
            console=console,
            token=access.token_value(),
            private=spec.push_private,
        )

    def check(self) -> None:
        self.target.check_access()

    def push(self, run_dir: Path) -> dict[str, Any]:
        selected = select_files(run_dir, include_checkpoints=False, include_optimizer=False)
        try:
            with for_publication(selected.files) as files:
                return self.target.publish(files)
        except (ConfigError, PermissionDenied, RemoteUnreachable) as exc:
            raise type(exc)(
                f"training finished and is saved in {run_dir}, but the push failed: {exc.message}",
                f"{exc.hint}; then push it with: lmctl push {run_dir} --to {self.target.url}",
            ) from exc
