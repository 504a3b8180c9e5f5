"""The predictions on stdout for a person: plain lines when stdout is not a terminal (or
with ``--no-progress``), a rich rendering at a terminal. ``--json`` replaces both."""

from __future__ import annotations

import sys
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from lmctl.console import Console


def show(console: Console, kind: str, predictions: list[dict[str, Any]]) -> None:
    if console.options.json:
        return
    lines = {"continuation": _continuation, "masks": _masks, "choices": _choices}[kind]
    blocks = [lines(prediction) for prediction in predictions]
    if console.plain:
        text = "\n\n".join("\n".join(plain for plain, _ in block) for block in blocks)
        console.write(text + "\n")
        return
    from rich.console import Console as RichConsole
    from rich.text import Text

    rich = RichConsole(file=console.out or sys.stdout, highlight=False)
    for number, block in enumerate(blocks):
        if number:
            rich.print()
        for _, styled in block:
            rich.print(Text.assemble(*styled))


#: One line of output: its plain text, and its (text, style) pieces at a terminal.
Line = tuple[str, list[tuple[str, str]]]


def _continuation(prediction: dict[str, Any]) -> list[Line]:
    prompt, continuation = prediction["prompt"], prediction["continuation"]
    # A plain line each, whatever line breaks the model generates; the terminal shows them.
    flat = continuation.replace("\n", "\\n")
    return [
        (f"prompt: {prompt}", [("prompt ", "dim"), (prompt, "bold")]),
        (
            f"continuation: {flat}",
            [("→ ", "dim"), (prompt, "bold"), (continuation, "cyan")],
        ),
    ]


def _masks(prediction: dict[str, Any]) -> list[Line]:
    lines: list[Line] = [
        (f"text: {prediction['text']}", [("text   ", "dim"), (prediction["text"], "bold")]),
        (f"filled: {prediction['filled']}", [("filled ", "dim"), (prediction["filled"], "cyan")]),
    ]
    for mask in prediction["masks"]:
        shown = ", ".join(
            f"{candidate['token']} {candidate['probability']:.4f}"
            for candidate in mask["candidates"]
        )
        pieces: list[tuple[str, str]] = [(f"mask {mask['mask']}  ", "dim")]
        for index, candidate in enumerate(mask["candidates"]):
            pieces += [
                (", " if index else "", ""),
                (candidate["token"], "bold cyan" if index == 0 else "bold"),
                (f" {candidate['probability']:.4f}", "dim"),
            ]
        lines.append((f"mask {mask['mask']}: {shown}", pieces))
    return lines


def _choices(prediction: dict[str, Any]) -> list[Line]:
    context = " ".join(filter(None, [prediction["context"], prediction["question"]]))
    lines: list[Line] = [(f"context: {context}", [("context ", "dim"), (context, "bold")])]
    for index, ending in enumerate(prediction["endings"]):
        chosen = index == prediction["choice"]
        marks = ["chosen"] if chosen else []
        if prediction.get("label") == index:
            marks.append("label")
        note = f"  ({', '.join(marks)})" if marks else ""
        probability = f"{ending['probability']:.4f}"
        lines.append(
            (
                f"  {probability}  {ending['ending']}{note}",
                [
                    (f"  {probability}  ", "dim"),
                    (ending["ending"], "bold cyan" if chosen else ""),
                    (note, "dim"),
                ],
            )
        )
    return lines
