"""Running lmctl for the reliability tier, and the checks every case shares.

Commands run in-process through typer's CliRunner when no process of their own is needed
(milliseconds each). Fault trials need a process to kill: they are forked from a server that
has imported torch, transformers and lmctl once, so each process starts in a fraction of a
second instead of re-importing everything.
"""

from __future__ import annotations

import hashlib
import multiprocessing
import os
import signal
import sys
import time
from collections.abc import Iterable, Mapping
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

#: Modules the fork server imports once; every forked command starts with them loaded.
PRELOAD = [
    "tests.reliability.harness",
    "torch",
    "transformers",
    "datasets",
    "transformers.trainer",
    "transformers.models.gpt2.modeling_gpt2",
    "transformers.models.bert.modeling_bert",
    "lmctl.cli.app",
    "lmctl.engine",
    "lmctl.engine.trainer",
    "lmctl.pipeline",
    "lmctl.publish.push",
]


@dataclass
class Outcome:
    """What one command did: its exit code and everything it printed."""

    argv: list[str]
    code: int
    stdout: str
    stderr: str
    exception: BaseException | None = None

    @property
    def output(self) -> str:
        return self.stdout + self.stderr

    @property
    def traceback(self) -> bool:
        return "Traceback (most recent call last)" in self.output or (
            self.exception is not None and not isinstance(self.exception, SystemExit)
        )

    def errors(self) -> list[str]:
        return [line for line in self.stderr.splitlines() if " ERROR " in line]


@dataclass
class Tally:
    """The figures of the tier's summary line."""

    cases: int = 0
    clean: int = 0
    tracebacks: int = 0
    exit_ones: int = 0
    files_changed: int = 0
    secrets: int = 0
    #: CPU seconds of the forked commands that ran to their end (not of killed ones)
    forked_cpu: float = 0.0
    #: CPU seconds of the pytest processes themselves
    pytest_cpu: float = 0.0
    notes: list[str] = field(default_factory=list)

    def add(self, other: dict[str, Any]) -> None:
        """Add the figures of another process's tally (``dataclasses.asdict`` of it)."""
        for name, value in other.items():
            setattr(self, name, getattr(self, name) + value)

    def line(self) -> str:
        return (
            f"reliability: {self.cases} cases tried, {self.clean} clean exits, "
            f"{self.tracebacks} tracebacks, {self.exit_ones} exit-1s, "
            f"{self.files_changed} user files changed, {self.secrets} secrets found"
        )


TALLY = Tally()


def record(outcome: Outcome, *, expected: int | None = None, changed: int = 0) -> None:
    """Count one case. Clean: the expected exit code (any documented one when not given),
    no traceback, not exit 1, no user file changed."""
    TALLY.cases += 1
    traceback = outcome.traceback
    TALLY.tracebacks += traceback
    TALLY.exit_ones += outcome.code == 1
    TALLY.files_changed += changed
    ok = expected is None or outcome.code == expected
    if ok and not traceback and outcome.code != 1 and not changed:
        TALLY.clean += 1


def invoke(argv: list[str], env: Mapping[str, str] | None = None) -> Outcome:
    """Run ``lmctl ARGV`` in this process, as a CI job would (no terminal, CI set)."""
    from typer.testing import CliRunner

    from lmctl.cli.app import app

    _route_log_handlers()
    environment: dict[str, str | None] = {"CI": "1", "LMCTL_DEBUG": None, **(env or {})}
    runner = CliRunner(env=environment)
    result = runner.invoke(app, argv, prog_name="lmctl", catch_exceptions=True)
    exception = result.exception if not isinstance(result.exception, SystemExit) else None
    stderr = result.stderr
    if exception is not None:
        import traceback

        stderr += "".join(traceback.format_exception(exception))
    return Outcome(list(argv), result.exit_code, result.stdout, stderr, exception)


class _CurrentStderr:
    """Writes to whatever ``sys.stderr`` is now: what a library's log handler sees in a real
    process, where stderr does not change between commands."""

    def write(self, text: str) -> int:
        return sys.stderr.write(text)

    def flush(self) -> None:
        sys.stderr.flush()


_STDERR = _CurrentStderr()


def _route_log_handlers() -> None:
    """Point the stream handlers that libraries set up during an earlier in-process command
    (bound to that command's captured, now closed, stderr) at the current stderr."""
    import logging

    loggers = [logging.getLogger(), *logging.Logger.manager.loggerDict.values()]
    for logger in loggers:
        for handler in getattr(logger, "handlers", []):
            if type(handler) is logging.StreamHandler and handler.stream is not _STDERR:
                handler.stream = _STDERR


