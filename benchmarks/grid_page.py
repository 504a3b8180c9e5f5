"""The grid's section of docs/benchmarks.md: the table of cells and its summary, written
between two markers so that the suite and the grid each rewrite only their own part."""

from __future__ import annotations

import statistics
from typing import Any

from benchmarks.grid import LEARNING_RATE, SWAG_LEARNING_RATE, TOLERANCE, Cell, Outcome

#: Text between these markers of docs/benchmarks.md is the grid's; the rest is the suite's.
BEGIN, END = "<!-- grid: begin -->", "<!-- grid: end -->"


def render_grid(
    outcomes: list[Outcome], minutes: float, machine: dict[str, Any], reused: int = 0
) -> str:
    rows = [
        "| workload | steps | eval loss upstream → lmctl | time to quality | per step |",
        "| --- | --- | --- | --- | --- |",
    ]
    quality, per_step, worst = [], [], []
    for outcome in outcomes:
        ratio, extrapolated = outcome.to_quality()
        upstream, lmctl = outcome.losses()
        rows.append(
            f"| {outcome.cell.name} | {outcome.cell.steps} | {upstream:.4f} → "
            f"{lmctl:.4f} ({outcome.quality():+.1%}) | {ratio:.2f}x"
            f"{' (extrapolated)' if extrapolated else ''} | {outcome.per_step():.2f}x |"
        )
        quality.append((ratio, outcome.cell.name))
        per_step.append((outcome.per_step(), outcome.cell.name))
        worst.append((outcome.quality(), outcome.cell.name))
    low, high = min(quality), max(quality)
    step_low, step_high = min(per_step), max(per_step)
    loss_worst = max(worst)
    below = [name for ratio, name in quality if ratio < 1.0]
    summary = [
        f"- **Smallest time-to-quality ratio: {low[0]:.2f}x** ({low[1]}); largest "
        f"{high[0]:.2f}x ({high[1]}); median {statistics.median(r for r, _ in quality):.2f}x "
        f"over {len(quality)} runs.",
        f"- Per step: smallest {step_low[0]:.2f}x ({step_low[1]}), largest {step_high[0]:.2f}x "
        f"({step_high[1]}), median {statistics.median(r for r, _ in per_step):.2f}x.",
        f"- Eval loss at equal steps: at worst {loss_worst[0]:+.1%} against upstream "
        f"({loss_worst[1]}).",
        "- Cells below 1.0x: " + (", ".join(below) if below else "none") + ".",
    ]
    return "\n".join(
        [
            BEGIN,
            "## Time to quality: a grid of workloads",
            "",
            f"Written by `python benchmarks/run.py --grid` in {minutes:.1f} minutes on "
            f"{machine.get('cpu', '?')} ({machine.get('cores', '?')} cores, load average at "
            f"the start of the last run {machine.get('load average at start', '?')})"
            + (
                f"; {reused} cells measured by earlier runs of the same grid on this "
                "machine and kept in `--grid-keep`"
                if reused
                else ""
            )
            + ". Each cell: the same saved "
            "model, data and hyper-parameters (learning rate "
            f"{LEARNING_RATE:g}, {SWAG_LEARNING_RATE:g} for swag's pretrained model; everything "
            "else at the defaults) through the upstream recipe (`benchmarks/upstream.py`) and "
            "`lmctl train`, one after the other, evaluated every tenth of the run (every fifth "
            "line by line, on about 16,000 tokens). The clm cells of 30,522 and 50,257 "
            "entries tokenize with all-MiniLM-L6-v2's WordPiece vocabulary, without segment ids "
            "(as GPT-2's own tokenizer: the upstream recipe would feed them to GPT-2). **Time to "
            "quality**: upstream's training time to within "
            f"{TOLERANCE:.1%} of its own final eval loss over lmctl's time to the same loss "
            "(evaluations left out, linear between evaluations; above 1 means lmctl gets there "
            "sooner; the band is the eval-loss difference of one recipe on other batches). "
            "Eval losses are per-token means on both sides. **Per step**: the training time "
            "of all steps, upstream over lmctl. `--precision auto` cells run the upstream "
            "recipe with `--bf16` where the CPU computes bfloat16 natively (fp32 elsewhere). "
            + seeds(outcomes),
            "",
            *summary,
            "",
            *rows,
            END,
        ]
    )


def seeds(outcomes: list[Outcome]) -> str:
    """The sentence on the seeds the grid's runs were drawn at."""
    drawn = sorted({outcome.cell.seed for outcome in outcomes})
    if len(drawn) == 1:
        return f"Both sides run at seed {drawn[0]}."
    return (
        f"Both sides run at seed {Cell.seed}; the cells marked with another seed run again at "
        "it on both sides (the same model, data and hyper-parameters, other masks, dropout "
        "and batch order): the difference is the noise of the draws and of the clock."
    )


def splice(page: str, block: str) -> str:
    """``page`` with its grid section replaced by ``block`` (put first if it has none)."""
    if BEGIN in page and END in page:
        head, rest = page.split(BEGIN, 1)
        return head + block + rest.split(END, 1)[1]
    title, _, body = page.partition("\n\n")
    if title.startswith("# "):
        return f"{title}\n\n{block}\n\n{body}"
    return f"{block}\n\n{page}"


def grid_block(page: str) -> str:
    """The grid section of a page, or ''."""
    if BEGIN in page and END in page:
        return BEGIN + page.split(BEGIN, 1)[1].split(END, 1)[0] + END
    return ""
