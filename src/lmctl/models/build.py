"""Building or loading the model and its tokenizer.

Three ways to get a model, as upstream: a pretrained model (``--model-name-or-path``), a
named config (``--config-name``), or an architecture from scratch (``--model-type`` with
``--config-overrides``). Beyond upstream, a from-scratch run can train its own tokenizer on
the training data (``--train-tokenizer VOCAB_SIZE``).
"""

from __future__ import annotations

import contextlib
import difflib
import logging
from collections.abc import Callable, Iterator
from functools import partial
from pathlib import Path
from typing import TYPE_CHECKING, Any, Protocol, TypeVar

from lmctl import distributed
from lmctl.errors import ConfigError, ModelError
from lmctl.models import adapters
from lmctl.storage import hub, locations
from lmctl.storage.paths import is_remote, local_path

if TYPE_CHECKING:
    from transformers import PretrainedConfig, PreTrainedModel, PreTrainedTokenizerBase

    from lmctl.config.base import TrainConfig
    from lmctl.console import Console

T = TypeVar("T")


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


SPECIAL_TOKENS = {
    "bpe": {
        "bos_token": "<|endoftext|>",
        "eos_token": "<|endoftext|>",
        "unk_token": "<|endoftext|>",
    },
    "wordpiece": {
        "unk_token": "[UNK]",
        "sep_token": "[SEP]",
        "pad_token": "[PAD]",
        "cls_token": "[CLS]",
        "mask_token": "[MASK]",
    },
    "unigram": {
        "bos_token": "<s>",
        "eos_token": "</s>",
        "unk_token": "<unk>",
        "sep_token": "<sep>",
        "pad_token": "<pad>",
        "cls_token": "<cls>",
        "mask_token": "<mask>",
    },
}


def looks_like_path(name: str) -> bool:
    return name.startswith((".", "/", "~")) or name.count("/") > 1 or "\\" in name


def load_pretrained(loader: Callable[..., T], name: str, flag: str, **kwargs: Any) -> T:
    """Load from a storage URL, a local directory, the Hub cache, or the Hub, in that order."""
    if name.startswith(f"{locations.HUB_PROTOCOL}://"):
        name = name.removeprefix(f"{locations.HUB_PROTOCOL}://")
    path = locations.localize(name, f"{flag} {name}") if is_remote(name) else local_path(name)
    if path.exists():
        if not path.is_dir():
            raise ConfigError(f"{flag} {name}: not a directory", "give a model directory")
        from safetensors import SafetensorError

        try:
            return loader(str(path), **kwargs)
        except (OSError, ValueError, KeyError, SafetensorError) as exc:
            raise ModelError(
                f"{flag} {name}: cannot load it ({_first_line(exc)})",
                "give a directory written by save_pretrained (config.json, weights, tokenizer)",
            ) from exc
    if looks_like_path(name):
        raise ConfigError(f"{flag} {name}: no such directory", "check the path")
    try:
        return loader(name, local_files_only=True, **kwargs)
    except (OSError, ValueError):
        pass
    hub.require_hub(f"{flag} {name}")
    try:
        return loader(name, **kwargs)
    except Exception as exc:
        # The Hub's answer first: huggingface_hub wraps some refusals in the error it raises
        # for a file that is neither reachable nor cached.
        refused = hub.refusal(exc, f"{flag} {name}")
        if refused is not None:
            raise refused from exc
        if hub.is_connection_error(exc):
            raise hub.unreachable(f"{flag} {name}") from exc
        raise ModelError(
            f"{flag} {name}: cannot load it from the Hub ({_first_line(exc)})",
            "check the repository id and --model-revision",
        ) from exc


def _first_line(exc: BaseException) -> str:
    text = str(exc).strip().splitlines()
    return text[0][:200] if text else type(exc).__name__


def _hub_kwargs(config: TrainConfig) -> dict[str, Any]:
    return {
        "cache_dir": config.cache_dir,
        "revision": config.model_revision,
        "token": config.token_value(),
        "trust_remote_code": config.trust_remote_code,
    }


