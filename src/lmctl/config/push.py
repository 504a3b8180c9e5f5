"""The validated options of ``lmctl push``."""

from __future__ import annotations

from pathlib import Path

from pydantic import SecretStr, model_validator

from lmctl import secrets
from lmctl.config.base import Problems, StrictModel
from lmctl.config.fields import PANEL_HUB, PANEL_PUBLISH, option
from lmctl.errors import ConfigError


class PushConfig(StrictModel):
    """Where and what to publish; the source directory is the command's argument."""

    to: str | None = option(
        None,
        "Destination: hf://NAMESPACE/REPO, s3://BUCKET/PREFIX, gs://..., oss://..., "
        "hdfs://... or file:///PATH (any fsspec URL).",
        panel=PANEL_PUBLISH,
    )
    include_checkpoints: bool = option(
        False, "Also publish the run's checkpoint-* folders.", panel=PANEL_PUBLISH
    )
    include_optimizer: bool = option(
        False,
        "Pushing a checkpoint: also publish its training state (optimizer, scheduler, RNG "
        "states, trainer state), which only resuming needs; by default its model files only.",
        panel=PANEL_PUBLISH,
    )
    private: bool = option(
        False,
        "Create the repository as private (an existing one keeps its visibility).",
        panel=PANEL_HUB,
    )
    revision: str | None = option(
        None, "Branch to commit to (created when missing; default main).", panel=PANEL_HUB
    )
    message: str | None = option(None, "Commit message.", panel=PANEL_HUB)
    token: SecretStr | None = option(
        None,
        "Hub token (default: HF_TOKEN or the cached login). Never printed or written.",
        panel=PANEL_HUB,
        secret=True,
        exclude=True,
    )
    token_file: str | None = option(
        None,
        "Read the Hub token from this file (keeps it out of the shell history).",
        panel=PANEL_HUB,
    )

    @model_validator(mode="after")
    def _cross_field_rules(self) -> PushConfig:
        from lmctl.storage.locations import parse_location

        problems = Problems()
        if self.to is None:
            problems.add("--to is required", "e.g. --to hf://my-user/my-model or --to s3://b/p")
        else:
            try:
                location = parse_location(self.to, "--to")
            except ConfigError as exc:
                problems.add(exc.message, exc.hint or "")
            else:
                if not location.is_hub:
                    for name, value in (
                        ("--private", self.private),
                        ("--revision", self.revision),
                        ("--message", self.message),
                        ("--token", self.token),
                        ("--token-file", self.token_file),
                    ):
                        if value:
                            problems.add(
                                f"{name} only applies to a Hub destination (hf://)",
                                f"drop {name}; object stores take their credentials from the "
                                "provider's environment variables or config files",
                            )
        if self.token is not None and self.token_file is not None:
            problems.add("--token and --token-file can't both be given", "choose one")
        if self.token_file is not None and not Path(self.token_file).expanduser().is_file():
            problems.add(f"--token-file {self.token_file}: no such file", "check the path")
        problems.raise_if_any()
        return self

    def token_value(self) -> str | None:
        if self.token is not None:
            secrets.register(self.token.get_secret_value())
            return self.token.get_secret_value()
        if self.token_file is not None:
            path = Path(self.token_file).expanduser()
            try:
                value = path.read_text(encoding="utf-8").strip()
            except (OSError, UnicodeDecodeError) as exc:
                raise ConfigError(
                    f"--token-file {self.token_file}: cannot read it ({type(exc).__name__})",
                    "check the file and its permissions",
                ) from None
            if not value:
                raise ConfigError(
                    f"--token-file {self.token_file}: the file is empty",
                    "write the token (hf_...) into it",
                )
            secrets.register(value)
            return value
        return None
