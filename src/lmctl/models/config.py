"""The model's architecture: its transformers config (pretrained, named, or built from scratch
with ``--config-overrides``), and whether an objective's Auto class has a model for it.

Three ways to get a model, as upstream: a pretrained model (``--model-name-or-path``), a
named config (``--config-name``), or an architecture from scratch (``--model-type`` with
``--config-overrides``).
"""

from __future__ import annotations

import difflib
from typing import TYPE_CHECKING, Any, Protocol

from lmctl.errors import ConfigError
from lmctl.models.pretrained import first_line, hub_kwargs, load_pretrained

if TYPE_CHECKING:
    from transformers import PretrainedConfig

    from lmctl.config.slices import Access, ModelSpec
    from lmctl.console import Console


class ModelObjective(Protocol):
    """What building a model needs to know of an objective (``lmctl.objectives.base.Objective``
    satisfies it; this layer does not import the objectives)."""

    @property
    def name(self) -> str: ...
    @property
    def summary(self) -> str: ...
    @property
    def example_models(self) -> str: ...
    @property
    def tokenizer_algorithm(self) -> str: ...
    def auto_model_class(self) -> Any: ...


def build_model_config(model_spec: ModelSpec, access: Access, console: Console) -> PretrainedConfig:
    from transformers import CONFIG_MAPPING, AutoConfig

    kwargs = hub_kwargs(access, model_spec.model_revision)
    named = (
        (model_spec.config_name, "--config-name"),
        (model_spec.model_name_or_path, "--model-name-or-path"),
    )
    for name, flag in named:
        if name is not None:
            return load_pretrained(AutoConfig.from_pretrained, name, flag, **kwargs)
    model_type = model_spec.model_type
    assert model_type is not None
    if model_type not in CONFIG_MAPPING:
        close = difflib.get_close_matches(model_type, list(CONFIG_MAPPING.keys()), n=3)
        suggestion = (
            f"did you mean {', '.join(close)}?" if close else "see transformers' model list"
        )
        raise ConfigError(f"--model-type {model_type}: unknown architecture", suggestion)
    config_class = CONFIG_MAPPING[model_type]
    model_config = config_class()
    if model_spec.config_overrides:
        console.info(f"config overrides: {model_spec.config_overrides}")
        try:
            # Parses and type-checks each value against the default config ...
            model_config.update_from_string(model_spec.config_overrides)
            # ... then builds the config again from them, so that attributes derived in
            # __init__ (XLNet's d_head from d_model and n_head) follow the overrides.
            keys = overridden(model_spec)
            model_config = config_class(**{key: getattr(model_config, key) for key in keys})
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"--config-overrides: {first_line(exc)}",
                f"use attributes of the {model_type} config (e.g. those in its config.json)",
            ) from exc
    return model_config


def overridden(model_spec: ModelSpec) -> list[str]:
    """The attributes of the model config that ``--config-overrides`` sets."""
    text = model_spec.config_overrides
    return [item.split("=", 1)[0].strip() for item in text.split(",")] if text else []


def model_source(model_spec: ModelSpec) -> str:
    """The flag and value that chose the model, for messages."""
    if model_spec.model_name_or_path is not None:
        return f"--model-name-or-path {model_spec.model_name_or_path}"
    if model_spec.config_name is not None:
        return f"--config-name {model_spec.config_name}"
    return f"--model-type {model_spec.model_type}"


def check_auto_class(
    model_spec: ModelSpec,
    access: Access,
    objective: ModelObjective,
    model_config: PretrainedConfig,
) -> None:
    """Fail before any data work when the objective's Auto class has no model for this
    architecture (e.g. ``train mlm --model-type gpt2``)."""
    auto_class = objective.auto_model_class()
    mapping = getattr(auto_class, "_model_mapping", None)
    if mapping is None or type(model_config) in mapping:
        return
    auto_map = getattr(model_config, "auto_map", None) or {}
    if access.trust_remote_code and auto_class.__name__ in auto_map:
        return
    examples = f", e.g. {objective.example_models}" if objective.example_models else ""
    raise ConfigError(
        f"{model_source(model_spec)}: {model_config.model_type} has no {auto_class.__name__} "
        f"model, so it can't be trained for {objective.summary.lower()}",
        f"choose an architecture that has one{examples}",
    )


def model_class_names(model_class: Any) -> set[str]:
    """Names of the model classes an Auto class (or a concrete model class) builds."""
    mapping = getattr(model_class, "_model_mapping", None)
    names: set[str] = set()
    if mapping is None:
        names.add(model_class.__name__)
        return names
    for value in getattr(mapping, "_model_mapping", {}).values():
        names.update([value] if isinstance(value, str) else value)
    for value in getattr(mapping, "_extra_content", {}).values():
        names.add(getattr(value, "__name__", str(value)))
    return names


#: The length an objective uses when neither its flag nor the tokenizer sets one (upstream's).
DEFAULT_LENGTH_CAP = 1024


def max_positions(model_config: PretrainedConfig) -> int | None:
    for name in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(model_config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None
