"""One error hierarchy: every user-facing failure maps to one exit code and one message.

A message names what is wrong (the flag, file or line) and a hint names the fix. The CLI
prints ``error: <message>`` and ``hint: <hint>`` and exits with ``exit_code``; no traceback
unless ``LMCTL_DEBUG=1``.
"""

from __future__ import annotations

from enum import IntEnum
from typing import Any


class ExitCode(IntEnum):
    OK = 0
    INTERNAL = 1
    USAGE = 2
    DATA = 3
    TRAINING_FAILED = 4
    MODEL = 5
    REMOTE_UNREACHABLE = 6
    PERMISSION = 7
    INTERRUPTED = 130


EXIT_CODE_DOCS: dict[ExitCode, str] = {
    ExitCode.OK: "success",
    ExitCode.INTERNAL: "internal error (a bug: rerun with LMCTL_DEBUG=1 and report the traceback)",
    ExitCode.USAGE: "usage or configuration error (bad flag, config file, missing input file)",
    ExitCode.DATA: "data error (empty or malformed data, missing column)",
    ExitCode.TRAINING_FAILED: (
        "training failed (non-finite loss or a full disk); the last good checkpoint is kept"
    ),
    ExitCode.MODEL: "model or tokenizer could not be loaded or built",
    ExitCode.REMOTE_UNREACHABLE: (
        "the Hub or an object store could not be reached (a run whose uploads to a remote "
        "--output-dir keep failing, or whose store stops answering past the retry budget, "
        "stops with it and keeps its local copy)"
    ),
    ExitCode.PERMISSION: "permission denied or credentials rejected",
    ExitCode.INTERRUPTED: "interrupted (Ctrl-C or SIGTERM); a checkpoint was saved when possible",
}


class LmctlError(Exception):
    """Base class for errors a user can act on."""

    exit_code: ExitCode = ExitCode.INTERNAL

    def __init__(
        self, message: str, hint: str | None = None, details: dict[str, Any] | None = None
    ) -> None:
        super().__init__(message)
        self.message = message
        self.hint = hint
        #: Extra keys of the ``--json`` result object (e.g. every problem of a config file).
        self.details = details or {}


class ConfigError(LmctlError):
    exit_code = ExitCode.USAGE


class DataError(LmctlError):
    exit_code = ExitCode.DATA


class TrainingFailed(LmctlError):
    exit_code = ExitCode.TRAINING_FAILED


class ModelError(LmctlError):
    exit_code = ExitCode.MODEL


class RemoteUnreachable(LmctlError):
    exit_code = ExitCode.REMOTE_UNREACHABLE


class PermissionDenied(LmctlError):
    exit_code = ExitCode.PERMISSION


class Interrupted(LmctlError):
    exit_code = ExitCode.INTERRUPTED


class Delegated(Exception):
    """The command ran in the processes of a launcher (``--nproc``), which reported its
    outcome themselves; this process only passes their exit code on."""

    def __init__(self, exit_code: int) -> None:
        super().__init__(f"exit code {exit_code}")
        self.exit_code = exit_code