def build_model_config(config: TrainConfig, console: Console) -> PretrainedConfig:
    from transformers import CONFIG_MAPPING, AutoConfig

    kwargs = _hub_kwargs(config)
    if config.config_name is not None:
        return load_pretrained(
            AutoConfig.from_pretrained, config.config_name, "--config-name", **kwargs
        )
    if config.model_name_or_path is not None:
        return load_pretrained(
            AutoConfig.from_pretrained, config.model_name_or_path, "--model-name-or-path", **kwargs
        )
    model_type = config.model_type
    assert model_type is not None
    if model_type not in CONFIG_MAPPING:
        close = difflib.get_close_matches(model_type, list(CONFIG_MAPPING.keys()), n=3)
        suggestion = (
            f"did you mean {', '.join(close)}?" if close else "see transformers' model list"
        )
        raise ConfigError(f"--model-type {model_type}: unknown architecture", suggestion)
    config_class = CONFIG_MAPPING[model_type]
    model_config = config_class()
    if config.config_overrides:
        console.info(f"config overrides: {config.config_overrides}")
        try:
            # Parses and type-checks each value against the default config ...
            model_config.update_from_string(config.config_overrides)
            # ... then builds the config again from them, so that attributes derived in
            # __init__ (XLNet's d_head from d_model and n_head) follow the overrides.
            keys = [item.split("=", 1)[0].strip() for item in config.config_overrides.split(",")]
            model_config = config_class(**{key: getattr(model_config, key) for key in keys})
        except (ValueError, TypeError) as exc:
            raise ConfigError(
                f"--config-overrides: {_first_line(exc)}",
                f"use attributes of the {model_type} config (e.g. those in its config.json)",
            ) from exc
    return model_config


def model_source(config: TrainConfig) -> str:
    """The flag and value that chose the model, for messages."""
    if config.model_name_or_path is not None:
        return f"--model-name-or-path {config.model_name_or_path}"
    if config.config_name is not None:
        return f"--config-name {config.config_name}"
    return f"--model-type {config.model_type}"


def tokenizer_source(config: TrainConfig) -> str:
    """The flag and value that chose the tokenizer, for messages."""
    if config.train_tokenizer is not None:
        return f"--train-tokenizer {config.train_tokenizer}"
    if config.tokenizer_name is not None:
        return f"--tokenizer-name {config.tokenizer_name}"
    return f"--model-name-or-path {config.model_name_or_path}"


def check_auto_class(
    config: TrainConfig, objective: ModelObjective, model_config: PretrainedConfig
) -> None:
    """Fail before any data work when the objective's Auto class has no model for this
    architecture (e.g. ``train mlm --model-type gpt2``)."""
    auto_class = objective.auto_model_class()
    mapping = getattr(auto_class, "_model_mapping", None)
    if mapping is None or type(model_config) in mapping:
        return
    auto_map = getattr(model_config, "auto_map", None) or {}
    if config.trust_remote_code and auto_class.__name__ in auto_map:
        return
    examples = f", e.g. {objective.example_models}" if objective.example_models else ""
    raise ConfigError(
        f"{model_source(config)}: {model_config.model_type} has no {auto_class.__name__} "
        f"model, so it can't be trained for {objective.summary.lower()}",
        f"choose an architecture that has one{examples}",
    )


def max_positions(model_config: PretrainedConfig) -> int | None:
    for name in ("max_position_embeddings", "n_positions", "max_seq_len", "seq_length"):
        value = getattr(model_config, name, None)
        if isinstance(value, int) and value > 0:
            return value
    return None


