"""Build ``corpus.db`` (an SQLite table of 9 partitions) and ``books.txt``/``books-valid.txt``
from lmctl's embedded corpus, for the README example of this folder."""

from __future__ import annotations

import sqlite3
import sys
from pathlib import Path

from lmctl.resources import EMBEDDED_CORPUS

PARTITIONS = 9


def build(folder: Path, rows: int = 3000) -> None:
    lines = [line for line in EMBEDDED_CORPUS.read_text(encoding="utf-8").splitlines() if line]
    table, books = lines[:rows], lines[rows : rows + 2000]
    database = folder / "corpus.db"
    database.unlink(missing_ok=True)
    with sqlite3.connect(database) as connection:
        connection.execute("CREATE TABLE corpus (id INTEGER PRIMARY KEY, partition INT, text TEXT)")
        connection.executemany(
            "INSERT INTO corpus VALUES (?, ?, ?)",
            [(index, index % PARTITIONS, text) for index, text in enumerate(table)],
        )
    (folder / "books.txt").write_text("\n".join(books[:1800]) + "\n", encoding="utf-8")
    (folder / "books-valid.txt").write_text("\n".join(books[1800:]) + "\n", encoding="utf-8")


if __name__ == "__main__":
    build(Path(sys.argv[1]) if len(sys.argv) > 1 else Path.cwd())
