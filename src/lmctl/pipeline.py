"""The shared pipeline: from a run's slices to a model, tokenizer and model-ready data.

Every engine and ``lmctl eval`` start from :func:`prepare`; ``lmctl prepare`` runs its data
half, :func:`prepare_data`. Nothing in here knows which objective it runs beyond the
:class:`~lmctl.objectives.base.Objective` interface, and nothing probes the machine: the
:class:`~lmctl.run.runtime.Runtime` says where the run computes and continues from.
"""

from __future__ import annotations

import time
from dataclasses import dataclass, field
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl.data.load import limit_samples, load_raw, silence_libraries
from lmctl.data.mixture import load_named_sources
from lmctl.data.prepared import cache_root
from lmctl.data.stream.positions import recorded_layout
from lmctl.data.stream.sources import Readers
from lmctl.distributed import import_deepspeed_when_used
from lmctl.fastpaths.allocator import keep_freed_blocks
from lmctl.fastpaths.install import install_fast_paths
from lmctl.models.build import build_model
from lmctl.models.config import build_model_config
from lmctl.models.plugins import load_plugins
from lmctl.models.tokenizer import (
    check_tokenizer_files,
    leave_out_segment_ids,
    load_tokenizer,
    tokenizer_source,
)
from lmctl.objectives.collate import SeededCollator

if TYPE_CHECKING:
    from datasets import Dataset

    from lmctl.config.slices import RunSpec
    from lmctl.console import Console
    from lmctl.objectives.base import Objective
    from lmctl.run.runtime import Runtime


@dataclass
class PreparedData:
    model_config: Any
    tokenizer: Any
    #: A ``Dataset``, or an ``IterableDataset`` with ``--streaming``.
    train_dataset: Dataset | None
    eval_dataset: Dataset | None
    #: Seconds spent loading and preprocessing the data (not the tokenizer or model).
    data_seconds: float
    #: Each validation source on its own, by name (``validation_sources``).
    eval_sources: dict[str, Dataset] = field(default_factory=dict)
    #: Records of each training source in the mixture, by name (``train_sources``).
    mixture: dict[str, int] = field(default_factory=dict)


@dataclass
class Prepared:
    """Everything an engine or an evaluation runs on."""

    spec: RunSpec
    runtime: Runtime
    objective: Objective
    run_dir: Path
    model: Any
    tokenizer: Any
    train_dataset: Dataset | None
    eval_dataset: Dataset | None
    #: Training batches: masks and permutations drawn from the seed, the pass and the batch
    #: (see ``SeededCollator``), never from the global RNG that a resumed run restores.
    collator: Any
    eval_collator: Any
    #: Tokens per training sample when batches are grouped by length (else None).
    train_lengths: list[int] | None = None
    #: Each validation source on its own, by name (see :class:`PreparedData`).
    eval_sources: dict[str, Dataset] = field(default_factory=dict)
    #: Records of each training source in the mixture, by name.
    mixture: dict[str, int] = field(default_factory=dict)


