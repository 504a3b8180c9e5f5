"""The shared pipeline: from a validated config to a model, tokenizer and model-ready data.

Every engine starts from :func:`prepare`; nothing in here knows which objective it runs
beyond the :class:`~lmctl.objectives.base.Objective` interface.
"""

from __future__ import annotations

from dataclasses import dataclass
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any

from lmctl import data, modeling, plugins
from lmctl.objectives.common import split_source

if TYPE_CHECKING:
    from datasets import Dataset

    from lmctl.config.base import TrainConfig
    from lmctl.console import Console
    from lmctl.objectives.base import Objective


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


def prepare(config: TrainConfig, objective: Objective, run_dir: Path, console: Console) -> Prepared:
    data.silence_libraries()
    from transformers import set_seed

    set_seed(config.seed)
    plugins.load_plugins(config.imports, console)
    model_config = modeling.build_model_config(config, console)
    objective.check_architecture(config, model_config)
    raw = data.load_raw(
        config,
        need_eval=config.do_eval,
        text_options=objective.text_options(config),
        check_records=partial(objective.check_records, config),
    )
    tokenizer = modeling.load_tokenizer(
        config,
        objective,
        model_config,
        lambda: objective.training_texts(config, raw["train"], split_source(config, "train")),
        console,
    )
    objective.check_model(config, model_config, tokenizer)
    if not config.do_train:
        raw.pop("train", None)
    processed = objective.preprocess(config, raw, tokenizer, model_config, console)
    model = modeling.build_model(config, objective, model_config, tokenizer, console)
    return Prepared(
        config=config,
        objective=objective,
        run_dir=run_dir,
        model=model,
        tokenizer=tokenizer,
        train_dataset=processed.get("train"),
        eval_dataset=processed.get("validation"),
        collator=objective.collator(config, tokenizer),
        eval_collator=objective.eval_collator(config, tokenizer),
    )
