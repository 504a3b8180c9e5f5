"""Everything lmctl shows a person or a CI log.

Two faces: on a terminal a rich live progress display; otherwise (stdout or stderr not a
terminal, ``CI`` set, or ``--no-progress``) plain timestamped lines with no ANSI escapes and
no carriage returns. Logs and progress go to stderr; stdout carries only the final result
(a summary table, or exactly one JSON object with ``--json``).

lmctl owns stdout: while a command runs, :func:`own_stdout` points file descriptor 1 at
stderr, so whatever a library prints (from Python, from C code, or from a logger bound to
stdout) lands in the log, and lmctl writes its result to the original stdout.
"""

from __future__ import annotations

import contextlib
import io
import json
import math
import os
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import datetime
from typing import Any, TextIO


@dataclass(frozen=True)
class OutputOptions:
    json: bool = False
    quiet: bool = False
    no_progress: bool = False


def _is_terminal(stream: TextIO) -> bool:
    try:
        return stream.isatty()
    except (AttributeError, ValueError):
        return False


def plain_output(no_progress: bool = False, out: TextIO | None = None) -> bool:
    if no_progress or os.environ.get("CI") or os.environ.get("NO_COLOR"):
        return True
    return not (_is_terminal(out or sys.stdout) and _is_terminal(sys.stderr))


@contextlib.contextmanager
def own_stdout() -> Iterator[TextIO]:
    """Send everything written to stdout to stderr, at the file-descriptor level, and yield
    a stream on the original stdout for lmctl's own result.

    When ``sys.stdout`` is not file descriptor 1 (a test runner captures it), the stream is
    ``sys.stdout`` itself and nothing is redirected.
    """
    try:
        is_fd1 = sys.stdout.fileno() == 1
    except (AttributeError, ValueError, io.UnsupportedOperation):
        is_fd1 = False
    if not is_fd1:
        yield sys.stdout
        return
    sys.stdout.flush()
    saved = os.dup(1)
    out = open(saved, "w", encoding="utf-8", closefd=True)  # noqa: SIM115
    os.dup2(2, 1)
    try:
        yield out
    finally:
        with contextlib.suppress(OSError, ValueError):
            sys.stdout.flush()
        out.flush()
        os.dup2(saved, 1)
        out.close()


def format_number(value: Any) -> str:
    if isinstance(value, float):
        if math.isnan(value) or math.isinf(value):
            return str(value)
        if value != 0 and (abs(value) < 1e-3 or abs(value) >= 1e6):
            return f"{value:.3e}"
        return f"{value:.4f}".rstrip("0").rstrip(".") if value % 1 else f"{value:.1f}"
    return str(value)


def format_duration(seconds: float) -> str:
    seconds = max(0, int(seconds))
    hours, rest = divmod(seconds, 3600)
    minutes, secs = divmod(rest, 60)
    return f"{hours}:{minutes:02d}:{secs:02d}"


class Console:
    def __init__(self, options: OutputOptions | None = None, out: TextIO | None = None) -> None:
        self.options = options or OutputOptions()
        #: Where lmctl's own result goes (stdout, or the original stdout under own_stdout()).
        self.out = out
        self.plain = plain_output(self.options.no_progress, out)
        self._rich: Any = None
        self._progress: Any = None
        self._task: Any = None
        self._start = 0.0
        self._total = 0

    @property
    def rich(self) -> Any:
        if self._rich is None:
            from rich.console import Console as RichConsole

            self._rich = RichConsole(stderr=True, highlight=False, soft_wrap=True)
        return self._rich

    # Messages -----------------------------------------------------------------------------
    def _line(self, level: str, message: str, style: str = "") -> None:
        if self.plain:
            stamp = datetime.now().strftime("%Y-%m-%dT%H:%M:%S")
            sys.stderr.write(f"{stamp} {level:<5} {message}\n")
            sys.stderr.flush()
        else:
            prefix = f"[{style}]{level.lower()}:[/{style}] " if level != "INFO" else ""
            self.rich.print(prefix + _escape(message))

    def info(self, message: str) -> None:
        if not self.options.quiet:
            self._line("INFO", message)

    def warn(self, message: str) -> None:
        self._line("WARN", message, "yellow")

    def error(self, message: str, hint: str | None = None) -> None:
        if self.plain:
            self._line("ERROR", message if not hint else f"{message} (hint: {hint})")
            return
        self.rich.print(f"[bold red]error:[/bold red] {_escape(message)}")
        if hint:
            self.rich.print(f"[dim]hint:[/dim] {_escape(hint)}")

    def capture_warnings(self) -> None:
        """Show Python warnings from libraries as lmctl warnings, each message once."""
        import warnings

        seen: set[str] = set()

        def show(message: Any, category: Any, filename: str, lineno: int, *args: Any) -> None:
            text = f"{category.__name__}: {message}"
            if text not in seen:
                seen.add(text)
                self.warn(text)

        warnings.showwarning = show  # type: ignore[assignment]

    # Progress -----------------------------------------------------------------------------
    def start_progress(self, total_steps: int, description: str = "training") -> None:
        self._start = time.monotonic()
        self._total = total_steps
        if self.plain or self.options.quiet:
            self.info(f"{description}: {total_steps} steps")
            return
        from rich.progress import BarColumn, Progress, TextColumn, TimeRemainingColumn

        self._progress = Progress(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn("step {task.completed}/{task.total}"),
            TextColumn("{task.fields[stats]}"),
            TimeRemainingColumn(),
            console=self.rich,
            transient=False,
        )
        self._progress.start()
        self._task = self._progress.add_task(description, total=total_steps, stats="")

    def update_progress(self, step: int, stats: dict[str, Any], *, log_line: bool) -> None:
        shown = "  ".join(f"{key} {format_number(value)}" for key, value in stats.items())
        if self._progress is not None:
            self._progress.update(self._task, completed=step, stats=shown)
            return
        if log_line:
            elapsed = time.monotonic() - self._start
            eta = elapsed / step * (self._total - step) if step else 0.0
            self.info(f"step {step}/{self._total}  {shown}  eta {format_duration(eta)}")

    def stop_progress(self) -> None:
        if self._progress is not None:
            self._progress.stop()
            self._progress = None

    # Results ------------------------------------------------------------------------------
    def summary(self, title: str, metrics: dict[str, Any]) -> None:
        """The end-of-run table on stdout (with --json the JSON object replaces it)."""
        if self.options.json:
            return
        if self.plain:
            width = max((len(key) for key in metrics), default=0)
            lines = [title] + [
                f"  {key:<{width}}  {format_number(v)}" for key, v in metrics.items()
            ]
            self.write("\n".join(lines) + "\n")
            return
        from rich.console import Console as RichConsole
        from rich.table import Table

        table = Table(title=title, show_header=False)
        table.add_column("metric", style="bold")
        table.add_column("value", justify="right")
        for key, value in metrics.items():
            table.add_row(key, format_number(value))
        RichConsole(file=self.out or sys.stdout, highlight=False).print(table)

    def result(self, payload: dict[str, Any]) -> None:
        """With --json, the single JSON object on stdout."""
        if self.options.json:
            self.write(json.dumps(payload, default=str) + "\n")

    def write(self, text: str) -> None:
        """Text that is the command's result (a table, a listing, YAML), on stdout."""
        stream = self.out or sys.stdout
        stream.write(text)
        stream.flush()


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
