"""The shared pipeline: from a validated config to a model, tokenizer and model-ready data.

Every engine starts from :func:`prepare`; ``lmctl prepare`` runs its data half,
:func:`prepare_data`. Nothing in here knows which objective it runs beyond the
:class:`~lmctl.objectives.base.Objective` interface.
"""

from __future__ import annotations

import time
from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl import distributed
from lmctl.config.slices import (
    Access,
    AdapterSpec,
    DataSpec,
    LoopSpec,
    ModelSpec,
    RunDirSpec,
    TokenizerSpec,
    take,
)
from lmctl.data.load import limit_samples, load_raw, silence_libraries
from lmctl.data.prepared import cache_root
from lmctl.distributed import native_bf16
from lmctl.fastpaths.allocator import keep_freed_blocks
from lmctl.fastpaths.install import install_fast_paths
from lmctl.fastpaths.table import FastPaths
from lmctl.models.build import build_model
from lmctl.models.config import build_model_config
from lmctl.models.plugins import load_plugins
from lmctl.models.tokenizer import leave_out_segment_ids, load_tokenizer, tokenizer_source
from lmctl.run.checkpoints import resume_checkpoint
from lmctl.run.rundir import local_run_dir

if TYPE_CHECKING:
    from datasets import Dataset

    from lmctl.config.base import TrainConfig
    from lmctl.console import Console
    from lmctl.objectives.base import Objective


@dataclass
class PreparedData:
    model_config: Any
    tokenizer: Any
    #: A ``Dataset``, or an ``IterableDataset`` with ``--streaming``.
    train_dataset: Dataset | None
    eval_dataset: Dataset | None
    #: Seconds spent loading and preprocessing the data (not the tokenizer or model).
    data_seconds: float


@dataclass
class Prepared:
    config: TrainConfig
    objective: Objective
    run_dir: Path
    model: Any
    tokenizer: Any
    train_dataset: Dataset | None
    eval_dataset: Dataset | None
    collator: Any
    eval_collator: Any
    #: Which fast paths run (:mod:`lmctl.fastpaths`); the engines read fused AdamW from it.
    fast_paths: FastPaths
    #: Tokens per training sample when batches are grouped by length (else None).
    train_lengths: list[int] | None = None


def has_model_source(config: TrainConfig) -> bool:
    return any(
        value is not None
        for value in (config.model_name_or_path, config.config_name, config.model_type)
    )


