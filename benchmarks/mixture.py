"""The ``mixture`` section: training on a two-source mixture (a reader over an SQLite table
and a text file, 70/30) against the same texts read from one file, in steps per second.

Both sides are lmctl (the "baseline" column is the one file): the figure is the cost of
drawing from two sources, one of them a Python reader, instead of one. The issue asks for at
least 95% of the one file's speed.
"""

from __future__ import annotations

import json
import sqlite3
import sys
from pathlib import Path
from typing import Any

import yaml

from benchmarks.common import ROOT, run_lmctl
from benchmarks.figures import Figure, interleave
from benchmarks.workload import Work, text_lines, write_lines

READERS = ROOT / "examples" / "sources" / "readers.py"
PARTITIONS = 8


def _data(folder: Path, lines: list[str]) -> tuple[Path, Path]:
    """The mixture's config (70% of the lines in a table, 30% in a file) and one file of
    every line."""
    folder.mkdir(parents=True, exist_ok=True)
    cut = len(lines) * 7 // 10
    with sqlite3.connect(folder / "corpus.db") as connection:
        connection.execute("CREATE TABLE corpus (id INTEGER PRIMARY KEY, partition INT, text TEXT)")
        connection.executemany(
            "INSERT INTO corpus VALUES (?, ?, ?)",
            [(n, n % PARTITIONS, text) for n, text in enumerate(lines[:cut])],
        )
    (folder / "readers.py").write_text(READERS.read_text(), encoding="utf-8")
    books = write_lines(folder / "books.txt", lines[cut:])
    config = folder / "mixture.yaml"
    sources = [
        {
            "name": "table",
            "reader": f"{folder / 'readers.py'}:rows",
            "args": {"db": str(folder / "corpus.db"), "partitions": list(range(PARTITIONS))},
            "weight": 0.7,
        },
        {"name": "books", "file": str(books), "weight": 0.3},
    ]
    config.write_text(yaml.safe_dump({"train_sources": sources}), encoding="utf-8")
    return config, write_lines(folder / "one.txt", lines)


def mixture(work: Work, reps: int, steps: int) -> list[Figure]:
    """clm steps per second on the mixture and on one file of the same texts."""
    config, one = _data(work.fresh("mixture"), text_lines(4000 if work.quick else 40000, 11))

    def train(*data: Any) -> float:
        out = work.fresh("mixture-run")
        run_lmctl(
            ["train", "clm", *data, "--model-type", "gpt2", "--config-overrides",
             "n_layer=2,n_embd=128,n_head=2", "--tokenizer-name", work.tokenizer,
             "--block-size", 128, "--per-device-train-batch-size", 8, "--max-steps", steps,
             "--no-eval", "--seed", 7, "-o", out, "--no-progress"],
            work.env(),
        )  # fmt: skip
        return float(json.loads((out / "all_results.json").read_text())["train_steps_per_second"])

    runs = interleave(
        reps,
        {"mixture": lambda: train("--config", config), "one": lambda: train("--train-file", one)},
    )
    figure = Figure(
        "data",
        "clm training on a reader + file mixture (70/30)",
        "steps/s",
        runs["mixture"],
        runs["one"],
        target=0.95,
        note="both sides lmctl: the baseline column reads the same texts from one file",
    )
    print(f"mixture / one file, steps per second: {figure.ratio():.3f}", file=sys.stderr)
    return [figure]
