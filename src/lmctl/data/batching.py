"""Length-grouped batching: samples of similar length share a batch, so little is padded.

Every epoch is still a random permutation of all samples (the Trainer's
``get_length_grouped_indices``: shuffle, cut into mega-batches of 50 batches, sort each by
length), drawn from ``seed + epoch`` alone, so any epoch can be replayed on resume.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any


def sample_lengths(dataset: Any, column: str = "input_ids") -> list[int]:
    """Tokens per sample, read from the Arrow column without decoding rows; for samples with
    several sequences (the choices of a record), the longest one."""
    import pyarrow as pa
    import pyarrow.compute as pc

    table = dataset.select_columns([column]).with_format("arrow")[:][column]
    array = table.combine_chunks() if isinstance(table, pa.ChunkedArray) else table
    if pa.types.is_list(array.type.value_type) or pa.types.is_large_list(array.type.value_type):
        inner = pc.list_value_length(pc.list_flatten(array))
        parents = pc.list_parent_indices(array)
        longest = (
            pa.table({"row": parents, "length": inner})
            .group_by("row")
            .aggregate([("length", "max")])
        )
        order = pc.sort_indices(longest["row"])
        return [int(value) for value in pc.take(longest["length_max"], order).to_pylist()]
    return [int(value) for value in pc.list_value_length(array).to_pylist()]


class LengthGroupedSampler:
    """Indices of one epoch, grouped by length; ``set_epoch`` picks the epoch (the engines and
    accelerate's data loaders call it before each one)."""

    def __init__(self, lengths: list[int], batch_size: int, seed: int) -> None:
        self.lengths = lengths
        self.batch_size = batch_size
        self.seed = seed
        self.epoch = 0

    def set_epoch(self, epoch: int) -> None:
        self.epoch = epoch

    def __len__(self) -> int:
        return len(self.lengths)

    def __iter__(self) -> Iterator[int]:
        import torch
        from transformers.trainer_pt_utils import get_length_grouped_indices

        generator = torch.Generator().manual_seed(self.seed + self.epoch)
        indices = get_length_grouped_indices(self.lengths, self.batch_size, generator=generator)
        return iter(indices)
