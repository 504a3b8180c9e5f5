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

from lmctl.secrets import mask_text


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


SPARK_BARS = "▁▂▃▄▅▆▇█"


def sparkline(values: list[float], width: int = 32) -> str:
    """``values`` as a line of block characters, averaged into at most ``width`` buckets."""
    finite = [v for v in values if math.isfinite(v)]
    if not finite:
        return ""
    if len(finite) > width:
        size = len(finite) / width
        finite = [
            sum(chunk) / len(chunk)
            for i in range(width)
            if (chunk := finite[int(i * size) : max(int((i + 1) * size), int(i * size) + 1)])
        ]
    low, high = min(finite), max(finite)
    span = (high - low) or 1.0
    top = len(SPARK_BARS) - 1
    return "".join(SPARK_BARS[round((v - low) / span * top)] for v in finite)


def terminal_console(**options: Any) -> Any:
    """The rich console that lmctl's messages and progress go to on a terminal (stderr unless
    ``options`` say otherwise). A message longer than the terminal is wrapped by rich at word
    boundaries; left to the terminal, it broke lines inside words."""
    from rich.console import Console as RichConsole

    return RichConsole(**{"stderr": True, "highlight": False, **options})


class _Margin:
    """A renderable drawn two columns narrower than the space it is given."""

    def __init__(self, renderable: Any) -> None:
        self.renderable = renderable

    def __rich_console__(self, console: Any, options: Any) -> Any:
        yield from console.render(self.renderable, options.update_width(options.max_width - 2))


def _margin_progress_class() -> type:
    from rich.progress import Progress

    class MarginProgress(Progress):
        """A progress display two columns narrower than the terminal. The terminal echoes
        Ctrl-C as ``^C`` at the cursor, which stands at the end of the display's line: on a
        full-width line the echo wrapped onto a new line, and the display went on drawing
        there, leaving its last line above a copy of itself."""

        def get_renderable(self) -> Any:
            return _Margin(super().get_renderable())

    return MarginProgress


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
        self._total: int | None = 0
        self._description = ""

    @property
    def rich(self) -> Any:
        if self._rich is None:
            self._rich = terminal_console()
        return self._rich

    # Messages -----------------------------------------------------------------------------
    def _line(self, level: str, message: str, style: str = "") -> None:
        message = mask_text(message)
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
        message = mask_text(message)
        hint = mask_text(hint) if hint else hint
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
    def start_progress(self, total_steps: int | None, description: str = "training") -> None:
        """``total_steps`` None: a stream, whose length is known once it has been read."""
        self._start = time.monotonic()
        self._total, self._description = total_steps, description
        if self.plain or self.options.quiet:
            self.info(description if total_steps is None else f"{description}: {total_steps} steps")
            return
        from rich.progress import BarColumn, TextColumn, TimeRemainingColumn

        steps = "step {task.completed}" + ("" if total_steps is None else "/{task.total}")
        self._progress = _margin_progress_class()(
            TextColumn("[bold]{task.description}"),
            BarColumn(),
            TextColumn(steps),
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
        if log_line and self._total is not None:  # training, which always has a length
            elapsed = time.monotonic() - self._start
            eta = elapsed / step * (self._total - step) if step else 0.0
            self.info(f"step {step}/{self._total}  {shown}  eta {format_duration(eta)}")

    def stop_progress(self, samples: int | None = None) -> None:
        """End the progress display; ``samples``: the samples that a progress without a
        length (over a stream) turned out to count, said at its end."""
        if self._progress is not None:
            self._progress.stop()
            self._progress = None
        if samples is not None and self._total is None:
            self.info(f"{self._description}: {samples} samples")

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

        table = Table(title=mask_text(title), show_header=False)
        table.add_column("metric", style="bold")
        table.add_column("value", justify="right")
        for key, value in metrics.items():
            table.add_row(key, format_number(value))
        RichConsole(file=self.out or sys.stdout, highlight=False).print(table)

    def result(self, payload: dict[str, Any]) -> None:
        """With --json, the single JSON object on stdout."""
        if self.options.json:
            self.write(json_text(payload) + "\n")

    def write(self, text: str) -> None:
        """Text that is the command's result (a table, a listing, YAML), on stdout; known
        secrets are masked."""
        stream = self.out or sys.stdout
        stream.write(mask_text(text))
        stream.flush()


def finite(data: Any) -> tuple[Any, list[str]]:
    """``data`` with every NaN or infinity replaced by None, and the dotted keys replaced.

    Strict JSON has no NaN or Infinity: a value that is not finite is written as ``null`` and
    its key listed under ``"non_finite"`` (see :func:`json_text`).
    """
    found: list[str] = []

    def walk(value: Any, where: str) -> Any:
        if hasattr(value, "item") and not isinstance(value, (dict, list, tuple, str)):
            try:
                value = value.item()
            except (TypeError, ValueError):
                return value
        if isinstance(value, float) and not math.isfinite(value):
            found.append(where)
            return None
        if isinstance(value, dict):
            return {k: walk(v, f"{where}.{k}" if where else str(k)) for k, v in value.items()}
        if isinstance(value, (list, tuple)):
            return [walk(v, f"{where}[{i}]") for i, v in enumerate(value)]
        return value

    return walk(data, ""), found


def with_non_finite_note(data: dict[str, Any]) -> dict[str, Any]:
    """A JSON object with non-finite numbers as null and a ``"non_finite"`` list naming them."""
    clean, found = finite(data)
    listed = [
        key for key in clean.get("non_finite") or [] if key not in clean or clean[key] is None
    ]
    for key in found:
        if key not in listed:
            listed.append(key)
    if listed:
        clean["non_finite"] = listed
    else:
        clean.pop("non_finite", None)
    return dict(clean)


def json_text(data: dict[str, Any], **kwargs: Any) -> str:
    """Strict JSON (no NaN or Infinity) of one object; see :func:`with_non_finite_note`."""
    return json.dumps(with_non_finite_note(data), default=str, allow_nan=False, **kwargs)


def _escape(text: str) -> str:
    from rich.markup import escape

    return escape(text)
