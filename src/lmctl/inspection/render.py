"""The findings of ``lmctl data inspect`` on stdout: rich tables at a terminal, plain lines
otherwise; nothing with ``--json`` (the result object replaces them)."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

from lmctl.inspection.measure import text_bars

if TYPE_CHECKING:
    from lmctl.console import Console


def _share(value: float) -> str:
    return f"{value:.2%}"


def split_rows(report: dict[str, Any]) -> list[tuple[str, str]]:
    """The (name, value) rows of one split."""
    unit = report["unit"]
    longest = " (longest choice)" if "labels" in report else ""
    rows = [
        ("source", str(report["source"])),
        ("read", report["read"]),
        ("samples" if unit == "sample" else f"samples ({unit}s)", str(report["samples"])),
        ("tokens", str(report["tokens"])),
        (
            f"tokens per {unit}{longest}",
            f"p50 {report['p50']}  p90 {report['p90']}  p99 {report['p99']}  max {report['max']}",
        ),
    ]
    cut = report["cut"]
    if cut.get("grouped"):
        rows.append(
            (
                "blocks",
                f"texts are concatenated and split into {cut['blocks']} blocks of "
                f"{cut['limit']} tokens; {cut['tokens_cut']} tokens after the last are "
                f"dropped ({_share(cut['tokens_cut_share'])})",
            )
        )
    else:
        rows.append(
            (
                f"cut at {cut['limit']}",
                f"{cut['samples_cut']} {cut.get('unit', 'sample')}s "
                f"({_share(cut['samples_cut_share'])}), {cut['tokens_cut']} tokens "
                f"({_share(cut['tokens_cut_share'])})",
            )
        )
    pad = report["padding"]
    rows.append(
        (
            f"padding at batch size {pad['batch_size']}",
            f"{_share(pad['padding_share'])} in order, "
            f"{_share(pad['padding_share_grouped'])} grouped by length",
        )
    )
    unknown = report["unknown"]
    top = ", ".join(f"{item['text']!r} x{item['count']}" for item in unknown["top_unknown"])
    rows.append(
        (
            f"unknown ({unknown['unk_token']})",
            f"{unknown['unknown_tokens']} tokens ({_share(unknown['unknown_share'])})"
            + (f": {top}" if top else ""),
        )
    )
    if "labels" in report:
        balance = "  ".join(f"{label}: {count}" for label, count in report["labels"].items())
        context = report["context"]
        rows += [
            ("endings", str(report["endings"])),
            ("labels", balance),
            (
                "context tokens",
                f"p50 {context['p50']}  p90 {context['p90']}  p99 {context['p99']}  "
                f"max {context['max']}",
            ),
        ]
    else:
        rows.append(("blank lines", str(report["blank_lines"])))
        rows.append(("duplicate lines", str(report["duplicate_lines"])))
    for name, part in report.get("sources", {}).items():
        rows.append(
            (
                f"source {name}",
                f"{part['samples']} samples, {part['tokens']} tokens ({part['read']}); "
                f"{_share(part['sample_share'])} of the samples, "
                f"{_share(part['token_share'])} of the tokens (by {part['by']})",
            )
        )
    return rows


def render(result: dict[str, Any], console: Console) -> None:
    if console.options.json:
        return
    header = (
        f"lmctl data inspect {result['objective']}: tokenizer {result['tokenizer']}, "
        f"{result['length_flag']} {result['length']}"
    )
    if console.plain:
        lines = [header]
        for split, report in result["splits"].items():
            lines.append(f"{split}:")
            lines += [f"  {name}: {value}" for name, value in split_rows(report)]
            lines.append(f"  histogram (tokens per {report['unit']}):")
            lines += [f"    {line}" for line in text_bars(report["histogram"])]
        console.write("\n".join(lines) + "\n")
        return
    from rich.console import Console as RichConsole
    from rich.table import Table
    from rich.text import Text

    out = RichConsole(file=console.out or sys.stdout, highlight=False)
    out.print(Text(header))
    for split, report in result["splits"].items():
        table = Table(title=split, show_header=False)
        table.add_column("measure", style="bold")
        table.add_column("value")
        for name, value in split_rows(report):
            table.add_row(Text(name), Text(value))
        bars = "\n".join(text_bars(report["histogram"]))
        table.add_row(Text(f"histogram (tokens per {report['unit']})"), Text(bars))
        out.print(table)
