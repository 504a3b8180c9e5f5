"""The model and tokenizer that ``lmctl predict`` runs: loaded from the weights that ``lmctl
eval`` would evaluate, the way evaluation loads them (the run's custom architectures and
adapters included), with the objective's head required."""

from __future__ import annotations

from dataclasses import dataclass
from typing import TYPE_CHECKING, Any

from lmctl.config.base import TrainConfig
from lmctl.config.slices import Access, AdapterSpec, ModelSpec, field_names
from lmctl.data.load import silence_libraries
from lmctl.errors import ModelError
from lmctl.models.build import build_model
from lmctl.models.config import build_model_config, max_positions
from lmctl.models.plugins import load_plugins
from lmctl.models.pretrained import load_pretrained
from lmctl.models.tokenizer import leave_out_segment_ids

if TYPE_CHECKING:
    from lmctl.console import Console
    from lmctl.evaluation.target import Target

#: Settings of a run that decide how its model loads (the rest describe its training).
LOADING_FIELDS = ("imports", "trust_remote_code", "cache_dir", "use_fast_tokenizer")


@dataclass
class Loaded:
    model: Any
    tokenizer: Any
    device: Any
    #: The longest input the model takes (its position embeddings), when it has a limit.
    max_length: int | None


def _slice(kind: type, values: dict[str, Any]) -> Any:
    """The slice ``kind`` with the document's defaults, and ``values`` over them."""
    defaults = {
        name: TrainConfig.model_fields[name].get_default(call_default_factory=True)
        for name in field_names(kind)
    }
    return kind(**{**defaults, **{k: v for k, v in values.items() if k in defaults}})


def load_tokenizer(target: Target, console: Console) -> Any:
    """The tokenizer saved with the weights (light: no model is loaded), after the run's
    ``--import`` modules and ``lmctl.models`` entry points, which may register its class."""
    from transformers import AutoTokenizer

    silence_libraries()
    saved = {key: target.saved[key] for key in LOADING_FIELDS if key in target.saved}
    access = _slice(Access, saved)
    load_plugins(saved.get("imports") or [], console)
    return load_pretrained(
        AutoTokenizer.from_pretrained,
        target.weights,
        "PATH",
        use_fast=saved.get("use_fast_tokenizer", True),
        cache_dir=access.cache_dir,
        trust_remote_code=access.trust_remote_code,
    )


def load_model(target: Target, tokenizer: Any, console: Console) -> Loaded:
    """The model of ``target`` in inference mode, on the GPU when there is one. A model
    without the objective's head is refused (exit 5): its predictions would be noise."""
    import torch

    saved = {key: target.saved[key] for key in LOADING_FIELDS if key in target.saved}
    access: Access = _slice(Access, saved)
    model_spec: ModelSpec = _slice(ModelSpec, {**saved, "model_name_or_path": target.weights})
    adapter: AdapterSpec = _slice(AdapterSpec, {})
    objective = target.objective
    load_plugins(model_spec.imports, console)
    model_config = build_model_config(model_spec, access, console)
    objective.check_architecture(model_spec, access, model_config)
    objective.adapt_model_config(model_config, console)
    if not objective.segment_ids:
        leave_out_segment_ids(tokenizer, console)
    try:
        model: Any = build_model(
            objective,
            model_config,
            tokenizer,
            console,
            model_spec=model_spec,
            access=access,
            adapter=adapter,
            training=False,
            random_head_ok=False,
        )
    except ModelError as exc:
        if exc.hint is None or "--allow-random-head" not in exc.hint:
            raise
        # Evaluation's refusal of a model without the objective's head, in predict's words.
        raise ModelError(
            exc.message.replace("the metrics would describe", "its predictions would come from"),
            f"predict with a model trained for {objective.name} (e.g. an 'lmctl train "
            f"{objective.name}' run), or give the --task its weights were trained for",
        ) from exc
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    model.to(device)
    model.eval()
    return Loaded(model, tokenizer, device, max_positions(model_config))
