"""Building or loading the model: its weights (pretrained, from an adapter run, or new from
the architecture), embeddings that fit the tokenizer, and the LoRA adapter of ``--peft``."""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from functools import partial
from typing import TYPE_CHECKING, Any

from lmctl.errors import ConfigError, ModelError
from lmctl.models import adapters
from lmctl.models.config import overridden
from lmctl.models.pretrained import first_line, hub_kwargs, load_pretrained

if TYPE_CHECKING:
    from pathlib import Path

    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

    from lmctl.config.slices import Access, AdapterSpec, ModelSpec
    from lmctl.console import Console
    from lmctl.models.config import ModelObjective


def build_model(
    objective: ModelObjective,
    model_config: PretrainedConfig,
    tokenizer: PreTrainedTokenizerBase,
    console: Console,
    *,
    model_spec: ModelSpec,
    access: Access,
    adapter: AdapterSpec,
    training: bool,
    resumed_from: Path | None = None,
    random_head_ok: bool = True,
) -> PreTrainedModel:
    """The model to train (``training``) or evaluate.

    Weights that ``--model-name-or-path`` lacks (typically the objective's head) are learnt by
    a training run and restored from the checkpoint by a resumed one; an evaluation refuses
    them (its metrics would describe random weights) unless ``random_head_ok``.
    """
    auto_class = objective.auto_model_class()
    missing: list[str] = []
    source = model_spec.model_name_or_path
    if source is not None:
        kwargs = hub_kwargs(access, model_spec.model_revision)
        if model_spec.dtype is not None:
            kwargs["dtype"] = _torch_dtype(model_spec.dtype)
        if adapters.is_adapter_dir(source):
            # A run trained with an adapter: its base model with the adapter on it.
            return load_pretrained(
                partial(adapters.load_adapted, auto_class), source, "--model-name-or-path", **kwargs
            )
        with library_warnings(console):
            model, loading_info = load_pretrained(
                auto_class.from_pretrained,
                source,
                "--model-name-or-path",
                config=model_config,
                output_loading_info=True,
                **kwargs,
            )
        missing = list(loading_info.get("missing_keys") or [])
        _note_new_weights(
            source,
            objective,
            missing,
            console,
            training=training,
            resumed_from=resumed_from,
            random_head_ok=random_head_ok,
        )
    else:
        _fit_vocabulary(model_spec, model_config, tokenizer)
        try:
            with library_warnings(console):
                model = auto_class.from_config(
                    model_config, trust_remote_code=access.trust_remote_code
                )
        except ValueError as exc:
            raise ConfigError(
                f"--model-type {model_config.model_type}: cannot build a {objective.name} model "
                f"from it ({first_line(exc)})",
                f"choose an architecture that supports {objective.summary.lower()}",
            ) from exc
        params = sum(p.numel() for p in model.parameters())
        kind = model_config.model_type
        if resumed_from is not None:
            console.info(
                f"{kind} model, {_count(params)} parameters, weights restored from "
                f"{resumed_from.name}"
            )
        else:
            console.info(f"training a new {kind} model from scratch: {_count(params)} parameters")
    embeddings = model.get_input_embeddings()
    if embeddings is not None and len(tokenizer) > embeddings.weight.shape[0]:
        console.info(
            f"resizing token embeddings from {embeddings.weight.shape[0]} to {len(tokenizer)} "
            "to fit the tokenizer"
        )
        model.resize_token_embeddings(len(tokenizer))
    if model_spec.gradient_checkpointing and adapter.peft is not None:
        # Frozen embeddings give checkpointed layers inputs without gradients.
        model.enable_input_require_grads()
    if adapter.peft == "lora":
        assert source is not None
        model = adapters.apply_lora(
            adapter, source, model, missing, console, objective=objective.name
        )
    return model


def _note_new_weights(
    source: str,
    objective: ModelObjective,
    missing: Any,
    console: Console,
    *,
    training: bool,
    resumed_from: Path | None,
    random_head_ok: bool,
) -> None:
    """One line on the weights that the model lacks (typically the objective's head): what
    fills them in, or why an evaluation refuses to run without them."""
    names = sorted(missing)
    if not names:
        return
    shown = ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")
    if resumed_from is not None:
        console.info(
            f"weights not in {source} ({shown}) are restored from {resumed_from.name}, "
            "with the rest of the model"
        )
    elif training:
        console.info(f"newly initialised (not in the checkpoint, learnt by this run): {shown}")
    elif not random_head_ok:
        raise ModelError(
            f"{source} has no {objective.name} head: {shown} missing from its weights, so "
            "the metrics would describe randomly initialised weights",
            f"evaluate a model trained for {objective.name} (e.g. an 'lmctl train "
            f"{objective.name}' run), or give --allow-random-head to evaluate it anyway",
        )
    else:
        console.warn(f"evaluating with randomly initialised weights (not in {source}): {shown}")


#: Library messages about loading weights that lmctl reports in its own words.
_REPORTED_BY_LMCTL = ("LOAD REPORT", "tied weights", "newly initialized", "not initialized")


@contextlib.contextmanager
def library_warnings(console: Console) -> Iterator[None]:
    """Show the warnings transformers logs while a model is built (e.g. that a class needs
    ``is_decoder=True``) as lmctl warnings, instead of the silence set for the rest."""
    from transformers.utils import logging as hf_logging

    class Forward(logging.Handler):
        def emit(self, record: logging.LogRecord) -> None:
            text = record.getMessage().strip()
            if text and not any(marker in text for marker in _REPORTED_BY_LMCTL):
                console.warn(f"transformers: {text}")

    logger = hf_logging.get_logger()
    handler = Forward(logging.WARNING)
    previous = hf_logging.get_verbosity()
    hf_logging.set_verbosity_warning()
    hf_logging.disable_default_handler()
    logger.addHandler(handler)
    try:
        yield
    finally:
        logger.removeHandler(handler)
        hf_logging.enable_default_handler()
        hf_logging.set_verbosity(previous)


def _fit_vocabulary(
    model_spec: ModelSpec, model_config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase
) -> None:
    """A model built from scratch takes its vocabulary size and special token ids from the
    tokenizer (unless --config-overrides sets vocab_size), so no embedding row goes unused."""
    if "vocab_size" not in overridden(model_spec):
        model_config.vocab_size = len(tokenizer)
    for name in ("bos_token_id", "eos_token_id", "pad_token_id"):
        token_id = getattr(tokenizer, name, None)
        if token_id is not None and hasattr(model_config, name):
            setattr(model_config, name, token_id)


def _torch_dtype(name: str) -> Any:
    if name == "auto":
        return "auto"
    import torch

    return getattr(torch, name)


def _count(params: int) -> str:
    for unit, size in (("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if params >= size:
            return f"{params / size:.2f}{unit}"
    return str(params)
