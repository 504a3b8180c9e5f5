"""The suite's figures: runs of lmctl and the baseline alternating, and the page of them.

A :class:`Figure` holds the repetitions of one measure on both sides; ``interleave`` makes
them (A B A B ...) and ``render`` writes the page that ``benchmarks/run.py`` saves.
"""

from __future__ import annotations

import argparse
import statistics
import subprocess
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import Any


@dataclass
class Figure:
    """One row of the table: a measure of lmctl and of the baseline, reps of each."""

    section: str
    name: str
    unit: str
    lmctl: list[float]
    baseline: list[float] = field(default_factory=list)
    #: "higher" (throughput: ratio lmctl/baseline) or "lower" (time: ratio baseline/lmctl).
    better: str = "higher"
    target: float | None = None
    note: str = ""

    def ratio(self) -> float | None:
        """lmctl's speed-up over the baseline (of medians); None where it has no meaning: a
        "lower" figure of lmctl at or below zero (say, no measurable memory growth)."""
        if not self.baseline or not self.lmctl:
            return None
        a, b = statistics.median(self.lmctl), statistics.median(self.baseline)
        if self.better == "higher":
            return a / b if b > 0 else None
        return b / a if a > 0 else None

    def met(self) -> bool | None:
        """Whether lmctl's median reaches the target: against the baseline's median, at least
        ``target`` times higher, or at most 1/``target`` of it (at or below zero included);
        without a baseline, at least ``target`` itself (a fraction of a peak)."""
        if self.target is None or not self.lmctl:
            return None
        a = statistics.median(self.lmctl)
        if not self.baseline:
            return a >= self.target
        b = statistics.median(self.baseline)
        return a >= self.target * b if self.better == "higher" else a * self.target <= b


def spread(values: list[float]) -> str:
    if not values:
        return "-"
    return f"{fmt(min(values))} / {fmt(statistics.median(values))} / {fmt(max(values))}"


def fmt(value: float) -> str:
    if value == 0:
        return "0"
    if abs(value) >= 1000:
        return f"{value:,.0f}"
    if abs(value) >= 10:
        return f"{value:.1f}"
    return f"{value:.3g}"


#: Seconds spent in the baseline's runs (its side of every comparison) in this process.
#: ("stack": start-up's baseline, importing the libraries.)
BASELINE_SECONDS = [0.0]


def interleave(reps: int, sides: dict[str, Callable[[], Any]]) -> dict[str, list[Any]]:
    """Run every side once per round, in order, ``reps`` rounds."""
    results: dict[str, list[Any]] = {name: [] for name in sides}
    for _ in range(reps):
        for name, function in sides.items():
            started = time.perf_counter()
            results[name].append(function())
            if name in {"baseline", "stack"}:
                BASELINE_SECONDS[0] += time.perf_counter() - started
    return results


def wall(command: list[str], env: dict[str, str], ok_codes: tuple[int, ...] = (0,)) -> float:
    started = time.perf_counter()
    done = subprocess.run(command, env=env, capture_output=True, text=True, check=False)
    elapsed = time.perf_counter() - started
    if done.returncode not in ok_codes:
        sys.stderr.write(done.stderr[-3000:])
        raise SystemExit(f"{command[:4]} exited {done.returncode}")
    return elapsed


# Report --------------------------------------------------------------------------------------
#: The groups of sections that ``--parallel`` runs as concurrent processes, one group each.
GROUPS = [
    ("startup", "preprocessing"),
    ("training:clm", "mfu"),
    ("training:mlm+swag",),
    ("evaluation", "resume", "remote", "end-to-end", "mixture"),
]


def render(
    figures: list[Figure],
    machine: dict[str, Any],
    args: argparse.Namespace,
    minutes: float,
    sections: dict[str, float] | None = None,
) -> str:
    """The page; ``sections``: the minutes each section took, where measured here."""
    spent = ""
    if sections:
        spent = (
            " ("
            + ", ".join(f"{name} {value:.1f}" for name, value in sections.items())
            + f"; the baseline's runs {BASELINE_SECONDS[0] / 60:.1f} of the total)"
        )
    lines = [
        "# Benchmarks",
        "",
        "Written by `python benchmarks/run.py`"
        + (" --quick (a smoke run: small sizes)" if args.quick else "")
        + f" in {minutes:.1f} minutes{spent}. Every figure is min / median / max of {args.reps} "
        + (f"(training: {args.train_reps}) " if getattr(args, "train_reps", None) else "")
        + "repetitions; lmctl and the baseline (the upstream example scripts' recipe as a user "
        "runs it, `benchmarks/upstream.py`) ran alternately in the same run, and each ratio is "
        "of medians (speed-up: above 1 means lmctl is better).",
        "",
        "## Machine",
        "",
        *[f"- {key}: {value}" for key, value in machine.items()],
        "",
    ]
    if getattr(args, "parallel", False):
        lines += [
            f"The section groups ran as {len(GROUPS)} concurrent processes (`--parallel`); "
            "each ratio still compares runs of one process, made one after the other.",
            "",
        ]
    if args.shared:
        lines += [
            "The machine was shared with other jobs while the suite ran (see the load average), "
            "so absolute figures are noisy; the side-by-side ratios are the figures to read.",
            "",
        ]
    lines += [
        "## Results",
        "",
        "| section | figure | unit | lmctl | baseline | ratio | target | met |",
        "| --- | --- | --- | --- | --- | --- | --- | --- |",
    ]
    for figure in figures:
        ratio = figure.ratio()
        target = f">= {figure.target:g}x" if figure.target else ""
        reached = figure.met()
        met = "" if reached is None else ("yes" if reached else "no")
        # Shown another way round: a fraction of a peak, and a time within N times another.
        if figure.section == "MFU" and figure.target is not None:
            target = f">= {figure.target:.0%}"
        if figure.section in ("resume", "remote") and figure.target is not None and ratio:
            target, ratio = f"<= {1 / figure.target:g}x", 1 / ratio
        lines.append(
            f"| {figure.section} | {figure.name} | {figure.unit} | {spread(figure.lmctl)} | "
            f"{spread(figure.baseline)} | {'' if ratio is None else f'{ratio:.2f}x'} | {target} "
            f"| {met} |"
        )
    notes = [f"- {f.name}: {f.note}" for f in figures if f.note]
    if notes:
        lines += ["", "Notes:", "", *notes]
    return "\n".join(lines) + "\n"