def prepare_data(config: TrainConfig, objective: Objective, console: Console) -> PreparedData:
    """Tokenizer and model-ready splits; the model config only decides sequence lengths."""
    silence_libraries()
    from transformers import PretrainedConfig, set_seed

    set_seed(config.seed)
    load_plugins(config.imports, console)
    has_model = has_model_source(config)
    model_config = (
        build_model_config(take(ModelSpec, config), take(Access, config), console)
        if has_model
        else PretrainedConfig()
    )
    if has_model:
        objective.check_architecture(take(ModelSpec, config), take(Access, config), model_config)
        objective.adapt_model_config(model_config, console)
    started = time.monotonic()
    raw: Any
    if config.streaming:
        from lmctl.data.stream.sources import Readers, load_sources
        from lmctl.distributed import world_size

        if config.preprocessing_num_workers:
            console.warn(
                "--preprocessing-num-workers is not used with --streaming; "
                "use --dataloader-num-workers to tokenize in parallel"
            )
        raw = load_sources(
            take(DataSpec, config),
            take(Access, config),
            Readers(world_size(), config.dataloader_num_workers),
            need_train=config.do_train or config.train_tokenizer is not None,
            need_eval=config.do_eval,
            text_options=objective.text_options(take(objective.options_class, config)),
            records=objective.streams_records,
        )
    else:
        raw = load_raw(
            take(DataSpec, config),
            take(Access, config),
            do_train=config.do_train,
            need_eval=config.do_eval,
            text_options=objective.text_options(take(objective.options_class, config)),
            check_records=partial(objective.check_records, take(objective.options_class, config)),
        )
    data_seconds = time.monotonic() - started

    def training_texts() -> Any:
        return objective.training_texts(
            take(objective.options_class, config),
            take(DataSpec, config),
            raw["train"],
            take(DataSpec, config).source("train"),
        )

    tokenizer = load_tokenizer(
        objective,
        model_config,
        training_texts,
        console,
        tokenizer_spec=take(TokenizerSpec, config),
        model_spec=take(ModelSpec, config),
        access=take(Access, config),
        world_size=distributed.world_size(),
        overwrite_cache=config.overwrite_cache,
        resume_from=resume_checkpoint(
            take(RunDirSpec, config), local_run_dir(take(RunDirSpec, config))
        ),
        # A stream is read once, as it trains the tokenizer.
        cache_dir=None if config.streaming else cache_root(take(DataSpec, config)),
    )
    if not objective.segment_ids:
        leave_out_segment_ids(tokenizer, console)
    if has_model:
        objective.check_model(
            take(objective.options_class, config),
            model_config,
            tokenizer,
            tokenizer_source(take(TokenizerSpec, config), take(ModelSpec, config)),
        )
    if not config.do_train:
        raw.pop("train", None)
    started = time.monotonic()
    processed = objective.preprocess(
        take(objective.options_class, config),
        raw,
        tokenizer,
        model_config,
        console,
        data=take(DataSpec, config),
        loop=take(LoopSpec, config),
    )
    if not config.streaming:  # a stream applies its limits as it is read
        processed = limit_samples(take(DataSpec, config), processed, console)
    data_seconds += time.monotonic() - started
    console.info(f"data ready in {data_seconds:.2f} s (loading and preprocessing)")
    return PreparedData(
        model_config=model_config,
        tokenizer=tokenizer,
        train_dataset=processed.get("train"),
        eval_dataset=processed.get("validation"),
        data_seconds=data_seconds,
    )


def prepare(
    config: TrainConfig,
    objective: Objective,
    run_dir: Path,
    console: Console,
    *,
    random_head_ok: bool = True,
) -> Prepared:
    """Everything a run needs; ``random_head_ok=False`` refuses to evaluate a model that lacks
    the objective's head (see :func:`lmctl.models.build.build_model`). The fast paths
    (:mod:`lmctl.fastpaths`) are decided and installed here, and those on said in one line."""
    paths = FastPaths.of(config)
    # Before the model and its first step allocate.
    paths.apply("allocator", keep_freed_blocks, "the C library is not glibc")
    prepared = prepare_data(config, objective, console)
    model = build_model(
        objective,
        prepared.model_config,
        prepared.tokenizer,
        console,
        model_spec=take(ModelSpec, config),
        access=take(Access, config),
        adapter=take(AdapterSpec, config),
        training=config.do_train,
        resumed_from=resume_checkpoint(take(RunDirSpec, config), run_dir),
        random_head_ok=random_head_ok,
    )
    install_fast_paths(paths, config, objective, model)
    console.info(paths.summary(brief=True))
    lengths = None
    train = prepared.train_dataset
    if (
        train is not None
        and not config.streaming
        and objective.groups_by_length(config.group_by_length)
    ):
        from lmctl.data.batching import sample_lengths

        lengths = sample_lengths(train)
    return Prepared(
        train_lengths=lengths,
        fast_paths=paths,
        config=config,
        objective=objective,
        run_dir=run_dir,
        model=model,
        tokenizer=prepared.tokenizer,
        train_dataset=prepared.train_dataset,
        eval_dataset=prepared.eval_dataset,
        collator=objective.collator(
            take(objective.options_class, config),
            prepared.tokenizer,
            8 if config.mixed_precision(native_bf16) else None,
        ),
        eval_collator=objective.eval_collator(
            take(objective.options_class, config),
            prepared.tokenizer,
            8 if config.mixed_precision(native_bf16) else None,
            config.seed,
        ),
    )