def load_tokenizer(
    config: TrainConfig,
    objective: ModelObjective,
    model_config: PretrainedConfig,
    training_texts: Callable[[], Iterator[list[str]]],
    console: Console,
    *,
    resume_from: Path | None = None,
    cache_dir: Path | None = None,
) -> PreTrainedTokenizerBase:
    """The run's tokenizer; with ``--train-tokenizer``, the one trained for this run when
    ``resume_from`` (the checkpoint the run resumes from) holds it, else one trained on the
    same texts before when ``cache_dir`` keeps it (see :func:`train_tokenizer`)."""
    from transformers import AutoTokenizer

    if config.train_tokenizer is not None:
        resumed = resume_from
        if resumed is not None and (resumed / "tokenizer_config.json").is_file():
            console.info(f"resuming: using the tokenizer trained for this run ({resumed})")
            return load_pretrained(
                AutoTokenizer.from_pretrained,
                str(resumed),
                "--resume-from-checkpoint",
                use_fast=config.use_fast_tokenizer,
            )
        return train_tokenizer(
            training_texts,
            vocab_size=config.train_tokenizer,
            algorithm=objective.tokenizer_algorithm,
            model_max_length=max_positions(model_config) or 1024,
            console=console,
            cache_dir=cache_dir,
            reuse=not config.overwrite_cache,
        )
    name = config.tokenizer_name or config.model_name_or_path
    assert name is not None
    flag = "--tokenizer-name" if config.tokenizer_name else "--model-name-or-path"
    return load_pretrained(
        AutoTokenizer.from_pretrained,
        name,
        flag,
        use_fast=config.use_fast_tokenizer,
        **_hub_kwargs(config),
    )


def leave_out_segment_ids(tokenizer: PreTrainedTokenizerBase, console: Console) -> None:
    """Make ``tokenizer`` (and the copy a run saves) return no ``token_type_ids``, for a model
    trained without them: ``model(**tokenizer(text))`` then gives the model what it learnt
    from (GPT-2 accepts segment ids and looks them up in its token embedding)."""
    names = [name for name in tokenizer.model_input_names if name != "token_type_ids"]
    if names == list(tokenizer.model_input_names):
        return
    tokenizer.model_input_names = names
    tokenizer.init_kwargs["model_input_names"] = names
    console.info(
        "the tokenizer returns token_type_ids, which this objective does not give the model: "
        "the run's tokenizer leaves them out"
    )


def train_tokenizer(
    training_texts: Callable[[], Iterator[list[str]]],
    *,
    vocab_size: int,
    algorithm: str,
    model_max_length: int,
    console: Console,
    cache_dir: Path | None = None,
    reuse: bool = True,
) -> PreTrainedTokenizerBase:
    """Train a tokenizer on the training data with the ``tokenizers`` library.

    Its WordPiece and Unigram trainers break ties between equally frequent candidates in
    hash order, so two trainings on the same text give slightly different vocabularies. So
    in a launch of several processes the main process trains the tokenizer and the others
    receive it (each training its own would map the same text to other ids on each process);
    and with ``cache_dir``, a tokenizer is kept there under a hash of the texts it learnt
    from, and reused by the next run on the same texts (the same command trains the same
    model again, and data ``lmctl prepare`` tokenized with it stays valid); ``reuse=False``
    trains a new one in its place."""
    from tokenizers import Tokenizer
    from transformers import PreTrainedTokenizerFast

    if distributed.world_size() > 1 and algorithm != "bpe" and not distributed.launcher_store():
        raise ConfigError(
            f"--train-tokenizer: this launch of {distributed.world_size()} processes has no "
            f"torchrun store to share one tokenizer through, and two {algorithm} trainings "
            "on the same text differ",
            "launch with torchrun, accelerate launch or --nproc; or give --tokenizer-name DIR "
            "with a tokenizer trained beforehand: a one-process run saves its tokenizer in its "
            "output directory",
        )
    trained = distributed.from_main_process(
        "tokenizer",
        partial(
            _kept_or_trained,
            training_texts,
            vocab_size,
            algorithm,
            cache_dir=cache_dir,
            reuse=reuse,
            console=console,
        ),
    )
    tokenizer = Tokenizer.from_str(trained)
    specials = SPECIAL_TOKENS[algorithm]
    extra: dict[str, Any] = {}
    if algorithm == "wordpiece":
        # BERT-style models take segment ids for sentence pairs (multiple choice).
        extra["model_input_names"] = ["input_ids", "token_type_ids", "attention_mask"]
    return PreTrainedTokenizerFast(
        tokenizer_object=tokenizer, model_max_length=model_max_length, **specials, **extra
    )


