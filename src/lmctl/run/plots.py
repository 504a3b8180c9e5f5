"""``loss.png`` in a run directory: train and eval loss (overall and of each validation
source), and the learning rate, against step.

Drawn with matplotlib, an optional extra (``pip install 'lmctl-train[plot]'``); without it the
plot is skipped with one log line. Written atomically, so a reader never sees half a file.
"""

from __future__ import annotations

import importlib.util
from pathlib import Path
from typing import TYPE_CHECKING

from lmctl import install_hint
from lmctl.run.rundir import record_written
from lmctl.run.summary import Curves, read_curves
from lmctl.storage.atomic import atomic_write

if TYPE_CHECKING:
    from lmctl.console import Console

PLOT_FILE = "loss.png"


def write_loss_plot(run_dir: Path, console: Console) -> Path | None:
    """Draw ``run_dir/loss.png`` from its metrics log; returns its path, or None if skipped."""
    curves = read_curves(run_dir)
    if curves.empty():
        return None
    if importlib.util.find_spec("matplotlib") is None:
        console.info(f"matplotlib is not installed: no {PLOT_FILE} ({install_hint('plot')})")
        return None
    path = run_dir / PLOT_FILE
    atomic_write(path, render_png(curves, title=run_dir.name))
    record_written(run_dir, PLOT_FILE)
    return path


def render_png(curves: Curves, title: str) -> bytes:
    import io

    import matplotlib

    matplotlib.use("Agg")
    from matplotlib.figure import Figure

    figure = Figure(figsize=(8, 6), dpi=100, layout="constrained")
    loss_axes, lr_axes = figure.subplots(2, 1, sharex=True, height_ratios=(3, 1))
    if curves.train_loss:
        steps, values = zip(*curves.train_loss, strict=True)
        loss_axes.plot(steps, values, label="train loss", color="tab:blue")
    if curves.eval_loss:
        steps, values = zip(*curves.eval_loss, strict=True)
        loss_axes.plot(steps, values, "o-", label="eval loss", color="tab:orange")
    for index, (name, points) in enumerate(curves.source_eval_loss.items()):
        if points:
            steps, values = zip(*points, strict=True)
            # Past the colours of the train loss, eval loss and learning rate (C0 to C2).
            color = f"C{3 + index % 7}"
            loss_axes.plot(steps, values, "o--", label=f"eval loss {name}", color=color)
    loss_axes.set_ylabel("loss")
    loss_axes.set_title(title)
    loss_axes.grid(alpha=0.3)
    loss_axes.legend()
    if curves.learning_rate:
        steps, values = zip(*curves.learning_rate, strict=True)
        lr_axes.plot(steps, values, color="tab:green")
    lr_axes.set_ylabel("learning rate")
    lr_axes.set_xlabel("step")
    lr_axes.grid(alpha=0.3)
    buffer = io.BytesIO()
    figure.savefig(buffer, format="png")
    return buffer.getvalue()
