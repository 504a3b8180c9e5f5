"""Collecting every problem of a config, so that the user sees them all at once."""

from __future__ import annotations


class Problems:
    """Collects every problem in a config so that the user sees them all at once.

    ``command`` is the command the config is validated for: ``lmctl prepare`` needs a
    tokenizer and data but no model, and never streams.
    """

    def __init__(self, command: str = "train") -> None:
        self.items: list[tuple[str, str]] = []
        self.command = command

    def add(self, message: str, hint: str) -> None:
        self.items.append((message, hint))

    def raise_if_any(self) -> None:
        if self.items:
            raise ConfigProblems(self.items)


class ConfigProblems(ValueError):
    """Raised inside validators; the loader turns it into one ConfigError."""

    def __init__(self, items: list[tuple[str, str]]) -> None:
        super().__init__("; ".join(message for message, _ in items))
        self.items = items