def prepare_data(
    spec: RunSpec,
    objective: Objective,
    console: Console,
    *,
    readers: Readers,
    resume: Path | None = None,
) -> PreparedData:
    """Tokenizer and model-ready splits; the model config only decides sequence lengths.
    ``readers``: the processes and dataloader workers that read a stream; ``resume``: the
    checkpoint whose tokenizer a continued run uses."""
    silence_libraries()
    from transformers import PretrainedConfig, set_seed

    data, loop, options = spec.data, spec.loop, spec.options
    check_tokenizer_files(spec.tokenizer, spec.model)  # before the data is read
    set_seed(loop.seed)
    load_plugins(spec.model.imports, console)
    has_model = spec.model.given
    model_config = (
        build_model_config(spec.model, spec.access, console) if has_model else PretrainedConfig()
    )
    if has_model:
        objective.check_architecture(spec.model, spec.access, model_config)
        objective.adapt_model_config(model_config, console)
    started = time.monotonic()
    text_options = objective.text_options(options)
    mixture: dict[str, int] = {}
    raw: Any
    # Training data is read for training, and for a tokenizer trained on it.
    need_train = loop.do_train or spec.tokenizer.train_tokenizer is not None
    if data.streaming:
        from lmctl.data.stream.mixture import (
            MIXTURE_RESUME_NOTE,
            MixedSource,
            stream_named_sources,
        )
        from lmctl.data.stream.sources import load_sources

        if data.preprocessing_num_workers:
            console.warn(
                "--preprocessing-num-workers is not used with --streaming; "
                "use --dataloader-num-workers to tokenize in parallel"
            )
        named = data.train_sources or data.validation_sources
        raw = (stream_named_sources if named else load_sources)(
            data,
            spec.access,
            readers,
            need_train=need_train,
            need_eval=loop.do_eval,
            text_options=text_options,
            records=objective.streams_records,
        )
        mixed = raw.get("train")
        if resume is not None and isinstance(mixed, MixedSource) and not mixed.records_positions:
            console.info(MIXTURE_RESUME_NOTE)
    else:
        check_records = partial(objective.check_records, options)
        sourced = None
        if data.train_sources or data.validation_sources:
            sourced = load_named_sources(
                data,
                spec.access,
                seed=loop.seed,
                records=objective.streams_records,
                text_options=text_options,
                need_train=need_train,
                need_eval=loop.do_eval,
                check=lambda dataset, where: check_records(dataset, where, None),
                console=console,
            )
            mixture = sourced.mixture
        raw = load_raw(
            data,
            spec.access,
            do_train=loop.do_train,
            need_eval=loop.do_eval,
            text_options=text_options,
            check_records=check_records,
            loaded=None if sourced is None else sourced.splits,
        )
    data_seconds = time.monotonic() - started

    def training_texts() -> Any:
        return objective.training_texts(options, data, raw["train"], data.source("train"))

    tokenizer = load_tokenizer(
        objective,
        model_config,
        training_texts,
        console,
        tokenizer_spec=spec.tokenizer,
        model_spec=spec.model,
        access=spec.access,
        world_size=readers.processes,
        overwrite_cache=data.overwrite_cache,
        resume_from=resume,
        # A stream is read once, as it trains the tokenizer.
        cache_dir=None if data.streaming else cache_root(data),
    )
    if not objective.segment_ids:
        leave_out_segment_ids(tokenizer, console)
    if has_model:
        source = tokenizer_source(spec.tokenizer, spec.model)
        objective.check_model(options, model_config, tokenizer, source)
    if not loop.do_train:
        raw.pop("train", None)
    started = time.monotonic()
    processed = objective.preprocess(
        options, raw, tokenizer, model_config, console, data=data, loop=loop
    )
    if not data.streaming:  # a stream applies its limits as it is read
        processed = limit_samples(data, processed, console)
    data_seconds += time.monotonic() - started
    console.info(f"data ready in {data_seconds:.2f} s (loading and preprocessing)")
    prefix = "validation_"
    return PreparedData(
        model_config=model_config,
        tokenizer=tokenizer,
        train_dataset=processed.get("train"),
        eval_dataset=processed.get("validation"),
        data_seconds=data_seconds,
        eval_sources={
            split.removeprefix(prefix): dataset
            for split, dataset in processed.items()
            if split.startswith(prefix)
        },
        mixture=mixture,
    )


def prepare(
    spec: RunSpec,
    runtime: Runtime,
    objective: Objective,
    run_dir: Path,
    console: Console,
    *,
    random_head_ok: bool = True,
) -> Prepared:
    """Everything a run needs; ``random_head_ok=False`` refuses to evaluate a model that lacks
    the objective's head (see :func:`lmctl.models.build.build_model`). The fast paths the
    runtime decided are installed here, and those on said in one line."""
    import_deepspeed_when_used()
    paths = runtime.fast_paths
    # Before the model and its first step allocate.
    paths.apply("allocator", keep_freed_blocks, "the C library is not glibc")
    layout = recorded_layout(runtime.resume)
    readers = Readers(
        runtime.processes, runtime.workers, layout.get("shards"), layout.get("readers")
    )
    prepared = prepare_data(spec, objective, console, readers=readers, resume=runtime.resume)
    training = spec.loop.do_train
    model = build_model(
        objective,
        prepared.model_config,
        prepared.tokenizer,
        console,
        model_spec=spec.model,
        access=spec.access,
        adapter=spec.adapter,
        training=training,
        resumed_from=runtime.resume,
        random_head_ok=random_head_ok,
    )
    install_fast_paths(paths, objective, model, training=training)
    console.info(paths.summary(brief=True))
    lengths = None
    train = prepared.train_dataset
    if (
        train is not None
        and not spec.data.streaming
        and objective.groups_by_length(spec.loop.group_by_length)
    ):
        from lmctl.data.batching import sample_lengths

        lengths = sample_lengths(train)
    options, tokenizer = spec.options, prepared.tokenizer
    collator = objective.collator(options, tokenizer, runtime.pad_multiple)
    return Prepared(
        spec=spec,
        runtime=runtime,
        objective=objective,
        run_dir=run_dir,
        model=model,
        tokenizer=tokenizer,
        train_dataset=prepared.train_dataset,
        eval_dataset=prepared.eval_dataset,
        collator=SeededCollator(collator, spec.loop.seed),
        eval_collator=objective.eval_collator(
            options, tokenizer, runtime.pad_multiple, spec.loop.seed
        ),
        train_lengths=lengths,
        eval_sources=prepared.eval_sources,
        mixture=prepared.mixture,
    )
