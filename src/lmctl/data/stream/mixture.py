"""Named sources as streams (``train_sources``/``validation_sources`` with ``--streaming``):
each source is a :class:`~lmctl.data.stream.sources.TextSource` (a reader, a file, or a Hub
dataset), and several of them one :class:`MixedSource`: the training mixture, drawn by
weight from ``--seed`` with ``interleave_datasets``, or the validation sources one after the
other.

A training stream records, in every checkpoint, where each shard of each source stopped
(:mod:`.positions`); a mixture shares one :class:`~lmctl.data.stream.positions.StreamPlan`
between its sources, its shards numbered ``(source, shard)``. ``datasets`` draws the order of
the sources from the seed again in every pass, so on resume each source first yields a
placeholder for every example it gave before and reads on from its position: the mixture
then stands exactly where the checkpoint was, and the engine drops the placeholder batches
without collating them. A mixture that repeats the sources that run out (``all_exhausted``)
reads a source more than once in a pass, which positions per pass cannot tell apart: it
records none, and a resumed run reads the batches consumed before the checkpoint again and
drops them (exact, in time that grows with the steps done; :data:`MIXTURE_RESUME_NOTE` says
so in the log). Either way each process counts the examples of each source it trained on,
which checkpoints keep: the shares of the mixture as trained on.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass, replace
from itertools import chain
from typing import TYPE_CHECKING, Any

from lmctl.data.sources import resolve_reader, source_where
from lmctl.data.stream.sources import (
    TOKENIZER_SAMPLE_BYTES,
    Readers,
    TextSource,
    load_sources,
    reader_source,
)

if TYPE_CHECKING:
    from lmctl.config.slices import Access, DataSpec
    from lmctl.config.sources import DataSource

MIXTURE_RESUME_NOTE = (
    "train: a streamed mixture with --mix-stopping-strategy all_exhausted records no "
    "per-source positions: this resumed run reads the batches trained on before the "
    "checkpoint again and drops them (exact, in time that grows with the steps done)"
)


@dataclass
class MixedSource:
    """Several stream sources read as one split: drawn by ``weights`` (the training mixture)
    or, with ``weights`` None, one after the other (every validation source)."""

    where: str
    parts: list[TextSource]
    weights: list[float] | None
    stopping_strategy: str

    @property
    def records_positions(self) -> bool:
        """Whether the training mixture records each source's shard positions, so that a
        resumed run seeks there. A mixture that repeats the sources that run out
        (``all_exhausted``) reads a source again inside one pass, which positions per pass
        cannot tell apart: it resumes by reading the consumed batches again."""
        return self.weights is not None and self.stopping_strategy == "first_exhausted"

    @property
    def columns(self) -> list[str] | None:
        return self.parts[0].columns

    @property
    def shards(self) -> list[Any]:
        return [shard for part in self.parts for shard in part.shards]

    def texts(
        self, limit_bytes: int = TOKENIZER_SAMPLE_BYTES, columns: list[str] | None = None
    ) -> Iterator[list[str]]:
        """Texts from the start of each source, about ``limit_bytes`` in all."""
        share = max(1, limit_bytes // len(self.parts))
        return chain.from_iterable(part.texts(share, columns) for part in self.parts)


def stream_named_sources(
    data: DataSpec,
    access: Access,
    readers: Readers,
    *,
    need_train: bool,
    need_eval: bool,
    text_options: dict[str, Any],
    records: bool = False,
) -> dict[str, TextSource | MixedSource]:
    """The streamed splits of a run with named sources: ``train`` (one source, or the
    mixture of ``train_sources``), ``validation`` (every validation source) and
    ``validation_<name>`` (each on its own); a split given as a file or Hub dataset streams
    as usual. Every reader is imported and checked before any data is read."""
    for field_name, named in (
        ("train_sources", data.train_sources),
        ("validation_sources", data.validation_sources),
    ):
        for index, source in enumerate(named):
            if source.reader is not None:
                resolve_reader(source, source_where(field_name, index, source))
    plain = replace(data, train_sources=[], validation_sources=[])
    if data.train_sources:
        plain = replace(plain, train_file=None, dataset_name=None)
    if data.validation_sources:
        plain = replace(plain, validation_file=None)
    splits: dict[str, TextSource | MixedSource] = {}
    plain_train = need_train and not data.train_sources
    plain_eval = need_eval and not data.validation_sources
    if plain_train or plain_eval:
        splits.update(
            load_sources(
                plain,
                access,
                readers,
                need_train=plain_train,
                need_eval=plain_eval,
                text_options=text_options,
                records=records,
            )
        )
    if need_train and data.train_sources:
        from lmctl.data.mixture import mixture_weights

        parts = [
            _one(data, access, replace(readers, shards=None),
                 source_where("train_sources", index, source), source,
                 text_options=text_options, records=records)
            for index, source in enumerate(data.train_sources)
        ]  # fmt: skip
        splits["train"] = (
            parts[0]
            if len(parts) == 1
            else MixedSource(
                data.source("train"),
                parts,
                mixture_weights(data.train_sources),
                data.mix_stopping_strategy,
            )
        )
    if need_eval and data.validation_sources:
        each = {
            source.name: _one(
                data,
                access,
                readers,
                source_where("validation_sources", index, source),
                source,
                text_options=text_options,
                records=records,
                split="validation",
            )
            for index, source in enumerate(data.validation_sources)
        }
        for name, part in each.items():
            splits[f"validation_{name}"] = part
        parts = list(each.values())
        splits["validation"] = (
            parts[0]
            if len(parts) == 1
            else MixedSource(data.source("validation"), parts, None, data.mix_stopping_strategy)
        )
    return splits


def _one(
    data: DataSpec,
    access: Access,
    readers: Readers,
    where: str,
    source: DataSource,
    *,
    text_options: dict[str, Any],
    records: bool,
    split: str = "train",
) -> TextSource:
    """One named source as a stream source of ``split`` (a file or Hub dataset through the
    usual streaming sources, as if it were the run's only data)."""
    if source.reader is not None:
        reader = resolve_reader(source, where)
        return reader_source(reader, where, readers, text_column=data.text_column, records=records)
    alone = replace(
        data,
        train_sources=[],
        validation_sources=[],
        train_file=source.file if split == "train" else None,
        validation_file=source.file if split == "validation" else None,
        dataset_name=source.dataset,
        dataset_config_name=source.config,
    )
    loaded = load_sources(
        alone,
        access,
        readers,
        need_train=split == "train",
        need_eval=split == "validation",
        text_options=text_options,
        records=records,
    )
    return replace(loaded[split], where=f"{where} {loaded[split].where}")
