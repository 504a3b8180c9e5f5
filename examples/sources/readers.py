"""A reader source for lmctl: the rows of an SQLite table, one shard per partition.

``partitions`` is a shard list: lmctl (through ``datasets``) gives every process and every
dataloader worker its own partitions. ``db`` and ``token`` are bound for every call; the
token is only here to show how a credential reaches a reader (``token: "${DB_TOKEN}"`` in the
config reads it from the environment, and it is never written anywhere).
"""

from __future__ import annotations

import sqlite3
from collections.abc import Iterator


def rows(db: str, partitions: list[int], token: str | None = None) -> Iterator[dict[str, object]]:
    """Every row of the ``corpus`` table in ``partitions``, in id order."""
    with sqlite3.connect(db) as connection:
        for partition in partitions:
            cursor = connection.execute(
                "SELECT id, text FROM corpus WHERE partition = ? ORDER BY id", (partition,)
            )
            for row_id, text in cursor:
                yield {"id": row_id, "text": text}


#: The table does not change between runs here, so its prepared data may be cached.
rows.version = "1"  # type: ignore[attr-defined]
