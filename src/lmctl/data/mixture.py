"""Mixing named sources for a map-style run: every source loaded into a ``Dataset`` (a
reader through :mod:`lmctl.data.sources`), reduced to the columns the objective reads, and the
training sources interleaved by weight with ``interleave_datasets``, the draw made from
``--seed``.

The mixture is a pure function of the sources' records in their reading order, the weights,
the stopping strategy and the seed: a resumed run builds the same rows in the same order (a
reader without a version is read again, in the order of its shard lists), so the sampler's
recorded place in it means the same examples.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lmctl.data.sources import reader_dataset, resolve_reader, source_where
from lmctl.errors import DataError

if TYPE_CHECKING:
    from datasets import Dataset

    from lmctl.config.slices import Access, DataSpec
    from lmctl.config.sources import DataSource
    from lmctl.console import Console


def mixture_weights(sources: list[DataSource]) -> list[float]:
    """The probabilities of the training mixture: the weights, normalised (equal when none
    is given)."""
    weights = [source.weight if source.weight is not None else 1.0 for source in sources]
    total = sum(weights)
    return [weight / total for weight in weights]


def mix(datasets_: list[Any], weights: list[float], *, seed: int, stopping_strategy: str) -> Any:
    """One dataset (or stream) drawing from each of ``datasets_`` with the probability of its
    weight, from ``seed``."""
    import datasets

    if len(datasets_) == 1:
        return datasets_[0]
    return datasets.interleave_datasets(
        datasets_,
        probabilities=weights,
        seed=seed,
        stopping_strategy=stopping_strategy,
    )


def mixture_counts(
    lengths: list[int], weights: list[float], *, seed: int, stopping_strategy: str
) -> list[int]:
    """How many records of each source a map-style mixture of sources of ``lengths`` holds:
    the same draw as :func:`mix`, made over the source numbers alone."""
    import datasets
    import numpy as np

    if len(lengths) == 1:
        return list(lengths)
    numbers = [
        datasets.Dataset.from_dict({"source": [index] * length})
        for index, length in enumerate(lengths)
    ]
    mixed = mix(numbers, weights, seed=seed, stopping_strategy=stopping_strategy)
    counts = np.bincount(np.asarray(mixed["source"], dtype=np.int64), minlength=len(lengths))
    return [int(count) for count in counts]


def load_source(
    source: DataSource,
    where: str,
    access: Access,
    *,
    text_options: dict[str, Any],
    console: Console,
    split: str = "train",
) -> Dataset:
    """The records of one source: a reader read into a Dataset, a data file, or the
    ``split`` split of a Hub dataset."""
    from lmctl.data.load import load_files, load_hub_dataset

    if source.reader is not None:
        return reader_dataset(resolve_reader(source, where), console.info)
    if source.file is not None:
        return load_files({"train": source.file}, text_options, access.cache_dir)["train"]
    assert source.dataset is not None
    splits = load_hub_dataset(source.dataset, source.config, access)
    if split not in splits:
        raise DataError(
            f"{where}: the dataset {source.dataset} has no '{split}' split "
            f"(it has {', '.join(splits)})",
            "name a dataset with that split, or a file",
        )
    return splits[split]


def normalised(dataset: Dataset, column: str | None, where: str, *, records: bool) -> Dataset:
    """A text source reduced to its text column (``column``, else ``text``, else its first),
    named ``column or 'text'``, so that sources of different shapes mix; a source of records
    (multiple choice) is kept whole."""
    from datasets import Value

    from lmctl.data.load import text_column

    if records:
        return dataset
    chosen = text_column(dataset, column, where)
    target = column or "text"
    dataset = dataset.select_columns([chosen])
    if chosen != target:
        dataset = dataset.rename_column(chosen, target)
    return dataset.cast_column(target, Value("string"))


@dataclass
class SourcedSplits:
    """The raw splits of a run with named sources, and what its training mixture holds."""

    splits: dict[str, Any]
    #: Source name -> records of it in the training mixture (empty without train_sources).
    mixture: dict[str, int]


def load_named_sources(
    data: DataSpec,
    access: Access,
    *,
    seed: int,
    records: bool,
    text_options: dict[str, Any],
    need_train: bool,
    need_eval: bool,
    check: Callable[[Dataset, str], None] | None,
    console: Console,
) -> SourcedSplits:
    """``train`` (the weighted mixture of ``train_sources``), ``validation`` (every
    validation source) and ``validation_<name>`` (each on its own); splits that the config
    gives as ``--train-file``/``--validation-file``/``--dataset-name`` are loaded as usual.
    Every reader is imported and checked first, before any data is read."""
    import datasets

    from lmctl.data.load import load_files, load_hub_dataset

    for field_name, sources in (
        ("train_sources", data.train_sources),
        ("validation_sources", data.validation_sources),
    ):
        for index, source in enumerate(sources):
            if source.reader is not None:
                resolve_reader(source, source_where(field_name, index, source))

    def loaded(field_name: str, index: int, source: DataSource, split: str) -> Dataset:
        where = source_where(field_name, index, source)
        dataset = load_source(
            source, where, access, text_options=text_options, console=console, split=split
        )
        if check is not None:
            check(dataset, where)
        if len(dataset) == 0:
            raise DataError(f"{where}: no records", "give a source with at least one record")
        return normalised(dataset, data.text_column, where, records=records)

    splits: dict[str, Any] = {}
    mixture: dict[str, int] = {}
    if data.train_sources and need_train:
        parts = [
            loaded("train_sources", index, source, "train")
            for index, source in enumerate(data.train_sources)
        ]
        weights = mixture_weights(data.train_sources)
        console.info(
            "training mixture: "
            + "; ".join(
                f"{source.shown()} weight {weight:.3g}"
                for source, weight in zip(data.train_sources, weights, strict=True)
            )
            + f" (drawn from --seed {seed}, {data.mix_stopping_strategy})"
        )
        strategy = data.mix_stopping_strategy
        try:
            splits["train"] = mix(parts, weights, seed=seed, stopping_strategy=strategy)
        except ValueError as exc:
            raise DataError(
                f"train_sources: the sources cannot be mixed ({str(exc).splitlines()[0][:300]})",
                "give sources with the same columns",
            ) from exc
        counts = mixture_counts(
            [len(part) for part in parts], weights, seed=seed, stopping_strategy=strategy
        )
        mixture = {
            source.name: count for source, count in zip(data.train_sources, counts, strict=True)
        }
        total = sum(counts)
        console.info(
            f"training mixture: {total} records: "
            + ", ".join(f"{name} {count} ({count / total:.1%})" for name, count in mixture.items())
        )
    elif need_train and data.dataset_name is not None:
        splits["train"] = load_hub_dataset(data.dataset_name, data.dataset_config_name, access)[
            "train"
        ]
    elif need_train and data.train_file is not None:
        splits["train"] = load_files({"train": data.train_file}, text_options, access.cache_dir)[
            "train"
        ]
    if data.validation_sources and need_eval:
        each = {
            source.name: loaded("validation_sources", index, source, "validation")
            for index, source in enumerate(data.validation_sources)
        }
        splits["validation"] = datasets.concatenate_datasets(list(each.values()))
        for name, dataset in each.items():
            splits[f"validation_{name}"] = dataset
    elif need_eval and data.validation_file is not None:
        splits["validation"] = load_files(
            {"validation": data.validation_file}, text_options, access.cache_dir
        )["validation"]
    return SourcedSplits(splits, mixture)