def _kept_or_trained(
    training_texts: Callable[[], Iterator[list[str]]],
    vocab_size: int,
    algorithm: str,
    *,
    cache_dir: Path | None,
    reuse: bool,
    console: Console,
) -> str:
    """The JSON of the tokenizer ``cache_dir`` keeps for these texts and settings (when
    ``reuse``), else of one trained now and kept there."""
    import hashlib

    import tokenizers

    from lmctl import __version__
    from lmctl.storage.atomic import atomic_write

    kept = None
    if cache_dir is not None:
        digest = hashlib.sha256(f"{__version__} {tokenizers.__version__}".encode())
        for batch in training_texts():
            for piece in batch:
                digest.update(piece.encode())
                digest.update(b"\0")
        name = f"{algorithm}-{vocab_size}-{digest.hexdigest()[:24]}.json"
        kept = cache_dir / "tokenizers" / name
        found = _kept_tokenizer(kept, console) if reuse else None
        if found is not None:
            console.info(f"using the {algorithm} tokenizer trained on these texts before: {kept}")
            return found
    tokenizer = _trained_tokenizer(training_texts, vocab_size, algorithm)
    trained = str(tokenizer.to_str())
    console.info(
        f"trained a {algorithm} tokenizer on the training data: "
        f"{tokenizer.get_vocab_size()} tokens (asked for {vocab_size})"
        + (f"; kept in {kept}" if kept is not None else "")
    )
    if kept is not None:
        try:
            kept.parent.mkdir(parents=True, exist_ok=True)
            atomic_write(kept, trained)
        except OSError as exc:
            console.warn(f"could not keep the tokenizer in {kept} ({exc.strerror or exc})")
    return trained


def _kept_tokenizer(kept: Path, console: Console) -> str | None:
    """The tokenizer JSON kept in ``kept``; None when there is none or it does not load."""
    from tokenizers import Tokenizer

    if not kept.is_file():
        return None
    text = kept.read_text(encoding="utf-8", errors="replace")
    try:
        Tokenizer.from_str(text)
    except Exception:  # tokenizers raises a bare Exception for a file it can't read
        console.warn(f"{kept} is not a tokenizer file: training a new one in its place")
        return None
    return text


def _trained_tokenizer(
    training_texts: Callable[[], Iterator[list[str]]], vocab_size: int, algorithm: str
) -> Any:
    """A ``tokenizers`` tokenizer trained on the texts."""
    from tokenizers import Tokenizer, decoders, models, normalizers, pre_tokenizers, processors
    from tokenizers import trainers as tk_trainers

    specials = SPECIAL_TOKENS[algorithm]
    special_list = list(dict.fromkeys(specials.values()))
    tokenizer: Any
    if algorithm == "bpe":
        tokenizer = Tokenizer(models.BPE())
        tokenizer.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
        tokenizer.decoder = decoders.ByteLevel()
        trainer: Any = tk_trainers.BpeTrainer(
            vocab_size=vocab_size,
            special_tokens=special_list,
            initial_alphabet=pre_tokenizers.ByteLevel.alphabet(),
            show_progress=False,
        )
    elif algorithm == "wordpiece":
        tokenizer = Tokenizer(models.WordPiece(unk_token=specials["unk_token"]))
        tokenizer.normalizer = normalizers.BertNormalizer(lowercase=True)
        tokenizer.pre_tokenizer = pre_tokenizers.BertPreTokenizer()
        tokenizer.decoder = decoders.WordPiece()
        trainer = tk_trainers.WordPieceTrainer(
            vocab_size=vocab_size, special_tokens=special_list, show_progress=False
        )
    else:
        tokenizer = Tokenizer(models.Unigram())
        tokenizer.pre_tokenizer = pre_tokenizers.Metaspace()
        tokenizer.decoder = decoders.Metaspace()
        trainer = tk_trainers.UnigramTrainer(
            vocab_size=vocab_size,
            special_tokens=special_list,
            unk_token=specials["unk_token"],
            show_progress=False,
        )
    tokenizer.train_from_iterator(training_texts(), trainer=trainer)
    if algorithm == "wordpiece":
        cls_id = tokenizer.token_to_id(specials["cls_token"])
        sep_id = tokenizer.token_to_id(specials["sep_token"])
        tokenizer.post_processor = processors.TemplateProcessing(
            single="[CLS] $A [SEP]",
            pair="[CLS] $A [SEP] $B:1 [SEP]:1",
            special_tokens=[("[CLS]", cls_id), ("[SEP]", sep_id)],
        )
    return tokenizer


