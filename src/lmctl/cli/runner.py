"""Running a command body: one place that turns failures into messages and exit codes."""

from __future__ import annotations

import os
import sys
import traceback
from collections.abc import Callable
from dataclasses import replace
from types import ModuleType
from typing import Any

import typer

from lmctl import secrets
from lmctl.console import Console, OutputOptions, own_stdout
from lmctl.distributed import is_main_process, launched, restartable
from lmctl.errors import Delegated, ExitCode, Interrupted, LmctlError, TrainingFailed
from lmctl.run.launch import end_launched_process, report_exit_code
from lmctl.run.signals import sigterm_as_interrupt


def debug_enabled() -> bool:
    return os.environ.get("LMCTL_DEBUG", "").strip().lower() in {"1", "true", "yes", "on"}


def run_command(
    body: Callable[[Console], dict[str, Any] | None], output: OutputOptions, command: str
) -> None:
    """Run ``body``; print its result; map every failure to its exit code without a traceback.

    Libraries never write to stdout meanwhile (see :func:`lmctl.console.own_stdout`): it
    carries the result only, so that ``--json`` output always parses.
    """
    if not is_main_process():
        output = replace(output, quiet=True, json=False)
    with own_stdout() as out:
        code = _run(body, Console(output, out), command)
    if launched():
        end_launched_process(code)
    if code != ExitCode.OK:
        raise typer.Exit(int(code))


def _run(
    body: Callable[[Console], dict[str, Any] | None], console: Console, command: str
) -> ExitCode:
    output = console.options
    secrets.register_environment()
    console.capture_warnings()
    sigterm_as_interrupt()
    # Only a process that its launcher may restart keeps notes (lmctl.run.restarts).
    restarts = _restart_notes()
    if restarts is not None:
        restarts.note_start()
    code = ExitCode.OK
    payload: dict[str, Any] | None = None
    try:
        payload = body(console)
    except Delegated as exc:
        raise typer.Exit(exc.exit_code) from None  # the launched processes reported it all
    except LmctlError as exc:
        console.stop_progress()
        code = exc.exit_code
        if is_main_process() or not isinstance(exc, (Interrupted, TrainingFailed)):
            # Every process stops together; the main one says why, once.
            console.error(exc.message, exc.hint)
        payload = {"error": exc.message, "hint": exc.hint, **exc.details}
        _maybe_traceback()
    except KeyboardInterrupt:
        console.stop_progress()
        code = ExitCode.INTERRUPTED
        # Outside the training loop: before its first step, or while the run's results were
        # written after its last one (a checkpoint may exist then).
        console.error(
            "interrupted outside the training loop",
            "if the run directory holds a checkpoint, `lmctl resume DIR` finishes the run; "
            "otherwise run the command again",
        )
        payload = {"error": "interrupted"}
    except Exception as exc:
        console.stop_progress()
        code = ExitCode.INTERNAL
        console.error(
            f"unexpected error: {type(exc).__name__}: {exc}",
            "rerun with LMCTL_DEBUG=1 for the traceback, and report it if it looks like a bug",
        )
        payload = {"error": f"{type(exc).__name__}: {exc}"}
        _maybe_traceback()
    if output.json:
        status = "ok" if code == ExitCode.OK else "error"
        console.result(
            {"status": status, "exit_code": int(code), "command": command, **(payload or {})}
        )
    report_exit_code(code)
    if restarts is not None:
        restarts.note_end(code, (payload or {}).get("error"))
    return code


def _restart_notes() -> ModuleType | None:
    """:mod:`lmctl.run.restarts` where the launcher may restart this process, else None (the
    module is not imported by a command that cannot be restarted)."""
    if not restartable():
        return None
    from lmctl.run import restarts

    return restarts


def _maybe_traceback() -> None:
    if debug_enabled():
        traceback.print_exc(file=sys.stderr)