def checksums(roots: Iterable[Path]) -> dict[str, str]:
    """sha256 of every file under ``roots`` (and the set of files and folders itself)."""
    out: dict[str, str] = {}
    for root in roots:
        if root.is_file():
            out[str(root)] = _sha256(root)
            continue
        if not root.exists():
            continue
        for path in sorted(root.rglob("*")):
            if path.is_symlink():
                out[str(path)] = "link:" + os.readlink(path)
            elif path.is_file():
                out[str(path)] = _sha256(path)
            elif path.is_dir():
                out[str(path)] = "dir"
    return out


def _sha256(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as handle:
        for block in iter(lambda: handle.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()


def changed_files(before: dict[str, str], after: dict[str, str]) -> list[str]:
    """Files changed, removed or added between two :func:`checksums`."""
    return sorted(
        name for name in before.keys() | after.keys() if before.get(name) != after.get(name)
    )


# Forked processes -------------------------------------------------------------------------

_CONTEXT: Any = None


def _context() -> Any:
    global _CONTEXT
    if _CONTEXT is None:
        _CONTEXT = multiprocessing.get_context("forkserver")
        _CONTEXT.set_forkserver_preload(PRELOAD)
    return _CONTEXT


def _child(argv: list[str], env: dict[str, str], cwd: str, log: str) -> None:
    """Body of a forked command: lmctl's own entry point, its output in two files."""
    os.chdir(cwd)
    os.environ.clear()
    os.environ.update(env)
    out = os.open(log + ".out", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    err = os.open(log + ".err", os.O_WRONLY | os.O_CREAT | os.O_TRUNC, 0o644)
    os.dup2(out, 1)
    os.dup2(err, 2)
    sys.stdout = open(1, "w", encoding="utf-8", closefd=False, buffering=1)  # noqa: SIM115
    sys.stderr = open(2, "w", encoding="utf-8", closefd=False, buffering=1)  # noqa: SIM115
    sys.argv = ["lmctl", *argv]
    signal.signal(signal.SIGINT, signal.default_int_handler)
    code = 0
    try:
        from lmctl.cli.app import main

        main()
    except SystemExit as exc:
        code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
    except BaseException:
        import traceback

        traceback.print_exc()
        code = 1
    sys.stdout.flush()
    sys.stderr.flush()
    import resource

    usage = resource.getrusage(resource.RUSAGE_SELF)
    Path(log + ".cpu").write_text(f"{usage.ru_utime + usage.ru_stime:.3f}\n")
    os._exit(code)


class Forked:
    """One lmctl command in a process of its own, forked from the preloaded server."""

    def __init__(
        self,
        argv: list[str],
        log: Path,
        env: Mapping[str, str] | None = None,
        cwd: Path | None = None,
    ) -> None:
        self.argv = [str(arg) for arg in argv]
        self.log = log
        environment = {**os.environ, "CI": "1", **(env or {})}
        environment.pop("LMCTL_DEBUG", None)
        self.process = _context().Process(
            target=_child,
            args=(self.argv, environment, str(cwd or Path.cwd()), str(log)),
            daemon=True,
        )
        self.process.start()
        self.started = time.monotonic()

    @property
    def stderr(self) -> str:
        return _read(self.log.with_name(self.log.name + ".err"))

    @property
    def stdout(self) -> str:
        return _read(self.log.with_name(self.log.name + ".out"))

    def alive(self) -> bool:
        return bool(self.process.is_alive())

    def wait_for(self, predicate: Any, timeout: float = 120.0, poll: float = 0.002) -> bool:
        """Poll until ``predicate()`` holds (True) or the process ended first (False)."""
        deadline = time.monotonic() + timeout
        while time.monotonic() < deadline:
            if predicate():
                return True
            if not self.alive():
                return bool(predicate())
            time.sleep(poll)
        raise TimeoutError(f"lmctl {' '.join(self.argv)}: waited {timeout}s\n{self.stderr}")

    def kill(self) -> bool:
        """SIGKILL; True when the process was still running."""
        running = self.alive()
        if running:
            os.kill(self.process.pid, signal.SIGKILL)
        self.process.join(60)
        return running

    def wait(self, timeout: float = 300.0) -> Outcome:
        self.process.join(timeout)
        if self.process.is_alive():
            self.kill()
            raise TimeoutError(f"lmctl {' '.join(self.argv)}: still running after {timeout}s")
        cpu = self.log.with_name(self.log.name + ".cpu")
        if cpu.is_file():
            TALLY.forked_cpu += float(cpu.read_text())
        return Outcome(self.argv, self.process.exitcode, self.stdout, self.stderr)


def forked(
    argv: list[str], log: Path, env: Mapping[str, str] | None = None, timeout: float = 300.0
) -> Outcome:
    return Forked(argv, log, env).wait(timeout)


def _read(path: Path) -> str:
    try:
        return path.read_text(encoding="utf-8", errors="replace")
    except FileNotFoundError:
        return ""