def build_model(
    config: TrainConfig,
    objective: ModelObjective,
    model_config: PretrainedConfig,
    tokenizer: PreTrainedTokenizerBase,
    console: Console,
    *,
    resumed_from: Path | None = None,
    random_head_ok: bool = True,
) -> PreTrainedModel:
    """The model to train or evaluate.

    Weights that ``--model-name-or-path`` lacks (typically the objective's head) are learnt by
    a training run and restored from the checkpoint by a resumed one; an evaluation refuses
    them (its metrics would describe random weights) unless ``random_head_ok``.
    """
    auto_class = objective.auto_model_class()
    missing: list[str] = []
    if config.model_name_or_path is not None and adapters.is_adapter_dir(config.model_name_or_path):
        # A run trained with an adapter: its base model with the adapter on it.
        kwargs = _hub_kwargs(config)
        if config.dtype is not None:
            kwargs["dtype"] = _torch_dtype(config.dtype)
        return load_pretrained(
            partial(adapters.load_adapted, auto_class),
            config.model_name_or_path,
            "--model-name-or-path",
            **kwargs,
        )
    if config.model_name_or_path is not None:
        kwargs = _hub_kwargs(config)
        if config.dtype is not None:
            kwargs["dtype"] = _torch_dtype(config.dtype)
        with library_warnings(console):
            model, loading_info = load_pretrained(
                auto_class.from_pretrained,
                config.model_name_or_path,
                "--model-name-or-path",
                config=model_config,
                output_loading_info=True,
                **kwargs,
            )
        missing = list(loading_info.get("missing_keys") or [])
        _note_new_weights(
            config,
            objective,
            missing,
            console,
            resumed_from=resumed_from,
            random_head_ok=random_head_ok,
        )
    else:
        _fit_vocabulary(config, model_config, tokenizer)
        try:
            with library_warnings(console):
                model = auto_class.from_config(
                    model_config, trust_remote_code=config.trust_remote_code
                )
        except ValueError as exc:
            raise ConfigError(
                f"--model-type {model_config.model_type}: cannot build a {objective.name} model "
                f"from it ({_first_line(exc)})",
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
    if config.gradient_checkpointing and config.peft is not None:
        # Frozen embeddings give checkpointed layers inputs without gradients.
        model.enable_input_require_grads()
    if config.peft == "lora":
        model = adapters.apply_lora(config, model, missing, console)
    return model


def _note_new_weights(
    config: TrainConfig,
    objective: ModelObjective,
    missing: Any,
    console: Console,
    *,
    resumed_from: Path | None,
    random_head_ok: bool,
) -> None:
    """One line on the weights that the model lacks (typically the objective's head): what
    fills them in, or why an evaluation refuses to run without them."""
    names = sorted(missing)
    if not names:
        return
    source = config.model_name_or_path
    shown = ", ".join(names[:4]) + (f", ... ({len(names)} in all)" if len(names) > 4 else "")
    if resumed_from is not None:
        console.info(
            f"weights not in {source} ({shown}) are restored from {resumed_from.name}, "
            "with the rest of the model"
        )
    elif config.do_train:
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
    config: TrainConfig, model_config: PretrainedConfig, tokenizer: PreTrainedTokenizerBase
) -> None:
    """A model built from scratch takes its vocabulary size and special token ids from the
    tokenizer (unless --config-overrides sets vocab_size), so no embedding row goes unused."""
    overridden = {
        item.split("=", 1)[0].strip() for item in (config.config_overrides or "").split(",")
    }
    if "vocab_size" not in overridden:
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
