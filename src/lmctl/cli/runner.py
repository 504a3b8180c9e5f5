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
from lmctl.run.launch import collects_errors, end_launched_process, report_outcome
from lmctl.run.signals import exit_quietly_on_signal, sigterm_as_interrupt


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
        # Torch's warnings from C++ once, from the main process (torch reads this when it
        # loads; lmctl has not imported it yet).
        os.environ.setdefault("TORCH_CPP_LOG_LEVEL", "ERROR")
    with own_stdout() as out:
        code = _run(body, Console(output, out), command)
    exit_quietly_on_signal(int(code))
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
    #: The error this process stops with, and whether it said it (see :func:`_say`).
    error: dict[str, Any] | None = None
    try:
        payload = body(console)
    except Delegated as exc:
        raise typer.Exit(exc.exit_code) from None  # the launched processes reported it all
    except LmctlError as exc:
        console.stop_progress()
        code = exc.exit_code
        if is_main_process() or not isinstance(exc, (Interrupted, TrainingFailed)):
            # Every process stops together; the main one says why, once.
            error = _say(console, exc.message, exc.hint, interruption=isinstance(exc, Interrupted))
        payload = {"error": exc.message, "hint": exc.hint, **exc.details}
        _maybe_traceback()
    except KeyboardInterrupt:
        console.stop_progress()
        code = ExitCode.INTERRUPTED
        # Outside the training loop: before its first step, or while the run's results were
        # written after its last one (a checkpoint may exist then).
        if is_main_process():  # every process was interrupted; the main one says so
            error = _say(
                console,
                "interrupted outside the training loop",
                "if the run directory holds a checkpoint, `lmctl resume DIR` finishes the run; "
                "otherwise run the command again",
                interruption=True,
            )
        payload = {"error": "interrupted"}
    except Exception as exc:
        console.stop_progress()
        code = ExitCode.INTERNAL
        error = _say(
            console,
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
    report_outcome(code, error)
    if restarts is not None:
        restarts.note_end(code, (payload or {}).get("error"))
    return code


def _say(
    console: Console, message: str, hint: str | None, *, interruption: bool = False
) -> dict[str, Any]:
    """Print an error where no other process will. In a run that lmctl launched
    (:mod:`lmctl.run.launch`) the process that launched it says the errors of the other
    processes once each, and the main process's interruption unless it follows another
    process's failure (the launcher stops every process when one fails)."""
    said = not collects_errors() or (is_main_process() and not interruption)
    if said:
        console.error(message, hint)
    return {"error": message, "hint": hint, "said": said}


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
